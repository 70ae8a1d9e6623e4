"""What a probe found: frozen dataclasses, the versioned JSON (``edgectl.probe/1``) and back.

A probe taken on one host is planned on another, so :meth:`HostFacts.from_dict` validates what
it reads and names the bad field. A fact that could not be read is ``None`` (or an empty
``flags`` list) *and* is listed in ``unknown`` with the reason; nothing is a silent 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

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


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    memory_total_bytes: int | None


@dataclass(frozen=True)
class TopologyFacts:
    logical_cpus: int | None  # online CPUs
    physical_cores: int | None
    sockets: int | None
    usable_cpus: tuple[int, ...] | None  # affinity ∩ cgroup cpuset ∩ online
    cpu_quota_cores: float | None  # cgroup cpu.max / cfs quota; None = unlimited (or unknown: see `unknown`)
    numa_nodes: tuple[NumaNode, ...] | None


@dataclass(frozen=True)
class MemoryFacts:
    total_bytes: int | None
    available_bytes: int | None
    swap_total_bytes: int | None
    cgroup_version: int | None  # of the hierarchy the memory controller was read from
    cgroup_path: str | None  # the cgroup the limit and usage below belong to (own cgroup or an ancestor)
    cgroup_limit_bytes: int | None  # None = no limit (or unknown: see `unknown`)
    cgroup_usage_bytes: int | None  # without the inactive page cache
    reserve_bytes: int | None
    budget_bytes: int | None


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
    bandwidth_gbps: float | None
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
        """Read facts written by :meth:`to_dict` (possibly on another host), strictly.

        Raises :class:`EdgectlError` naming ``source: field: problem`` for anything malformed.
        """
        # Fields are read in a fixed order (the first malformed one is the one reported): each
        # section's object first, then its fields, as below.
        r = _Reader(source)
        top = r.obj(d, "")
        schema = r.field(top, "", "schema", str)
        if schema != SCHEMA:
            raise EdgectlError(f"{source}: schema: expected {SCHEMA!r}, got {schema!r}; "
                               "re-run `edgectl probe --json` with this edgectl version")
        cpu = r.obj(r.field(top, "", "cpu", dict), "cpu")
        isa, disagreements = _read_isa(r, cpu)
        topo = r.obj(r.field(top, "", "topology", dict), "topology")
        numa = _read_numa_nodes(r, topo)
        usable_raw = r.field(topo, "topology", "usable_cpus", list, nullable=True)
        mem = r.obj(r.field(top, "", "memory", dict), "memory")
        sw = r.obj(r.field(top, "", "software", dict), "software")
        return cls(
            schema=schema,
            root=r.field(top, "", "root", str),
            device_class=r.enum(r.field(top, "", "device_class", str), DeviceClass, "device_class"),
            cpu=_read_cpu(r, cpu, isa, disagreements),
            topology=_read_topology(r, topo, numa, usable_raw),
            memory=_read_memory(r, mem),
            bandwidth_gbps=r.number(top, "", "bandwidth_gbps"),
            software=_read_software(r, sw),
            unknown=tuple(
                UnknownFact(fact=r.field(x, p, "fact", str), reason=r.field(x, p, "reason", str))
                for p, x in r.items(r.field(top, "", "unknown", list), "unknown")
            ),
            notes=tuple(r.str_list(top.get("notes", []), "notes")),  # optional: added in probe/1
        )


def _read_isa(r: _Reader, cpu: dict[str, Any]) -> tuple[Isa, tuple[IsaDisagreement, ...]]:
    isa_d = r.obj(r.field(cpu, "cpu", "isa", dict), "cpu.isa")
    isa = Isa(**{f: r.field(isa_d, "cpu.isa", f, bool) for f in ISA_FEATURES})
    disagreements = tuple(
        IsaDisagreement(
            feature=r.field(x, p, "feature", str), kernel=r.field(x, p, "kernel", bool),
            cpuid=r.field(x, p, "cpuid", bool), note=r.field(x, p, "note", str),
        )
        for p, x in r.items(r.field(cpu, "cpu", "isa_disagreements", list), "cpu.isa_disagreements")
    )
    return isa, disagreements


def _read_cpu(r: _Reader, cpu: dict[str, Any], isa: Isa, disagreements: tuple[IsaDisagreement, ...]) -> CpuFacts:
    return CpuFacts(
        arch=r.field(cpu, "cpu", "arch", str, nullable=True),
        vendor=r.field(cpu, "cpu", "vendor", str, nullable=True),
        model_name=r.field(cpu, "cpu", "model_name", str, nullable=True),
        flags=tuple(r.str_list(r.field(cpu, "cpu", "flags", list), "cpu.flags")),
        isa=isa,
        isa_disagreements=disagreements,
        amx_permission=r.enum(r.field(cpu, "cpu", "amx_permission", str), AmxPermission, "cpu.amx_permission"),
    )


def _read_numa_nodes(r: _Reader, topo: dict[str, Any]) -> tuple[NumaNode, ...] | None:
    numa_raw = r.field(topo, "topology", "numa_nodes", list, nullable=True)
    return None if numa_raw is None else tuple(
        NumaNode(
            id=r.field(x, p, "id", int),
            cpus=tuple(r.int_list(r.field(x, p, "cpus", list), p + ".cpus")),
            memory_total_bytes=r.field(x, p, "memory_total_bytes", int, nullable=True),
        )
        for p, x in r.items(numa_raw, "topology.numa_nodes")
    )


def _read_topology(r: _Reader, topo: dict[str, Any], numa: tuple[NumaNode, ...] | None,
                   usable_raw: list[Any] | None) -> TopologyFacts:
    return TopologyFacts(
        logical_cpus=r.field(topo, "topology", "logical_cpus", int, nullable=True),
        physical_cores=r.field(topo, "topology", "physical_cores", int, nullable=True),
        sockets=r.field(topo, "topology", "sockets", int, nullable=True),
        usable_cpus=None if usable_raw is None else tuple(r.int_list(usable_raw, "topology.usable_cpus")),
        cpu_quota_cores=r.number(topo, "topology", "cpu_quota_cores"),
        numa_nodes=numa,
    )


def _read_memory(r: _Reader, mem: dict[str, Any]) -> MemoryFacts:
    """Every field an int or null, but the cgroup's path."""
    kinds = {"cgroup_path": str}
    return MemoryFacts(**{f.name: r.field(mem, "memory", f.name, kinds.get(f.name, int), nullable=True)
                          for f in fields(MemoryFacts)})


def _read_software(r: _Reader, sw: dict[str, Any]) -> SoftwareFacts:
    """Every field a string or null, but whether systemd is PID 1."""
    kinds = {"systemd_pid1": bool}
    return SoftwareFacts(**{f.name: r.field(sw, "software", f.name, kinds.get(f.name, str), nullable=True)
                            for f in fields(SoftwareFacts)})


class _Reader:
    """Strict field access for :meth:`HostFacts.from_dict`; errors name ``source: path: problem``."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, path: str, problem: str) -> EdgectlError:
        return EdgectlError(f"{self.source}: {path or '(top level)'}: {problem}")

    def obj(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {type(value).__name__}")
        return value

    def field(self, d: dict[str, Any], path: str, key: str, kind: type, *, nullable: bool = False) -> Any:
        where = f"{path}.{key}" if path else key
        if key not in d:
            raise self.fail(where, "missing")
        value = d[key]
        if value is None and nullable:
            return None
        # bool is an int in Python: keep them apart so `true` is not read as 1 byte
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise self.fail(where, f"expected {kind.__name__}{' or null' if nullable else ''}, "
                                   f"got {value!r}")
        if kind is int and value < 0:
            raise self.fail(where, f"expected a non-negative integer, got {value}")
        return value

    def number(self, d: dict[str, Any], path: str, key: str) -> float | None:
        where = f"{path}.{key}" if path else key
        if key not in d:
            raise self.fail(where, "missing")
        value = d[key]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.fail(where, f"expected a non-negative number or null, got {value!r}")
        return float(value)

    def enum(self, value: str, kind: type[StrEnum], path: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            allowed = ", ".join(str(v) for v in kind)
            raise self.fail(path, f"expected one of {allowed}, got {value!r}") from None

    def items(self, values: list[Any], path: str):
        for i, x in enumerate(values):
            yield f"{path}[{i}]", self.obj(x, f"{path}[{i}]")

    def int_list(self, values: list[Any], path: str) -> list[int]:
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise self.fail(f"{path}[{i}]", f"expected a CPU number, got {v!r}")
        return values

    def str_list(self, values: Any, path: str) -> list[str]:
        if not isinstance(values, list):
            raise self.fail(path, f"expected a list, got {type(values).__name__}")
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise self.fail(f"{path}[{i}]", f"expected a string, got {v!r}")
        return values
