"""What a probe found: frozen dataclasses, the versioned JSON (``edgectl.probe/1``) and back.

A probe taken on one host is planned on another, so :meth:`HostFacts.from_dict` validates what
it reads and names the bad field. A fact that could not be read is ``None`` (or an empty
``flags`` list) *and* is listed in ``unknown`` with the reason; nothing is a silent 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from edgectl.contract import codec
from edgectl.contract.codec import check
from edgectl.contract.plan import (
    DeviceClass,  # the classes a plan is for (the probe decides which)
)
from edgectl.errors import EdgectlError

SCHEMA = "edgectl.probe/1"


class AmxPermission(StrEnum):
    """Result of ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` on the live host."""

    GRANTED = "granted"
    DENIED = "denied"
    UNSUPPORTED = "unsupported"  # no AMX in the usable ISA, or the kernel cannot enable tile data
    NOT_CHECKED = "not-checked"  # a captured tree (no process to ask), or the check itself failed


# Features reported in ``cpu.isa``, in the kernel's /proc/cpuinfo spelling.
ISA_FEATURES: tuple[str, ...] = (
    "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
    "amx_tile", "amx_int8", "amx_bf16", "asimd", "sve",
)


def _not_negative(value: Any) -> str | None:
    """A count, a size or a CPU number: never below 0 (a tuple: each of its numbers)."""
    for i, v in enumerate(value if isinstance(value, tuple) else (value,)):
        if v < 0:
            where = f" at [{i}]" if isinstance(value, tuple) else ""
            return f"expected a non-negative number, got {v}{where}"
    return None


# A field read from JSON that is a count, a size or CPU numbers.
COUNT = check(_not_negative)


# The AVX-512 subsets every AVX-512 device class requires (F + BW + VL + DQ).
AVX512_CORE: tuple[str, ...] = ("avx512f", "avx512bw", "avx512vl", "avx512dq")


@dataclass(frozen=True)
class Isa:
    """Feature → usable (enabled by the OS), not merely advertised by cpuid."""

    avx2: bool = False
    fma: bool = False
    avx512f: bool = False
    avx512bw: bool = False
    avx512vl: bool = False
    avx512dq: bool = False
    avx512_vnni: bool = False
    avx512_bf16: bool = False
    amx_tile: bool = False
    amx_int8: bool = False
    amx_bf16: bool = False
    asimd: bool = False
    sve: bool = False

    def usable(self) -> tuple[str, ...]:
        return tuple(f for f in ISA_FEATURES if getattr(self, f))

    @property
    def avx512(self) -> bool:
        """AVX-512 as vLLM's CPU build and torch require it before loading their AVX-512 code."""
        return all(getattr(self, f) for f in AVX512_CORE)

    def to_dict(self) -> dict[str, bool]:
        return {f: getattr(self, f) for f in ISA_FEATURES}


@dataclass(frozen=True)
class IsaDisagreement:
    feature: str
    kernel: bool  # listed in /proc/cpuinfo (what the OS enabled)
    cpuid: bool  # advertised by the cpuid instruction (or the fixture's cpuid-flags stand-in)
    note: str


@dataclass(frozen=True)
class CpuFacts:
    arch: str | None
    vendor: str | None
    model_name: str | None
    flags: tuple[str, ...]  # as advertised by the kernel, sorted
    isa: Isa
    isa_disagreements: tuple[IsaDisagreement, ...]
    amx_permission: AmxPermission
    # x86: "family F model M stepping S" from /proc/cpuinfo. Two boxes of one device class may be
    # different silicon (a KVM guest's model name is often only "Intel(R) Xeon(R) Processor"), so
    # a figure names it. None where the CPU does not say (Arm: its part is in model_name).
    signature: str | None = None


@dataclass(frozen=True)
class NumaNode:
    id: int = field(metadata=COUNT)
    cpus: tuple[int, ...] = field(metadata=COUNT)
    memory_total_bytes: int | None = field(metadata=COUNT)


@dataclass(frozen=True)
class TopologyFacts:
    logical_cpus: int | None = field(metadata=COUNT)  # online CPUs
    physical_cores: int | None = field(metadata=COUNT)
    sockets: int | None = field(metadata=COUNT)
    usable_cpus: tuple[int, ...] | None = field(metadata=COUNT)  # affinity ∩ cgroup cpuset ∩ online
    # cgroup cpu.max / cfs quota; None = unlimited (or unknown: see `unknown`)
    cpu_quota_cores: float | None = field(metadata=COUNT)
    numa_nodes: tuple[NumaNode, ...] | None


@dataclass(frozen=True)
class MemoryFacts:
    total_bytes: int | None = field(metadata=COUNT)
    available_bytes: int | None = field(metadata=COUNT)
    swap_total_bytes: int | None = field(metadata=COUNT)
    cgroup_version: int | None = field(metadata=COUNT)  # of the hierarchy the memory controller was read from
    cgroup_path: str | None  # the cgroup the limit and usage below belong to (own cgroup or an ancestor)
    cgroup_limit_bytes: int | None = field(metadata=COUNT)  # None = no limit (or unknown: see `unknown`)
    cgroup_usage_bytes: int | None = field(metadata=COUNT)  # without the inactive page cache
    reserve_bytes: int | None = field(metadata=COUNT)
    budget_bytes: int | None = field(metadata=COUNT)


@dataclass(frozen=True)
class SoftwareFacts:
    python: str | None
    torch: str | None  # None: not installed (or unknown: see `unknown`)
    vllm: str | None
    systemd_pid1: bool | None
    kernel: str | None


@dataclass(frozen=True)
class UnknownFact:
    fact: str  # dotted path into the JSON, e.g. "memory.cgroup_limit_bytes"
    reason: str


@dataclass(frozen=True)
class HostFacts:
    root: str
    device_class: DeviceClass
    cpu: CpuFacts
    topology: TopologyFacts
    memory: MemoryFacts
    bandwidth_gbps: float | None = field(metadata=COUNT)
    software: SoftwareFacts
    unknown: tuple[UnknownFact, ...]
    # Assumptions the probe made and why (e.g. "AMX permission not checked: captured tree").
    notes: tuple[str, ...] = ()
    schema: str = SCHEMA

    def is_unknown(self, fact: str) -> bool:
        return any(u.fact == fact for u in self.unknown)

    # ---- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        c, t, m, s = self.cpu, self.topology, self.memory, self.software
        return {
            "schema": self.schema,
            "root": self.root,
            "device_class": str(self.device_class),
            "cpu": {
                "arch": c.arch,
                "vendor": c.vendor,
                "model_name": c.model_name,
                "flags": list(c.flags),
                "isa": c.isa.to_dict(),
                "isa_disagreements": [
                    {"feature": d.feature, "kernel": d.kernel, "cpuid": d.cpuid, "note": d.note}
                    for d in c.isa_disagreements
                ],
                "amx_permission": str(c.amx_permission),
                "signature": c.signature,
            },
            "topology": {
                "logical_cpus": t.logical_cpus,
                "physical_cores": t.physical_cores,
                "sockets": t.sockets,
                "usable_cpus": None if t.usable_cpus is None else list(t.usable_cpus),
                "cpu_quota_cores": t.cpu_quota_cores,
                "numa_nodes": None if t.numa_nodes is None else [
                    {"id": n.id, "cpus": list(n.cpus), "memory_total_bytes": n.memory_total_bytes}
                    for n in t.numa_nodes
                ],
            },
            "memory": {f.name: getattr(m, f.name) for f in fields(MemoryFacts)},
            "bandwidth_gbps": self.bandwidth_gbps,
            "software": {f.name: getattr(s, f.name) for f in fields(SoftwareFacts)},
            "unknown": [{"fact": u.fact, "reason": u.reason} for u in self.unknown],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "probe facts") -> HostFacts:
        """Read facts written by :meth:`to_dict` (possibly on another host), strictly, through the
        contract's codec (``edgectl/contract/codec.py``).

        Raises :class:`EdgectlError` naming ``source: field: problem`` for anything malformed (the
        first problem; the others as its details).
        """
        if not isinstance(d, dict):
            raise EdgectlError(f"{source}: (top level): expected an object, got {codec.kind_of(d)}")
        if d.get("schema") != SCHEMA:
            raise EdgectlError(f"{source}: schema: expected {SCHEMA!r}, got {d.get('schema')!r}; "
                               "re-run `edgectl probe --json` with this edgectl version")
        facts, problems = codec.read(cls, d, "probe")
        problems = [p.removeprefix("probe.") for p in _missing_isa(d) + problems]
        if problems:
            raise EdgectlError(f"{source}: {problems[0]}", details=[f"{source}: {p}" for p in problems[1:]])
        assert isinstance(facts, HostFacts)
        return facts


def _missing_isa(d: dict[str, Any]) -> list[str]:
    """Every ISA feature is written (``Isa`` defaults each to False only for the probe's own use)."""
    cpu = d.get("cpu")
    isa = cpu.get("isa") if isinstance(cpu, dict) else None
    if not isinstance(isa, dict):
        return []
    return [f"probe.cpu.isa.{f}: missing" for f in ISA_FEATURES if f not in isa]
