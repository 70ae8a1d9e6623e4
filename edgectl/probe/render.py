"""``edgectl probe``'s result: :class:`~edgectl.probe.facts.HostFacts` as versioned JSON or as text.

The facts are the data; this is the view of them (the facts do not know it, so reading the
probe's JSON on another host needs no view at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgectl.probe.facts import HostFacts
from edgectl.probe.formats import format_bytes, format_cpu_list
from edgectl.probe.memory import describe_budget


@dataclass(frozen=True)
class Probed:
    facts: HostFacts

    def to_dict(self) -> dict[str, Any]:
        return self.facts.to_dict()

    def render_text(self) -> str:
        return render_text(self.facts)


def _opt(value: object, unit: str = "") -> str:
    return "unknown" if value is None else f"{value}{unit}"


def render_text(f: HostFacts) -> str:
    c, t, m, s = f.cpu, f.topology, f.memory, f.software
    out: list[str] = []
    add = out.append
    add(f"edgectl probe of {f.root}")
    usable = " ".join(c.isa.usable()) or "none of the tracked features"
    add(f"device class  {f.device_class}   (usable: {usable})")
    add(f"cpu           {_opt(c.model_name)}  [{_opt(c.vendor)}, {_opt(c.arch)}"
        + (f", {c.signature}]" if c.signature else "]"))
    add(f"              AMX permission: {c.amx_permission}")
    for d in c.isa_disagreements:
        add(f"              ! {d.feature}: kernel {'yes' if d.kernel else 'no'}, "
            f"cpuid {'yes' if d.cpuid else 'no'} — {d.note}")

    sockets = "unknown" if t.sockets is None else f"{t.sockets} socket{'s' if t.sockets != 1 else ''}"
    add(f"cpus          {_opt(t.logical_cpus)} logical, {_opt(t.physical_cores)} physical cores, {sockets}")
    usable_cpus = "unknown" if t.usable_cpus is None else (
        f"{format_cpu_list(t.usable_cpus)} ({len(t.usable_cpus)})")
    quota = "none" if t.cpu_quota_cores is None else f"{t.cpu_quota_cores:g} cores"
    if f.is_unknown("topology.cpu_quota_cores"):
        quota = "unknown"
    add(f"              usable CPUs {usable_cpus} (affinity ∩ cgroup cpuset ∩ online); CPU quota {quota}")
    for n in t.numa_nodes or ():
        add(f"              NUMA node {n.id}: CPUs {format_cpu_list(n.cpus)}, {format_bytes(n.memory_total_bytes)}")

    add(f"memory        total {format_bytes(m.total_bytes)}, available {format_bytes(m.available_bytes)}, "
        f"swap {format_bytes(m.swap_total_bytes)}")
    if m.cgroup_version is not None:
        limit = "no limit" if m.cgroup_limit_bytes is None else f"limit {format_bytes(m.cgroup_limit_bytes)}"
        if f.is_unknown("memory.cgroup_limit_bytes"):
            limit = "limit unknown"
        add(f"              cgroup v{m.cgroup_version} {m.cgroup_path}: {limit}, "
            f"usage {format_bytes(m.cgroup_usage_bytes)} (inactive page cache not counted)")
    for line in describe_budget(m):
        add(f"              {line}")

    if f.bandwidth_gbps is not None:
        add(f"bandwidth     {f.bandwidth_gbps:g} GB/s (read + write bytes of a multi-threaded copy, median)")
    elif f.is_unknown("bandwidth_gbps"):
        add("bandwidth     unknown (see below)")
    else:
        add("bandwidth     not measured (add --bandwidth for a 2-second copy test)")

    systemd = {True: "yes", False: "no", None: "unknown"}[s.systemd_pid1]
    def package(name: str, version: str | None) -> str:
        if version is not None:
            return version
        return "unknown" if f.is_unknown(f"software.{name}") else "not installed"

    add(f"software      Python {_opt(s.python)}, torch {package('torch', s.torch)}, "
        f"vLLM {package('vllm', s.vllm)}, kernel {_opt(s.kernel)}, systemd PID 1: {systemd}")
    for note in f.notes:
        add(f"note          {note}")
    for u in f.unknown:
        add(f"unknown       {u.fact}: {u.reason}")
    return "\n".join(out) + "\n"
