"""CPUs: how many, how they group into cores, sockets and NUMA nodes, which ones this process may
use, and how much CPU time its cgroup allows.

Sources (Linux, Documentation/): admin-guide/cputopology.rst (cpu/online, cpuN/topology/*),
ABI/stable/sysfs-devices-node (node/nodeN/cpulist, meminfo), filesystems/proc.rst
(Cpus_allowed_list in /proc/PID/status), admin-guide/cgroup-v2.rst (cpu.max,
cpuset.cpus.effective), scheduler/sched-bwc.rst (v1 cpu.cfs_quota_us / cpu.cfs_period_us),
admin-guide/cgroup-v1/cpusets.rst (cpuset.cpus, cpuset.effective_cpus).
"""

from __future__ import annotations

import re

from edgectl.probe import cgroup
from edgectl.probe.cpu import CpuInfo
from edgectl.probe.facts import NumaNode, TopologyFacts
from edgectl.probe.formats import format_bytes, parse_cpu_list, parse_meminfo
from edgectl.probe.hostfs import HostFS, ReadFailed, Unknowns

_CPU_SYS = "/sys/devices/system/cpu"
_NODE_SYS = "/sys/devices/system/node"


def _read_cpu_list(fs: HostFS, path: str) -> tuple[int, ...]:
    text = fs.read_text(path)
    try:
        return parse_cpu_list(text)
    except ValueError as exc:
        raise ReadFailed(f"{fs.describe(path)} is not a CPU list: {exc}") from None


def _read_int(fs: HostFS, path: str) -> int:
    text = fs.read_text(path).strip()
    try:
        return int(text)
    except ValueError:
        raise ReadFailed(f"{fs.describe(path)}: expected an integer, got {text[:40]!r}") from None


def probe_topology(fs: HostFS, info: CpuInfo | None, unknown: Unknowns, notes: list[str],
                   total_memory_bytes: int | None) -> TopologyFacts:
    online = _online(fs, info, unknown, notes)
    cores, sockets = _cores_and_sockets(fs, info, online, unknown)
    usable = _usable(fs, online, unknown, notes)
    quota = _quota(fs, unknown)
    numa = _numa(fs, online, unknown, notes, total_memory_bytes)
    return TopologyFacts(
        logical_cpus=None if online is None else len(online),
        physical_cores=cores,
        sockets=sockets,
        usable_cpus=usable,
        cpu_quota_cores=quota,
        numa_nodes=numa,
    )


def _online(fs: HostFS, info: CpuInfo | None, unknown: Unknowns, notes: list[str]) -> tuple[int, ...] | None:
    try:
        return _read_cpu_list(fs, f"{_CPU_SYS}/online")
    except ReadFailed as exc:
        if info is not None:
            notes.append(f"online CPUs taken from /proc/cpuinfo ({exc.reason})")
            return tuple(sorted(int(p["processor"]) for p in info.processors))
        unknown.add("topology.logical_cpus", f"{exc.reason}, and /proc/cpuinfo is unreadable")
        return None


def _cores_and_sockets(fs: HostFS, info: CpuInfo | None, online: tuple[int, ...] | None,
                       unknown: Unknowns) -> tuple[int | None, int | None]:
    """Cores = distinct sets of hardware-thread siblings; sockets = distinct package ids.

    Sibling sets are used rather than core_id because core_id is only unique within a package
    (and on some platforms within a die), while a core's sibling list is unique machine-wide.
    """
    cores: int | None = None
    sockets: int | None = None
    reason = "no online CPU list"
    if online:
        siblings: set[tuple[int, ...]] = set()
        packages: set[int] = set()
        try:
            for c in online:
                base = f"{_CPU_SYS}/cpu{c}/topology"
                name = "core_cpus_list" if fs.exists(f"{base}/core_cpus_list") else "thread_siblings_list"
                siblings.add(_read_cpu_list(fs, f"{base}/{name}"))
                packages.add(_read_int(fs, f"{base}/physical_package_id"))
            cores, sockets = len(siblings), len(packages)
        except ReadFailed as exc:
            reason = exc.reason
    if (cores is None or sockets is None) and info is not None:
        # /proc/cpuinfo on x86 prints "physical id" and "core id" per logical CPU
        pairs = {(p.get("physical id"), p.get("core id")) for p in info.processors}
        if all(a is not None and b is not None for a, b in pairs):
            cores = cores if cores is not None else len(pairs)
            sockets = sockets if sockets is not None else len({a for a, _ in pairs})
        else:
            reason += "; /proc/cpuinfo has no physical id/core id"
    if cores is None:
        unknown.add("topology.physical_cores", reason)
    if sockets is None:
        unknown.add("topology.sockets", reason)
    return cores, sockets


def _usable(fs: HostFS, online: tuple[int, ...] | None, unknown: Unknowns,
            notes: list[str]) -> tuple[int, ...] | None:
    """Affinity ∩ cgroup cpuset ∩ online: the CPUs a thread of this process can be scheduled on."""
    try:
        status = fs.read_text("/proc/self/status")
        line = next((ln for ln in status.splitlines() if ln.startswith("Cpus_allowed_list:")), None)
        if line is None:
            raise ReadFailed(f"{fs.describe('/proc/self/status')} has no Cpus_allowed_list line")
        try:
            allowed = set(parse_cpu_list(line.split(":", 1)[1]))
        except ValueError as exc:
            raise ReadFailed(f"{fs.describe('/proc/self/status')}: Cpus_allowed_list: {exc}") from None
    except ReadFailed as exc:
        unknown.add("topology.usable_cpus", exc.reason)
        return None
    if online is not None:
        allowed &= set(online)
    try:
        cpuset = _cpuset(fs)
    except ReadFailed as exc:
        notes.append(f"cgroup cpuset not read ({exc.reason}): usable CPUs from the affinity mask alone")
        cpuset = None
    if cpuset is not None:
        allowed &= set(cpuset)
    if not allowed:
        unknown.add("topology.usable_cpus", "affinity, cpuset and online CPUs have nothing in common")
        return None
    return tuple(sorted(allowed))


def _cpuset(fs: HostFS) -> tuple[int, ...] | None:
    place = cgroup.locate(fs, "cpuset")
    if place is None:
        return None
    names = ("cpuset.cpus.effective",) if place.version == 2 else ("cpuset.effective_cpus", "cpuset.cpus")
    # The nearest level that has the file holds the effective set (a v2 child without the
    # cpuset controller enabled uses its parent's).
    for _, directory in place.levels():
        for name in names:
            if fs.exists(f"{directory}/{name}"):
                return _read_cpu_list(fs, f"{directory}/{name}")
    return None


def _quota(fs: HostFS, unknown: Unknowns) -> float | None:
    """The tightest CPU bandwidth limit among this cgroup and its ancestors, in cores."""
    try:
        place = cgroup.locate(fs, "cpu")
    except ReadFailed as exc:
        if fs.exists("/proc/self/cgroup") or fs.exists(cgroup.CGROUP_FS):
            unknown.add("topology.cpu_quota_cores", f"this process's cgroup is unknown: {exc.reason}")
        return None  # otherwise a kernel without cgroups: no quota
    if place is None:
        return None
    best: float | None = None
    try:
        for _, directory in place.levels():
            cores = _quota_at(fs, place.version, directory)
            if cores is not None and (best is None or cores < best):
                best = cores
    except ReadFailed as exc:
        unknown.add("topology.cpu_quota_cores", exc.reason)
        return None
    return best


def _quota_at(fs: HostFS, version: int, directory: str) -> float | None:
    if version == 2:
        path = f"{directory}/cpu.max"
        text = fs.read_optional(path)
        if text is None:
            return None
        fields = text.split()
        if len(fields) not in (1, 2):
            raise ReadFailed(f"{fs.describe(path)}: expected '$MAX $PERIOD', got {text.strip()[:40]!r}")
        if fields[0] == "max":
            return None
        try:
            quota = int(fields[0])
            period = int(fields[1]) if len(fields) == 2 else 100000
        except ValueError:
            raise ReadFailed(f"{fs.describe(path)}: expected '$MAX $PERIOD', got {text.strip()[:40]!r}") from None
    else:
        qpath, ppath = f"{directory}/cpu.cfs_quota_us", f"{directory}/cpu.cfs_period_us"
        if not fs.exists(qpath):
            return None
        quota = _read_int(fs, qpath)
        if quota < 0:  # -1: no limit
            return None
        period = _read_int(fs, ppath)
    if quota <= 0 or period <= 0:
        raise ReadFailed(f"{fs.describe(directory)}: impossible CPU quota {quota}/{period}")
    return round(quota / period, 4)


_NODE_RE = re.compile(r"^node(\d+)$")


def _numa(fs: HostFS, online: tuple[int, ...] | None, unknown: Unknowns, notes: list[str],
          total_memory_bytes: int | None) -> tuple[NumaNode, ...] | None:
    names = [n for n in fs.listdir(_NODE_SYS) if _NODE_RE.match(n)]
    if not names:
        if online is None:
            unknown.add("topology.numa_nodes", f"{fs.describe(_NODE_SYS)} is absent and the CPUs are unknown")
            return None
        # /sys/devices/system/node exists only in kernels built with CONFIG_NUMA; without it the
        # machine is one node by construction.
        notes.append(f"{_NODE_SYS} is absent (kernel without NUMA): one node with all CPUs assumed")
        return (NumaNode(id=0, cpus=online, memory_total_bytes=total_memory_bytes),)
    nodes = []
    try:
        for name in sorted(names, key=lambda n: int(n[4:])):
            base = f"{_NODE_SYS}/{name}"
            cpus = _read_cpu_list(fs, f"{base}/cpulist")
            try:
                mem = parse_meminfo(fs.read_text(f"{base}/meminfo")).get("MemTotal")
            except ValueError as exc:
                raise ReadFailed(f"{fs.describe(base + '/meminfo')} is garbled: {exc}") from None
            if mem is None:
                unknown.add("topology.numa_nodes", f"{fs.describe(base + '/meminfo')} has no MemTotal")
            nodes.append(NumaNode(id=int(name[4:]), cpus=cpus, memory_total_bytes=mem))
    except ReadFailed as exc:
        unknown.add("topology.numa_nodes", exc.reason)
        return None
    node_total = sum(n.memory_total_bytes or 0 for n in nodes)
    if total_memory_bytes and abs(node_total - total_memory_bytes) > total_memory_bytes // 10:
        # seen on a Firecracker guest: node0 reports 9.5 GiB of a 23.5 GiB MemTotal
        notes.append(f"the NUMA nodes' MemTotal adds up to {format_bytes(node_total)} but "
                     f"/proc/meminfo says {format_bytes(total_memory_bytes)}: both are reported as read")
    return tuple(nodes)
