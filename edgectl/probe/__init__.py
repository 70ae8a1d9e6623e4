"""``edgectl probe``: what this box really has.

One public call, :func:`probe`, over private readers (cpu, topology, memory, software,
bandwidth), each reading through one :class:`~edgectl.probe.hostfs.HostFS` that holds the root,
so a captured tree is probed exactly like ``/``. Nothing here probes at import time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from edgectl.errors import EdgectlError
from edgectl.probe.facts import (
    SCHEMA,
    AmxPermission,
    CpuFacts,
    DeviceClass,
    HostFacts,
    Isa,
    IsaDisagreement,
    MemoryFacts,
    NumaNode,
    SoftwareFacts,
    TopologyFacts,
    UnknownFact,
)
from edgectl.probe.hostfs import HostFS, ReadFailed, Unknowns

__all__ = [
    "SCHEMA", "AmxPermission", "CpuFacts", "DeviceClass", "HostFacts", "Isa", "IsaDisagreement",
    "MemoryFacts", "NumaNode", "SoftwareFacts", "TopologyFacts", "UnknownFact", "probe",
]


def probe(root: str | Path = "/", *, bandwidth: bool = False,
          environ: Mapping[str, str] | None = None) -> HostFacts:
    """Probe the host whose ``/proc`` and ``/sys`` are under ``root``.

    ``bandwidth`` runs the ≤ 2 s copy measurement (live host only). ``environ`` is the mapping
    environment variables are read from (default ``os.environ``; never modified).
    Raises :class:`EdgectlError` (exit 2) when ``root`` is missing or nothing useful can be read.
    """
    return _probe(HostFS(_check_root(root)), bandwidth=bandwidth, environ=environ)


def _check_root(root: str | Path) -> Path:
    path = Path(root)
    if not path.exists():
        raise EdgectlError(f"--root {root}: no such directory; give the top of a captured tree "
                           "(one with proc/ and sys/ in it) or / for this machine")
    if not path.is_dir():
        raise EdgectlError(f"--root {root}: not a directory; give the top of a captured tree "
                           "(one with proc/ and sys/ in it)")
    return path.absolute()


def _probe(fs: HostFS, *, bandwidth: bool, environ: Mapping[str, str] | None) -> HostFacts:
    # imported here so `import edgectl.probe` stays cheap for modules that only need the facts
    from edgectl.probe.cpu import device_class, probe_cpu
    from edgectl.probe.memory import probe_memory
    from edgectl.probe.software import probe_software
    from edgectl.probe.topology import probe_topology

    if bandwidth and not fs.is_live:
        raise EdgectlError("--bandwidth measures this machine's memory: it cannot be combined with "
                           "--root; drop one of them")
    environ = os.environ if environ is None else environ
    unknown = Unknowns()
    notes: list[str] = []

    cpu, info = probe_cpu(fs, unknown, notes)
    memory, meminfo_ok = probe_memory(fs, unknown, notes)
    if info is None and not meminfo_ok:
        reasons = "; ".join(r for f, r in unknown.entries if f in ("cpu.arch", "memory.total_bytes"))
        raise EdgectlError(f"nothing to probe under {fs.root}: {reasons}; "
                           "point --root at a tree captured with `edgectl probe --capture DIR`")
    topology = probe_topology(fs, info, unknown, notes, memory.total_bytes)
    software = probe_software(fs, environ, unknown)

    dclass = device_class(cpu, live=fs.is_live)
    if info is None or not cpu.flags:
        unknown.add("device_class", "the CPU flags are unknown: generic assumed")

    bandwidth_gbps = None
    if bandwidth:
        bandwidth_gbps = _bandwidth(fs, topology, memory, unknown, notes)

    return HostFacts(
        root=str(fs.root),
        device_class=dclass,
        cpu=cpu,
        topology=topology,
        memory=memory,
        bandwidth_gbps=bandwidth_gbps,
        software=software,
        unknown=tuple(UnknownFact(f, r) for f, r in unknown.entries),
        notes=tuple(notes),
    )


def _llc_bytes(fs: HostFS, cpu: int) -> int | None:
    """Size of the highest-level cache of ``cpu`` (sysfs cache/indexN/{level,size}, "32K")."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/cache"
    best_level, best_size = -1, None
    for name in fs.listdir(base):
        if not name.startswith("index"):
            continue
        try:
            level = int(fs.read_text(f"{base}/{name}/level"))
            text = fs.read_text(f"{base}/{name}/size").strip()
            scale = {"K": 1024, "M": 1024 * 1024, "G": 1024 ** 3}.get(text[-1:], 1)
            size = int(text.rstrip("KMG")) * scale
        except (ReadFailed, ValueError):
            continue
        if level > best_level:
            best_level, best_size = level, size
    return best_size


def _bandwidth(fs: HostFS, topology: TopologyFacts, memory: MemoryFacts, unknown: Unknowns,
               notes: list[str]) -> float | None:
    from edgectl.probe import bandwidth as bw

    cpus = list(topology.usable_cpus or [])
    if not cpus:
        cpus = sorted(os.sched_getaffinity(0))
    try:
        total = bw.buffer_total_bytes(_llc_bytes(fs, cpus[0]), memory.budget_bytes)
        result = bw.measure(cpus, total)
    except bw.BandwidthUnavailable as exc:
        unknown.add("bandwidth_gbps", exc.reason)
        return None
    except MemoryError:
        unknown.add("bandwidth_gbps", "the copy buffers could not be allocated")
        return None
    notes.append(result.describe())
    return result.gbps
