"""Memory: what the host has, what the cgroup allows, and the budget a deployment may use.

Host figures come from /proc/meminfo (Documentation/filesystems/proc.rst). The cgroup limit is
the tightest among this process's cgroup and its ancestors; its usage excludes the *inactive*
file cache, which the kernel reclaims before it would OOM-kill anything — the "working set"
that the kubelet and ``docker stats`` use (usage − inactive_file). Active file pages are kept in
the usage on purpose: they are what the kernel protects as the workload's hot set, and for an
LLM server that includes memory-mapped weights, so counting them as free would overstate room
(cgroup-v2.rst, memory.stat: "active_file / inactive_file: file-backed memory on the
active/inactive LRU list"; mm/workingset.c explains why active pages are reclaimed last).
Counting page cache as used is what ollama/ollama#15474 complains about; counting all of it as
free is the opposite mistake.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgectl.probe import cgroup
from edgectl.probe.facts import MemoryFacts
from edgectl.probe.formats import format_bytes, parse_flat_keyed, parse_meminfo
from edgectl.probe.hostfs import HostFS, ReadFailed, Unknowns

MIB = 1024 * 1024
GIB = 1024 * MIB

# The reserve kept out of the budget: the kernel, sshd, journald, the page cache that reading
# a model needs, and allocation spikes at load. 512 MiB is the floor a 4-8 GB board needs for
# that; 10 % scales with the box; above 40 GiB of memory the 4 GiB cap stops a big server
# from wasting tens of GiB on it.
RESERVE_FLOOR_BYTES = 512 * MIB
RESERVE_FRACTION = 0.10
RESERVE_CAP_BYTES = 4 * GIB
RESERVE_RULE = "min(4 GiB, max(512 MiB, 10% of the effective limit))"

# cgroup v1 has no "max": an unlimited memory.limit_in_bytes reads PAGE_COUNTER_MAX pages
# rounded to the page size (9223372036854771712 with 4 KiB pages). Anything this large is none.
_V1_UNLIMITED = 1 << 62


def reserve_bytes(effective_limit_bytes: int) -> int:
    """:data:`RESERVE_RULE`; the effective limit is min(MemTotal, cgroup limit)."""
    return min(RESERVE_CAP_BYTES, max(RESERVE_FLOOR_BYTES, int(effective_limit_bytes * RESERVE_FRACTION)))


@dataclass(frozen=True)
class _Level:
    path: str
    limit_bytes: int | None
    limit_reason: str | None  # set when the limit file exists but could not be read
    usage_bytes: int | None  # without inactive file cache
    usage_reason: str | None  # why usage is None


@dataclass(frozen=True)
class _Meminfo:
    """The host's figures from /proc/meminfo (None: unknown, the reason in the probe's unknowns)."""

    total_bytes: int | None
    available_bytes: int | None
    swap_total_bytes: int | None
    readable: bool


@dataclass(frozen=True)
class _CgroupMemory:
    """This process's memory cgroup: the binding level's limit and usage (None: none, or unknown)."""

    version: int | None
    path: str | None
    limit_bytes: int | None
    usage_bytes: int | None
    limit_unread: bool  # a limit may apply but could not be read: no budget is claimed


def probe_memory(fs: HostFS, unknown: Unknowns, notes: list[str]) -> tuple[MemoryFacts, bool]:
    """(facts, meminfo was readable)."""
    host = _read_meminfo(fs, unknown)
    cg = _read_cgroup_memory(fs, unknown, notes)
    reserve, budget = _budget(host, cg, unknown)
    facts = MemoryFacts(
        total_bytes=host.total_bytes, available_bytes=host.available_bytes, swap_total_bytes=host.swap_total_bytes,
        cgroup_version=cg.version, cgroup_path=cg.path, cgroup_limit_bytes=cg.limit_bytes,
        cgroup_usage_bytes=cg.usage_bytes, reserve_bytes=reserve, budget_bytes=budget,
    )
    return facts, host.readable


def _read_meminfo(fs: HostFS, unknown: Unknowns) -> _Meminfo:
    """The host's total, available and swap memory; each one missing, or the file unread, is an unknown."""
    total = available = swap = None
    meminfo_ok = False
    try:
        meminfo = parse_meminfo(fs.read_text("/proc/meminfo"))
        meminfo_ok = True
        total, available, swap = (meminfo.get(k) for k in ("MemTotal", "MemAvailable", "SwapTotal"))
        for key, fact, value in (("MemTotal", "memory.total_bytes", total),
                                 ("MemAvailable", "memory.available_bytes", available),
                                 ("SwapTotal", "memory.swap_total_bytes", swap)):
            if value is None:
                unknown.add(fact, f"{fs.describe('/proc/meminfo')} has no {key} line"
                            + (" (kernel older than 3.14)" if key == "MemAvailable" else ""))
    except ReadFailed as exc:
        why = exc.reason
    except ValueError as exc:
        why = f"{fs.describe('/proc/meminfo')} is garbled: {exc}"
    if not meminfo_ok:
        for fact in ("memory.total_bytes", "memory.available_bytes", "memory.swap_total_bytes"):
            unknown.add(fact, why)
    return _Meminfo(total, available, swap, meminfo_ok)


def _read_cgroup_memory(fs: HostFS, unknown: Unknowns, notes: list[str]) -> _CgroupMemory:
    """The tightest limit among this process's memory cgroup and its ancestors, with its usage."""
    version = path = limit = usage = None
    cgroup_known = True
    limit_unknown = False
    try:
        place = cgroup.locate(fs, "memory")
    except ReadFailed as exc:
        place = None
        if fs.exists("/proc/self/cgroup") or fs.exists(cgroup.CGROUP_FS):
            cgroup_known = False
            for fact in ("memory.cgroup_limit_bytes", "memory.cgroup_usage_bytes"):
                unknown.add(fact, f"this process's cgroup is unknown: {exc.reason}")
        else:
            notes.append("no /proc/self/cgroup and no /sys/fs/cgroup (a kernel without cgroups): "
                         "no cgroup memory limit")
    if place is not None:
        version = place.version
        levels = [_read_level(fs, place.version, p, d) for p, d in place.levels()]
        binding = _binding_level(levels)
        chosen = binding or levels[0]
        path, limit, usage = chosen.path, chosen.limit_bytes, chosen.usage_bytes
        if usage is None:
            unknown.add("memory.cgroup_usage_bytes", chosen.usage_reason or "not readable")
        unreadable = next((lv for lv in levels if lv.limit_reason), None)
        if unreadable is not None:
            # a limit we cannot read may be the tightest one: no limit and no budget are claimed
            limit_unknown = True
            limit = None
            unknown.add("memory.cgroup_limit_bytes", unreadable.limit_reason or "")
        if binding is not None and binding is not levels[0]:
            notes.append(f"the memory limit comes from an ancestor cgroup, {binding.path}")
        if place.assumed_layout:
            notes.append("no /proc/self/mountinfo: the usual cgroup mount layout under /sys/fs/cgroup was assumed")
    elif cgroup_known and fs.exists("/proc/self/cgroup"):
        notes.append("no memory cgroup controller applies to this process: no cgroup memory limit")
    return _CgroupMemory(version, path, limit, usage, limit_unread=limit_unknown or not cgroup_known)


def _budget(host: _Meminfo, cg: _CgroupMemory, unknown: Unknowns) -> tuple[int | None, int | None]:
    """(reserve, budget): the room left under the host and the cgroup, minus the reserve."""
    total, available, limit, usage = host.total_bytes, host.available_bytes, cg.limit_bytes, cg.usage_bytes
    reserve = budget = None
    if total is not None:
        effective = min(total, limit) if limit is not None else total
        reserve = reserve_bytes(effective)
    if available is None or reserve is None:
        unknown.add("memory.budget_bytes", "host MemTotal/MemAvailable unknown")
    elif cg.limit_unread:
        unknown.add("memory.budget_bytes", "a cgroup memory limit may apply but could not be read")
    elif limit is not None and usage is None:
        unknown.add("memory.budget_bytes", "a cgroup limit applies but the cgroup's usage is unknown")
    else:
        room = available if limit is None else min(available, max(0, limit - usage))
        budget = max(0, room - reserve)
    return reserve, budget


def _binding_level(levels: list[_Level]) -> _Level | None:
    """The level with a limit and the least room left (limit − usage); None if no limit."""
    best, best_room = None, None
    for lv in levels:
        if lv.limit_bytes is None:
            continue
        # unknown usage: rank by the limit alone (the budget is then reported unknown anyway)
        room = lv.limit_bytes - (lv.usage_bytes or 0)
        if best_room is None or room < best_room:
            best, best_room = lv, room
    return best


def _read_int(fs: HostFS, path: str) -> int:
    text = fs.read_text(path).strip()
    try:
        value = int(text)
    except ValueError:
        raise ReadFailed(f"{fs.describe(path)}: expected an integer, got {text[:40]!r}") from None
    if value < 0:
        raise ReadFailed(f"{fs.describe(path)}: negative value {value}")
    return value


def _read_max(fs: HostFS, path: str) -> int | None:
    """A v2 ``memory.max``/``memory.high`` file: "max" → None, else bytes."""
    text = fs.read_text(path).strip()
    if text == "max":
        return None
    return _read_int(fs, path)


def _read_level(fs: HostFS, version: int, path: str, directory: str) -> _Level:
    if version == 2:
        limit_file, usage_file, inactive_key = "memory.max", "memory.current", "inactive_file"
    else:
        # v1: usage_in_bytes and total_* in memory.stat are hierarchical (include children)
        limit_file, usage_file, inactive_key = "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
    limit: int | None = None
    limit_reason: str | None = None
    try:
        if fs.exists(f"{directory}/{limit_file}"):
            if version == 2:
                limit = _read_max(fs, f"{directory}/{limit_file}")
                # memory.high is a throttle limit: above it the kernel reclaims hard and slows the
                # cgroup down (cgroup-v2.rst, "memory.high"); a budget past it is not usable.
                if fs.exists(f"{directory}/memory.high"):
                    high = _read_max(fs, f"{directory}/memory.high")
                    if high is not None and (limit is None or high < limit):
                        limit = high
            else:
                limit = _read_int(fs, f"{directory}/{limit_file}")
                if limit >= _V1_UNLIMITED:
                    limit = None
    except ReadFailed as exc:
        limit_reason = exc.reason
    usage: int | None = None
    reason: str | None = None
    try:
        if not fs.exists(f"{directory}/{usage_file}"):
            # the root cgroup of a v2 hierarchy has no memory.current (cgroup-v2.rst)
            raise ReadFailed(f"{fs.describe(directory)} has no {usage_file}"
                             + (" (the root cgroup has none)" if version == 2 and path == "/" else ""))
        current = _read_int(fs, f"{directory}/{usage_file}")
        try:
            stat = parse_flat_keyed(fs.read_text(f"{directory}/memory.stat"))
        except ValueError as exc:
            raise ReadFailed(f"{fs.describe(directory + '/memory.stat')} is garbled: {exc}") from None
        if inactive_key not in stat:
            raise ReadFailed(f"{fs.describe(directory + '/memory.stat')} has no {inactive_key}")
        usage = max(0, current - stat[inactive_key])
    except ReadFailed as exc:
        reason = exc.reason
    return _Level(path, limit, limit_reason, usage, reason)


def describe_budget(m: MemoryFacts) -> list[str]:
    """Lines for the text view explaining the budget arithmetic."""
    lines = []
    if m.reserve_bytes is not None:
        lines.append(f"reserve {format_bytes(m.reserve_bytes)} = {RESERVE_RULE}")
    if m.budget_bytes is not None:
        if m.cgroup_limit_bytes is not None:
            lines.append(f"budget {format_bytes(m.budget_bytes)} = min(available, cgroup limit − usage) − reserve")
        else:
            lines.append(f"budget {format_bytes(m.budget_bytes)} = available − reserve")
    return lines
