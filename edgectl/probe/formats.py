"""Parsers for the kernel's text formats, each raising :class:`ValueError` on garbled input.

References (Linux, Documentation/):
- CPU lists ("0-3,8,10-11"): admin-guide/cputopology.rst, admin-guide/cgroup-v2.rst (cpuset.cpus).
- /proc/meminfo and /sys/devices/system/node/nodeN/meminfo: filesystems/proc.rst ("kB" = KiB).
"""

from __future__ import annotations

_MAX_CPU_ID = 1 << 16  # the kernel's NR_CPUS is at most 8192 on x86; anything larger is garbage


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` → (0, 1, 2, 3, 8). An empty string is the empty set (an empty cpuset)."""
    text = text.strip()
    cpus: set[int] = set()
    if not text:
        return ()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            # cgroup-v2 also allows a stride suffix in some kernels ("0-7:2"); handled for safety
            stride = 1
            if ":" in hi_s:
                hi_s, _, stride_s = hi_s.partition(":")
                stride = int(stride_s)
            lo, hi = int(lo_s), int(hi_s)
            if lo > hi or stride < 1:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(lo, hi + 1, stride))
        else:
            cpus.add(int(part))
    if any(c < 0 or c > _MAX_CPU_ID for c in cpus):
        raise ValueError(f"CPU number out of range in {text!r}")
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...] | list[int], sep: str = ",") -> str:
    """(0, 1, 2, 3, 8) → ``"0-3,8"``: the kernel's own notation (``sep=" "``: systemd's)."""
    out: list[str] = []
    items = sorted(set(cpus))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return sep.join(out) if out else "none"


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo (or a NUMA node's meminfo) → {field: bytes}.

    Node files prefix each line with ``Node N ``; that prefix is dropped. Values with a ``kB``
    unit are KiB (filesystems/proc.rst); values without a unit (HugePages_Total) are counts and
    are kept as they are.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        if not sep:
            raise ValueError(f"line without ':' {line!r}")
        key = key.strip()
        if key.startswith("Node "):
            key = key.split(None, 2)[-1]
        fields = rest.split()
        if not fields:
            raise ValueError(f"no value for {key!r}")
        value = int(fields[0])
        if len(fields) > 1:
            if fields[1] != "kB":
                raise ValueError(f"unknown unit {fields[1]!r} for {key!r}")
            value *= 1024
        if value < 0:
            raise ValueError(f"negative value for {key!r}")
        out[key] = value
    return out


def parse_flat_keyed(text: str) -> dict[str, int]:
    """cgroup ``memory.stat`` / ``cpu.stat`` ("key value" per line) → {key: int}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ValueError(f"expected 'key value', got {line!r}")
        out[fields[0]] = int(fields[1])
    return out


def format_bytes(n: int | None) -> str:
    """Binary units for people (GiB = 2**30); JSON keeps exact bytes."""
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
