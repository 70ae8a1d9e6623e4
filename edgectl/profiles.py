"""Device profiles: measured figures per device class, with their provenance.

A profile is a YAML file (schema ``edgectl.profile/1``) that says which hosts it
matches (rules on the probe) and what was *measured* there: for each weight format
whether its kernel runs and how fast it decodes and prefills, the runtime's fixed
memory per process, the per-token workspace, whether reserving a core for the
HTTP front end helped, and (``compiled``) the same format in vLLM's compiled mode: speeds,
the first start that compiles and a later one that loads the saved graph, the memory it adds.
Every figure names its source, and every source carries the
CPU, cores, RAM, date, edgectl commit, vLLM and torch versions and the command.
A profile may also record figures for a format edgectl does not serve (``RECORDED_NOT_SERVED``,
e.g. a published W4A8-on-AMX figure): they are kept apart and never planned.

Validation is strict: an unknown key is an error, and every problem is reported as
``file: path.to.field: problem``.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgectl.contract.plan import Compilation, ProfileKind, Topology, WeightFormat
from edgectl.contract.plan import Source as ReasonSource
from edgectl.errors import EdgectlError
from edgectl.probe.facts import ISA_FEATURES, DeviceClass

SCHEMA = "edgectl.profile/1"

# Formats a profile may carry figures for although edgectl does not serve them: numbers others
# published (or an earlier edgectl recorded) for a kernel edgectl's runtime has no path to. They
# are read and kept apart (``Profile.recorded_not_served``), shown as data, never planned; any
# other name that is not a ``WeightFormat`` is an error. Each says why edgectl cannot serve it.
RECORDED_NOT_SERVED: dict[str, str] = {
    "w4a8-amx": "W4A8 on AMX is vLLM's int4_scaled_mm_cpu, which edgectl's runtime never calls",
}


# -- the data -------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where a set of figures came from."""

    key: str
    cpu_model: str
    cores: int
    ram_bytes: int
    date: str
    command: str
    vllm: str | None
    torch: str | None
    edgectl_commit: str | None
    external: bool
    reference: str | None
    artifact: str | None
    model: str | None
    model_weights_bytes: int | None
    notes: str | None


@dataclass(frozen=True)
class Figure:
    """One measured number: the median of ``passes`` passes, with its spread."""

    median: float
    min: float | None
    max: float | None
    passes: int | None
    source: Source

    def describe(self, unit: str) -> str:
        spread = ""
        if self.min is not None and self.max is not None:
            spread = f", range {self.min:g}–{self.max:g}"
        passes = f", {self.passes} passes" if self.passes else ""
        return f"{self.median:g} {unit} (median{passes}{spread}; {self.source.key})"


@dataclass(frozen=True)
class FormatFigures:
    runs: bool
    reason: str | None
    decode_tok_s: Figure | None
    prefill_tok_s: Figure | None
    weights_bytes_ratio: Figure | None  # measured resident weights / planned weights, if measured


@dataclass(frozen=True)
class CompiledFigures:
    """The same weight format in vLLM's compiled mode (the bench's ``compiled`` arm, same run as
    the eager figures): speeds, the first start (it compiles: ``ready_cold_s``), a later start (it
    loads the graph the first one saved: ``ready_warm_s``), the steady PSS it adds over eager, and
    the first start's peak PSS over the steady PSS (``cold_peak_ratio``: the compile runs inductor
    and g++/cc1plus beside the loaded model, in the service's cgroup)."""

    weight_format: WeightFormat
    decode_tok_s: Figure | None
    prefill_tok_s: Figure | None
    ready_cold_s: Figure | None
    ready_warm_s: Figure | None
    extra_bytes: Figure | None
    cold_peak_ratio: Figure | None = None


@dataclass(frozen=True)
class Match:
    arch: str
    isa_all: tuple[str, ...]
    isa_none: tuple[str, ...]
    vendor: str | None
    model_pattern: str | None
    min_cores: int | None
    max_cores: int | None


@dataclass(frozen=True)
class Profile:
    name: str
    file: str
    device_class: str
    kind: ProfileKind
    description: str
    match: Match
    formats: dict[WeightFormat, FormatFigures]
    process_bytes: Figure | None  # fixed PSS of one process holding interpreter + torch + vLLM (+ server)
    processes: dict[Topology, int]  # processes per topology
    workspace_bytes_per_token: Figure | None
    load_peak_ratio: Figure | None
    ready_s: Figure | None
    reserve_frontend_core: bool | None
    reserve_evidence: str | None
    compilation: Compilation | None  # the mode the figures were measured in; None: not stated
    bandwidth_gbps: Figure | None
    sources: dict[str, Source] = field(default_factory=dict)
    # Recorded with the ISA held down on a bigger CPU (e.g. "x86_64-avx2 emulated on x86_64-amx:
    # ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"): the code paths are the class's, the memory
    # system and the clock are not. None: measured on the class itself.
    emulated: str | None = None
    compiled: CompiledFigures | None = None  # measured in compiled mode too (the planner chooses with it)
    # Figures for formats edgectl does not serve (RECORDED_NOT_SERVED), by name: data, never planned.
    recorded_not_served: dict[str, FormatFigures] = field(default_factory=dict)
    # What the tokenizer of the model process_bytes was measured with costs the worker
    # (edgectl_runtime/introspect/tokenizer_cost.py): the ledger adds a model's own cost minus this one.
    tokenizer_bytes: Figure | None = None

    @property
    def reason_source(self) -> ReasonSource:
        """The source a plan's reasons cite for this profile's figures: a fallback's are guesses."""
        return ReasonSource.FALLBACK if self.kind is ProfileKind.FALLBACK else ReasonSource.PROFILE

    def matches(self, facts: Any) -> tuple[bool, str]:
        """Whether this profile applies to a probe's facts, and why not."""
        cpu = facts.cpu
        if self.match.arch != "any" and cpu.arch != self.match.arch:
            return False, f"arch {cpu.arch} is not {self.match.arch}"
        isa = cpu.isa
        missing = [f for f in self.match.isa_all if not getattr(isa, f, False)]
        if missing:
            return False, "lacks usable " + ", ".join(missing)
        present = [f for f in self.match.isa_none if getattr(isa, f, False)]
        if present:
            return False, "has " + ", ".join(present)
        if self.match.vendor and not re.search(self.match.vendor, cpu.vendor or ""):
            return False, f"vendor {cpu.vendor!r} does not match {self.match.vendor!r}"
        if self.match.model_pattern and not re.search(self.match.model_pattern, cpu.model_name or ""):
            return False, f"CPU {cpu.model_name!r} does not match {self.match.model_pattern!r}"
        cores = len(facts.topology.usable_cpus or [])
        if self.match.min_cores is not None and cores < self.match.min_cores:
            return False, f"{cores} usable CPUs < {self.match.min_cores}"
        if self.match.max_cores is not None and cores > self.match.max_cores:
            return False, f"{cores} usable CPUs > {self.match.max_cores}"
        return True, "matches"

    def specificity(self) -> int:
        """More specific rules win when several profiles match."""
        m = self.match
        return (len(m.isa_all) + len(m.isa_none) + 3 * bool(m.vendor) + 3 * bool(m.model_pattern)
                + bool(m.min_cores is not None) + bool(m.max_cores is not None))


# -- validation -----------------------------------------------------------------------


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file
        self.errors: list[str] = []

    def err(self, path: str, problem: str) -> None:
        self.errors.append(f"{self.file}: {path or '(top level)'}: {problem}")

    def mapping(self, value: Any, path: str, required: dict[str, type | tuple], optional: dict[str, type | tuple]) -> dict:
        if not isinstance(value, dict):
            self.err(path, f"expected a mapping, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in required and key not in optional:
                known = ", ".join(sorted([*required, *optional]))
                self.err(_join(path, key), f"unknown key (known: {known})")
        for key, typ in required.items():
            if key not in value:
                self.err(_join(path, key), "missing")
            else:
                self._type(value[key], _join(path, key), typ)
        for key, typ in optional.items():
            if key in value and value[key] is not None:
                self._type(value[key], _join(path, key), typ)
        return value

    def _type(self, value: Any, path: str, typ: type | tuple) -> None:
        types = typ if isinstance(typ, tuple) else (typ,)
        if bool in types or not isinstance(value, bool):
            if isinstance(value, types):
                return
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            return
        names = " or ".join(t.__name__ for t in types)
        self.err(path, f"expected {names}, got {type(value).__name__} {value!r}")

    def one_of(self, value: Any, path: str, allowed: tuple[str, ...]) -> None:
        if value is not None and value not in allowed:
            self.err(path, f"{value!r} is not one of {', '.join(allowed)}")


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


_FIGURE_KEYS = {"median": float}
_FIGURE_OPTIONAL = {"min": float, "max": float, "passes": int, "source": str}


def _figure(c: _Checker, raw: Any, path: str, sources: dict[str, Source], default_source: str | None,
            bad_sources: frozenset[str] = frozenset()) -> Figure | None:
    if not isinstance(raw, dict):
        return None  # absent, or its parent reported the wrong type
    before = len(c.errors)
    data = c.mapping(raw, path, _FIGURE_KEYS, _FIGURE_OPTIONAL)
    if len(c.errors) > before or "median" not in data:
        return None  # a field was missing or of the wrong type: reported, nothing to compare
    key = data.get("source", default_source)
    if key is None:
        c.err(_join(path, "source"), "missing (every figure names its source)")
        return None
    if key in bad_sources:
        return None  # the source itself is invalid: reported there
    if key not in sources:
        c.err(_join(path, "source"), f"unknown source {key!r} (defined: {', '.join(sorted(sources)) or 'none'})")
        return None
    src = sources[key]
    passes = data.get("passes")
    if passes is not None and passes < 1:
        c.err(_join(path, "passes"), "must be at least 1")
    if not src.external and passes is None:
        c.err(_join(path, "passes"), "missing (a measured figure says how many passes it is the median of)")
    lo, hi, med = data.get("min"), data.get("max"), data["median"]
    if lo is not None and hi is not None and not (lo <= med <= hi):
        c.err(path, f"median {med} is not within min {lo} and max {hi}")
    return Figure(float(med), _f(lo), _f(hi), passes, src)


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _source(c: _Checker, key: str, raw: Any, path: str) -> Source | None:
    before = len(c.errors)
    data = c.mapping(
        raw, path,
        {"cpu_model": str, "cores": int, "ram_bytes": int, "date": (str, _dt.date), "command": str},
        {"vllm": str, "torch": str, "edgectl_commit": str, "external": bool, "reference": str,
         "artifact": str, "model": str, "model_weights_bytes": int, "notes": str},
    )
    if not data:
        return None
    external = bool(data.get("external", False))
    if external and not data.get("reference"):
        c.err(_join(path, "reference"), "missing (an external source says where its figures were published)")
    if not external:
        for key_ in ("edgectl_commit", "vllm", "torch"):
            if not data.get(key_):
                c.err(_join(path, key_), "missing (a figure measured with edgectl records the versions it ran)")
    date = data.get("date")
    if len(c.errors) > before:
        return None  # reported; a field of the wrong type cannot be read
    return Source(
        key=key, cpu_model=data.get("cpu_model", ""), cores=int(data.get("cores", 0) or 0),
        ram_bytes=int(data.get("ram_bytes", 0) or 0), date=str(date), command=data.get("command", ""),
        vllm=data.get("vllm"), torch=data.get("torch"), edgectl_commit=data.get("edgectl_commit"),
        external=external, reference=data.get("reference"), artifact=data.get("artifact"),
        model=data.get("model"), model_weights_bytes=data.get("model_weights_bytes"), notes=data.get("notes"),
    )


def _read_top(c: _Checker, raw: Any) -> dict:
    """The top-level mapping, its schema and its closed choices; empty when it is no mapping."""
    top = c.mapping(
        raw, "",
        {"schema": str, "name": str, "device_class": str, "kind": str, "match": dict, "sources": dict},
        {"description": str, "formats": dict, "runtime": dict, "threads": dict, "compilation": str,
         "compiled": dict, "bandwidth_gbps": dict, "notes": str, "emulated": str},
    )
    if not top:
        return top
    if isinstance(top.get("schema"), str) and top["schema"] != SCHEMA:
        c.err("schema", f"{top.get('schema')!r} is not {SCHEMA!r}")
    for key, allowed in (("device_class", tuple(DeviceClass)), ("kind", tuple(ProfileKind))):
        if isinstance(top.get(key), str):
            c.one_of(top[key], key, allowed)
    return top


# Sub-mappings whose type the top level already checked (and reported) are read only
# when they are mappings, so one bad field gives one line.
def _read_sources(c: _Checker, raw_sources: dict) -> dict[str, Source]:
    """``sources``: the valid ones by key (an invalid one is reported and left out)."""
    sources: dict[str, Source] = {}
    for key, sraw in raw_sources.items():
        src = _source(c, str(key), sraw, f"sources.{key}")  # None when invalid (reported)
        if src:
            sources[str(key)] = src
    return sources


class _FigureReader:
    """Reads a profile's figures against its sources: a figure names its source, or the profile
    defines exactly one; a figure citing an invalid source is not reported again."""

    def __init__(self, c: _Checker, top: dict) -> None:
        self.c = c
        self.usable = isinstance(top.get("sources"), dict)
        raw_sources = _dict(top.get("sources"))
        self.sources = _read_sources(c, raw_sources)
        self.bad_sources = frozenset(str(k) for k in raw_sources if str(k) not in self.sources)
        self.default_source = str(next(iter(raw_sources))) if len(raw_sources) == 1 else None

    def __call__(self, raw: Any, path: str) -> Figure | None:
        if not self.usable:
            return None  # no usable sources at all: reported once, at `sources`
        return _figure(self.c, raw, path, self.sources, self.default_source, self.bad_sources)


def _read_match(c: _Checker, top: dict) -> Match:
    """``match``: the rules on the probe, with each ISA feature and regular expression checked."""
    m = (c.mapping(top["match"], "match", {"arch": str},
                   {"isa_all": list, "isa_none": list, "vendor": str, "model_pattern": str,
                    "min_cores": int, "max_cores": int})
         if isinstance(top.get("match"), dict) else {})
    for key in ("isa_all", "isa_none"):
        items = m.get(key)
        for i, feat in enumerate(items if isinstance(items, list) else []):
            c.one_of(feat, f"match.{key}[{i}]", ISA_FEATURES)
    for key in ("vendor", "model_pattern"):
        if isinstance(m.get(key), str) and m[key]:
            try:
                re.compile(m[key])
            except re.error as exc:
                c.err(f"match.{key}", f"not a regular expression: {exc}")
    return Match(
        arch=m.get("arch", ""), isa_all=tuple(_list(m.get("isa_all"))), isa_none=tuple(_list(m.get("isa_none"))),
        vendor=m.get("vendor"), model_pattern=m.get("model_pattern"),
        min_cores=m.get("min_cores"), max_cores=m.get("max_cores"),
    )


def _read_formats(c: _Checker, top: dict,
                  figure: _FigureReader) -> tuple[dict[WeightFormat, FormatFigures], dict[str, FormatFigures]]:
    """``formats``: the served formats' figures, and apart the ones recorded but not served."""
    formats: dict[WeightFormat, FormatFigures] = {}
    recorded: dict[str, FormatFigures] = {}
    for fmt, fraw in _dict(top.get("formats")).items():
        path = f"formats.{fmt}"
        if fmt not in set(WeightFormat) and fmt not in RECORDED_NOT_SERVED:
            c.err(path, f"{fmt!r} is not one of {', '.join(WeightFormat)} (nor a format recorded but not "
                        f"served by edgectl: {', '.join(RECORDED_NOT_SERVED)})")
        fd = c.mapping(fraw, path, {"runs": bool},
                       {"reason": str, "decode_tok_s": dict, "prefill_tok_s": dict, "weights_bytes_ratio": dict})
        if not fd:
            continue
        if fd.get("runs") is False and not fd.get("reason"):
            c.err(f"{path}.reason", "missing (say why the kernel does not run here)")
        figures = FormatFigures(
            runs=bool(fd.get("runs")),
            reason=fd.get("reason"),
            decode_tok_s=figure(fd.get("decode_tok_s"), f"{path}.decode_tok_s"),
            prefill_tok_s=figure(fd.get("prefill_tok_s"), f"{path}.prefill_tok_s"),
            weights_bytes_ratio=figure(fd.get("weights_bytes_ratio"), f"{path}.weights_bytes_ratio"),
        )
        if fmt in set(WeightFormat):
            formats[WeightFormat(fmt)] = figures
        elif fmt in RECORDED_NOT_SERVED:  # else reported above
            recorded[fmt] = figures
    return formats, recorded


def _read_processes(c: _Checker, rt: dict) -> dict[Topology, int]:
    """``runtime.processes``: processes per topology, over the defaults."""
    processes = {Topology.SINGLE_PROCESS: 1, Topology.STOCK: 4}
    for topo, n in _dict(rt.get("processes")).items():
        c.one_of(topo, f"runtime.processes.{topo}", tuple(Topology))
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            c.err(f"runtime.processes.{topo}", f"expected a positive integer, got {n!r}")
        elif topo in set(Topology):
            processes[Topology(topo)] = n
    return processes


_COMPILED_FIGURES = ("decode_tok_s", "prefill_tok_s", "ready_cold_s", "ready_warm_s", "extra_bytes", "cold_peak_ratio")


def _read_compiled(c: _Checker, top: dict, figure: _FigureReader) -> CompiledFigures | None:
    """``compiled``: one format's figures in compiled mode, if the profile has them."""
    if not isinstance(top.get("compiled"), dict):
        return None
    cd = c.mapping(top["compiled"], "compiled", {"weight_format": str}, {k: dict for k in _COMPILED_FIGURES})
    fmt = cd.get("weight_format")
    if isinstance(fmt, str):
        c.one_of(fmt, "compiled.weight_format", tuple(WeightFormat))
    if fmt not in set(WeightFormat):
        return None
    return CompiledFigures(weight_format=WeightFormat(fmt),
                           **{k: figure(cd.get(k), f"compiled.{k}") for k in _COMPILED_FIGURES})


def _check_kind_rules(c: _Checker, profile: Profile) -> None:
    """What a profile's kind allows: only a measured one is emulated; a fallback matches any host."""
    if profile.emulated and profile.kind is not ProfileKind.MEASURED:
        c.err("emulated", "only a measured profile can be emulated (it says how the ISA was held down)")
    if profile.kind is ProfileKind.FALLBACK and (profile.match.isa_all or profile.match.arch != "any"):
        c.err("match", "a fallback profile must match any host (arch: any, no ISA rules)")


def parse_profile(raw: Any, file: str) -> tuple[Profile | None, list[str]]:
    """Validate one profile document; return it (or None) and every problem found."""
    c = _Checker(file)
    top = _read_top(c, raw)
    if not top:
        return None, c.errors
    figure = _FigureReader(c, top)
    match = _read_match(c, top)
    formats, recorded = _read_formats(c, top, figure)
    rt = c.mapping(_dict(top.get("runtime")), "runtime", {},
                   {"process_bytes": dict, "processes": dict, "workspace_bytes_per_token": dict,
                    "load_peak_ratio": dict, "ready_s": dict, "tokenizer_bytes": dict})
    processes = _read_processes(c, rt)
    th = c.mapping(_dict(top.get("threads")), "threads", {}, {"reserve_frontend_core": bool, "evidence": str})
    compilation = top.get("compilation")
    if isinstance(compilation, str):
        c.one_of(compilation, "compilation", tuple(Compilation))
    compiled = _read_compiled(c, top, figure)

    profile = Profile(
        name=top.get("name", ""), file=file, device_class=top.get("device_class", ""),
        kind=ProfileKind(top["kind"]) if top.get("kind") in set(ProfileKind) else top.get("kind", ""),
        description=top.get("description", ""), match=match, formats=formats,
        process_bytes=figure(rt.get("process_bytes"), "runtime.process_bytes"),
        processes=processes,
        workspace_bytes_per_token=figure(rt.get("workspace_bytes_per_token"), "runtime.workspace_bytes_per_token"),
        load_peak_ratio=figure(rt.get("load_peak_ratio"), "runtime.load_peak_ratio"),
        ready_s=figure(rt.get("ready_s"), "runtime.ready_s"),
        reserve_frontend_core=th.get("reserve_frontend_core"),
        reserve_evidence=th.get("evidence"),
        compilation=Compilation(compilation) if compilation in set(Compilation) else None,
        bandwidth_gbps=figure(top.get("bandwidth_gbps"), "bandwidth_gbps"),
        sources=figure.sources,
        emulated=top.get("emulated") or None,
        compiled=compiled,
        recorded_not_served=recorded,
        tokenizer_bytes=figure(rt.get("tokenizer_bytes"), "runtime.tokenizer_bytes"),
    )
    _check_kind_rules(c, profile)
    return (profile if not c.errors else None), c.errors


def load_profile(path: Path) -> Profile:
    import yaml  # here, not at import time: commands that read no profile start without it

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise EdgectlError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise EdgectlError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    profile, errors = parse_profile(raw, str(path))
    if errors:
        raise EdgectlError(errors[0], details=errors[1:])
    assert profile is not None
    return profile


def load_profiles(dirs: list[Path]) -> list[Profile]:
    """Every profile in ``dirs`` (later directories win on equal names); all problems at once."""
    by_name: dict[str, Profile] = {}
    errors: list[str] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.yaml")):
            try:
                profile = load_profile(path)
            except EdgectlError as exc:
                errors.extend([exc.message, *exc.details])
                continue
            by_name[profile.name] = profile
    if errors:
        raise EdgectlError(errors[0], details=errors[1:] + ["fix the profile(s) above, or remove them"])
    return list(by_name.values())


def select_profile(profiles: list[Profile], facts: Any) -> tuple[Profile, list[str]]:
    """The most specific matching measured/external profile, else the fallback for the arch.

    For the probed class: a profile recorded on the class itself beats one recorded on an emulated
    ISA, and one edgectl measured (``edgectl bench --record-profile``) beats published external
    figures; then the most specific rules win.

    Returns the profile and one line per profile considered (why it did or did not match).
    """
    considered: list[str] = []
    candidates: list[Profile] = []
    fallbacks: list[Profile] = []
    for p in profiles:
        ok, why = p.matches(facts)
        considered.append(f"{p.name}: {why}")
        if not ok:
            continue
        (fallbacks if p.kind is ProfileKind.FALLBACK else candidates).append(p)
    # Prefer profiles for exactly the probed class, then the most specific rules.
    def rank(p: Profile) -> tuple[int, int, int, int]:
        return (int(p.device_class == facts.device_class), int(not p.emulated),
                int(p.kind is ProfileKind.MEASURED), p.specificity())

    if candidates:
        return max(candidates, key=rank), considered
    if fallbacks:
        return max(fallbacks, key=rank), considered
    raise EdgectlError(
        f"no device profile matches this host ({facts.device_class}, {facts.cpu.arch}) and no fallback profile "
        "exists: reinstall edgectl (profiles/generic.yaml ships with it)"
    )
