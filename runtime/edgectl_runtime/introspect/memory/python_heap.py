"""Python's own allocations: pymalloc's arenas (``sys._debugmallocstats``) and, under
``PYTHONTRACEMALLOC``, live allocations by the package whose code made them."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from edgectl_runtime.introspect.memory.mapped_files import (
    installed_site_dirs,
    package_of,
)


def pymalloc_stats() -> dict[str, int] | None:
    """pymalloc's arenas, from ``sys._debugmallocstats()`` (which writes to the C stderr)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(mode="w+b") as tmp:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(tmp.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
    except (OSError, AttributeError):
        return None
    out: dict[str, int] = {}
    for key, pattern in {
        "arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
        "arena_bytes": r"arenas \* (\d+) bytes/arena",
        "allocated_block_bytes": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
        "available_block_bytes": r"# bytes in available blocks\s*=\s*([\d,]+)",
        "unused_pools": r"(\d+) unused pools",
        "total_bytes": r"^Total\s*=\s*([\d,]+)",
    }.items():
        m = re.search(pattern, text, re.M)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out if "total_bytes" in out else None


def python_heap_by_package(site_dirs: list[str] | None = None, top: int = 20) -> dict[str, Any] | None:
    """Live Python allocations grouped by the package whose code made them — only when the worker
    runs under ``PYTHONTRACEMALLOC`` (tracing from the interpreter's start, at a cost in memory
    and speed). Code objects and module dicts built while a module is imported are allocated by
    the import machinery: they form their own group ("import machinery")."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return None
    site_dirs = site_dirs if site_dirs is not None else installed_site_dirs()
    snap = tracemalloc.take_snapshot()
    groups: dict[str, int] = {}
    for stat in snap.statistics("filename"):
        fname = stat.traceback[0].filename
        if fname.startswith("<frozen importlib") or "/importlib/" in fname:
            key = "import machinery (code objects, module namespaces)"
        elif fname.startswith("<"):
            key = fname
        else:
            key = package_of(fname, site_dirs)
        groups[key] = groups.get(key, 0) + stat.size
    traced, peak = tracemalloc.get_traced_memory()
    return {"traced_bytes": traced, "tracemalloc_overhead_bytes": tracemalloc.get_tracemalloc_memory(),
            "frames": tracemalloc.get_traceback_limit(),
            "by_package": dict(sorted(groups.items(), key=lambda kv: -kv[1])[:top])}
