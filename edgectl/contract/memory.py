"""The memory attribution's schema (``edgectl.memory/1``) and its text view.

The worker makes it inside its own process (``GET /edgectl/memory``,
``runtime/edgectl_runtime/introspect/memory/``): every part of its PSS from its own source, summed and
compared with the PSS the kernel reports; what no source explains is its own row. The control
plane prints it (``edgectl status --memory``), as does ``python -m edgectl_runtime.introspect.memory URL``.

Shape: ``{"schema", "pid", "pss_bytes", "anon_bytes", "file_bytes", "file_rss_bytes",
"attributed_bytes", "unattributed_fraction", "rows": [{"group", "part", "bytes", "source", ...}],
"of_which": [{"part", "bytes", "within"}], "details": {...}}``. docs/memory.md explains each part.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "edgectl.memory/1"


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f}"


def render_text(att: dict[str, Any]) -> str:
    """The attribution for a person: one row per part, grouped, the sum against the PSS."""
    lines = [f"PSS {_mib(att['pss_bytes'])} MiB (anonymous {_mib(att['anon_bytes'])}, file-backed "
             f"{_mib(att['file_bytes'])} of {_mib(att.get('file_rss_bytes'))} resident: the rest is charged to other "
             f"processes mapping the same files), pid {att['pid']}, allocator {att['details'].get('allocator')}",
             f"{'part':<62} {'MiB':>8}  source"]
    group = None
    for r in att["rows"]:
        if r["group"] != group:
            group = r["group"]
            lines.append(f"{group}:")
        label = r["part"]
        if "file_bytes" in r and r.get("anon_bytes"):
            label += f" (file {_mib(r['file_bytes'])} + data {_mib(r['anon_bytes'])})"
        lines.append(f"  {label:<60} {_mib(r['bytes']):>8}  {r['source']}")
    heap = (att.get("details") or {}).get("python_heap")
    if heap:
        lines.append(f"Python heap by allocating package (tracemalloc, {_mib(heap['traced_bytes'])} MiB traced, "
                     f"{_mib(heap['tracemalloc_overhead_bytes'])} MiB of tracing overhead):")
        for name, n in heap["by_package"].items():
            lines.append(f"  {name:<60} {_mib(n):>8}")
    for r in att.get("of_which", []):
        lines.append(f"  of which (inside {r['within']}): {r['part']:<36} {_mib(r['bytes']):>8}")
    frac = att.get("unattributed_fraction")
    lines.append(f"attributed {_mib(att['attributed_bytes'])} of {_mib(att['pss_bytes'])} MiB"
                 + (f" ({(1 - frac) * 100:.1f}%)" if frac is not None else ""))
    return "\n".join(lines)
