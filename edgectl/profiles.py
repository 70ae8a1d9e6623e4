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

Validation is strict and goes through the contract's codec (``edgectl/contract/codec.py``), as
the plan's and the probe's facts do: an unknown key is an error, and every problem is reported as
``file: path.to.field: problem``, all of them in one pass.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from edgectl.contract import codec
from edgectl.contract.codec import check
from edgectl.contract.plan import (
    Compilation,
    DeviceClass,
    ProfileKind,
    ThreadWait,
    Topology,
    WeightFormat,
)
from edgectl.contract.plan import Source as ReasonSource
from edgectl.errors import EdgectlError
from edgectl.probe.facts import ISA_FEATURES, HostFacts

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
    # The parameters of the model's linear layers, the LM head not among them: what each prompt token
    # multiplies (the head runs once per sequence in a prefill). None: not recorded (older sources).
    model_linear_params: int | None = None


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
    # The rate a decode step reads one more byte of weights at, in GB/s: the slope of the time per token
    # over the weight bytes per token, between two models decoded on this class in one occasion. The rest
    # of a step (vLLM's Python around the graph, attention, sampling) does not grow with the weights; a
    # decode figure scaled by bytes alone treats all of it as if it did (planner/speed.py).
    decode_weight_gbps: Figure | None = None
    # The same compiled plan with inductor's graph wrapper in C++ (levers.cpp_wrapper), measured against the
    # Python wrapper in one run: the planner turns the lever on where it paid (planner/engine.py).
    cpp_wrapper: CppWrapperFigures | None = None


@dataclass(frozen=True)
class CppWrapperFigures:
    """The compiled plan with inductor's C++ graph wrapper (the bench's ``cpp-wrapper`` arm) beside the
    Python one (its control, ``planned`` or ``python-wrapper``), interleaved in one run: decode with each,
    and what the C++ wrapper's first start costs (it compiles a C++ file of the whole graph: longer,
    and g++ holds more memory beside the model than the Python wrapper's kernels do)."""

    decode_tok_s: Figure
    control_decode_tok_s: Figure
    ready_cold_s: Figure | None = None
    cold_peak_ratio: Figure | None = None


@dataclass(frozen=True)
class SpeechFigures:
    """A speech-to-text model (Whisper) served on this class (docs/speech.md "Memory").

    The planner's speech ledger is weights + KV + one window's encoder work + ``process_bytes``
    + ``per_transcription_bytes`` for each transcription at once beyond the first."""

    process_bytes: Figure  # PSS beyond weights, KV and the encoder's work, serving one transcription at once
    per_transcription_bytes: Figure | None  # more for each further transcription at once (beyond its KV)
    load_peak_ratio: Figure | None  # the start's peak PSS / the steady PSS


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
    speech: SpeechFigures | None = None  # measured serving a speech-to-text model
    # How the OpenMP threads wait between parallel regions on this class, where measured (planner/cpus.py).
    thread_wait: ThreadWait | None = None
    thread_wait_evidence: str | None = None

    @property
    def reason_source(self) -> ReasonSource:
        """The source a plan's reasons cite for this profile's figures: a fallback's are guesses."""
        return ReasonSource.FALLBACK if self.kind is ProfileKind.FALLBACK else ReasonSource.PROFILE

    def matches(self, facts: HostFacts) -> tuple[bool, str]:
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


# -- the file, as the codec reads it --------------------------------------------------------
#
# The YAML document's schema is these dataclasses' annotations, read by the contract's codec
# (edgectl/contract/codec.py) as the plan and the probe's facts are: types, closed sets and
# unknown keys are the codec's; a rule on one field is its ``check``; a rule between fields is
# a ``_cross_check``, which runs over the fields that were read, so one pass names every bad
# field. A read document is then resolved into a Profile (figures joined to their sources).


def _is_schema(value: str) -> str | None:
    return None if value == SCHEMA else f"{value!r} is not {SCHEMA!r}"


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else "must be at least 1"


def _regular_expression(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    return None


@dataclass(frozen=True)
class _SourceEntry:
    """``sources.KEY``: the provenance every figure citing KEY carries."""

    cpu_model: str
    cores: int
    ram_bytes: int
    date: str  # YAML's unquoted dates are read as text (_dates_as_text)
    command: str
    vllm: str | None = None
    torch: str | None = None
    edgectl_commit: str | None = None
    external: bool | None = None
    reference: str | None = None
    artifact: str | None = None
    model: str | None = None
    model_weights_bytes: int | None = None
    notes: str | None = None
    model_linear_params: int | None = None

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        if v.get("external"):
            if not v.get("reference"):
                yield "reference", "missing (an external source says where its figures were published)"
            return
        for key in ("edgectl_commit", "vllm", "torch"):
            if not v.get(key):
                yield key, "missing (a figure measured with edgectl records the versions it ran)"

    def source(self, key: str) -> Source:
        return Source(
            key=key, cpu_model=self.cpu_model, cores=self.cores, ram_bytes=self.ram_bytes, date=self.date,
            command=self.command, vllm=self.vllm, torch=self.torch, edgectl_commit=self.edgectl_commit,
            external=bool(self.external), reference=self.reference, artifact=self.artifact, model=self.model,
            model_weights_bytes=self.model_weights_bytes, notes=self.notes,
            model_linear_params=self.model_linear_params,
        )


@dataclass(frozen=True)
class _FigureEntry:
    """One figure: ``{median, min, max, passes, source}``; its source is checked by the document."""

    median: float
    min: float | None = None
    max: float | None = None
    passes: int | None = field(default=None, metadata=check(_at_least_one))
    source: str | None = None


@dataclass(frozen=True)
class _FormatEntry:
    runs: bool
    reason: str | None = None
    decode_tok_s: _FigureEntry | None = None
    prefill_tok_s: _FigureEntry | None = None
    weights_bytes_ratio: _FigureEntry | None = None


@dataclass(frozen=True)
class _CompiledEntry:
    weight_format: WeightFormat
    decode_tok_s: _FigureEntry | None = None
    prefill_tok_s: _FigureEntry | None = None
    ready_cold_s: _FigureEntry | None = None
    ready_warm_s: _FigureEntry | None = None
    extra_bytes: _FigureEntry | None = None
    cold_peak_ratio: _FigureEntry | None = None
    decode_weight_gbps: _FigureEntry | None = None
    cpp_wrapper: _CppWrapperEntry | None = None

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        rate = v.get("decode_weight_gbps")
        if rate is not None and not rate.median > 0:
            yield "decode_weight_gbps", f"{rate.median} is not a rate (GB/s above 0)"


@dataclass(frozen=True)
class _CppWrapperEntry:
    decode_tok_s: _FigureEntry
    control_decode_tok_s: _FigureEntry
    ready_cold_s: _FigureEntry | None = None
    cold_peak_ratio: _FigureEntry | None = None

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        ours, control = v.get("decode_tok_s"), v.get("control_decode_tok_s")
        if ours is not None and control is not None and ours.source != control.source:
            yield "control_decode_tok_s", (f"from {control.source}, the C++ wrapper's figure from {ours.source}: "
                                           "the two wrappers are compared within one run")
        ratio = v.get("cold_peak_ratio")
        if ratio is not None and not ratio.median >= 1:
            yield "cold_peak_ratio", f"{ratio.median} is below 1 (a peak over the steady PSS)"


@dataclass(frozen=True)
class _RuntimeEntry:
    process_bytes: _FigureEntry | None = None
    processes: dict[str, int] | None = None  # per topology, over DEFAULT_PROCESSES
    workspace_bytes_per_token: _FigureEntry | None = None
    load_peak_ratio: _FigureEntry | None = None
    ready_s: _FigureEntry | None = None
    tokenizer_bytes: _FigureEntry | None = None

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        for topo, n in (v.get("processes") or {}).items():
            if topo not in set(Topology):
                yield f"processes.{topo}", f"{topo!r} is not one of {', '.join(Topology)}"
            if n < 1:
                yield f"processes.{topo}", f"expected a positive integer, got {n!r}"


@dataclass(frozen=True)
class _SpeechEntry:
    process_bytes: _FigureEntry
    per_transcription_bytes: _FigureEntry | None = None
    load_peak_ratio: _FigureEntry | None = None


@dataclass(frozen=True)
class _ThreadsEntry:
    reserve_frontend_core: bool | None = None
    evidence: str | None = None
    wait: ThreadWait | None = None
    wait_evidence: str | None = None


@dataclass(frozen=True)
class _MatchEntry:
    arch: str
    isa_all: tuple[str, ...] | None = None
    isa_none: tuple[str, ...] | None = None
    vendor: str | None = field(default=None, metadata=check(_regular_expression))
    model_pattern: str | None = field(default=None, metadata=check(_regular_expression))
    min_cores: int | None = None
    max_cores: int | None = None

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        for key in ("isa_all", "isa_none"):
            for i, feature in enumerate(v.get(key) or ()):
                if feature not in ISA_FEATURES:
                    yield f"{key}[{i}]", f"{feature!r} is not one of {', '.join(ISA_FEATURES)}"

    def match(self) -> Match:
        return Match(arch=self.arch, isa_all=self.isa_all or (), isa_none=self.isa_none or (),
                     vendor=self.vendor, model_pattern=self.model_pattern,
                     min_cores=self.min_cores, max_cores=self.max_cores)


@dataclass(frozen=True)
class _ProfileDocument:
    """A profile file (schema ``edgectl.profile/1``)."""

    schema: str = field(metadata=check(_is_schema))
    name: str
    device_class: DeviceClass
    kind: ProfileKind
    match: _MatchEntry
    sources: dict[str, _SourceEntry]
    description: str | None = None
    formats: dict[str, _FormatEntry] | None = None
    runtime: _RuntimeEntry | None = None
    threads: _ThreadsEntry | None = None
    compilation: Compilation | None = None
    compiled: _CompiledEntry | None = None
    bandwidth_gbps: _FigureEntry | None = None
    notes: str | None = None
    emulated: str | None = None
    speech: _SpeechEntry | None = None

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        yield from _format_name_problems(v.get("formats") or {})
        figures = list(_figure_entries(v))
        for path, entry in figures:
            if entry.min is not None and entry.max is not None and not entry.min <= entry.median <= entry.max:
                yield path, f"median {entry.median} is not within min {entry.min} and max {entry.max}"
        if "sources" in v:  # else a source is broken: reported there, not again at each figure citing it
            for path, entry in figures:
                yield from _source_problems(path, entry, v["sources"])
        yield from _kind_problems(v)


def _format_name_problems(formats: dict[str, _FormatEntry]) -> Iterator[tuple[str, str]]:
    """Each format is one edgectl serves or one recorded but not served; a kernel that does not run says why."""
    for name, entry in formats.items():
        if name not in set(WeightFormat) and name not in RECORDED_NOT_SERVED:
            yield f"formats.{name}", (f"{name!r} is not one of {', '.join(WeightFormat)} (nor a format recorded "
                                      f"but not served by edgectl: {', '.join(RECORDED_NOT_SERVED)})")
        if not entry.runs and not entry.reason:
            yield f"formats.{name}.reason", "missing (say why the kernel does not run here)"


def _figure_entries(v: dict[str, Any]) -> Iterator[tuple[str, _FigureEntry]]:
    """Every figure of a (partly) read document, with its path in the file."""
    if v.get("bandwidth_gbps") is not None:
        yield "bandwidth_gbps", v["bandwidth_gbps"]
    sections = [(f"formats.{name}", entry) for name, entry in (v.get("formats") or {}).items()]
    sections += [(key, v[key]) for key in ("runtime", "compiled", "speech") if v.get(key) is not None]
    while sections:
        prefix, section = sections.pop(0)
        for f in fields(section):
            value = getattr(section, f.name)
            if isinstance(value, _FigureEntry):
                yield f"{prefix}.{f.name}", value
            elif value is not None and is_dataclass(value):  # a block inside a section (compiled.cpp_wrapper)
                sections.append((f"{prefix}.{f.name}", value))


def _default_source(sources: dict[str, _SourceEntry]) -> str | None:
    """The source a figure without one cites: the only one defined, if there is only one."""
    return next(iter(sources)) if len(sources) == 1 else None


def _source_problems(path: str, entry: _FigureEntry, sources: dict[str, _SourceEntry]) -> Iterator[tuple[str, str]]:
    key = entry.source if entry.source is not None else _default_source(sources)
    if key is None:
        yield f"{path}.source", "missing (every figure names its source)"
    elif key not in sources:
        yield f"{path}.source", f"unknown source {key!r} (defined: {', '.join(sorted(sources)) or 'none'})"
    elif not sources[key].external and entry.passes is None:
        yield f"{path}.passes", "missing (a measured figure says how many passes it is the median of)"


def _kind_problems(v: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """What a profile's kind allows: only a measured one is emulated; a fallback matches any host."""
    kind, match = v.get("kind"), v.get("match")
    if v.get("emulated") and kind is not None and kind is not ProfileKind.MEASURED:
        yield "emulated", "only a measured profile can be emulated (it says how the ISA was held down)"
    if kind is ProfileKind.FALLBACK and match is not None and (match.isa_all or match.arch != "any"):
        yield "match", "a fallback profile must match any host (arch: any, no ISA rules)"


# -- the document resolved into a Profile ---------------------------------------------------

DEFAULT_PROCESSES = {Topology.SINGLE_PROCESS: 1, Topology.STOCK: 4}


class _Resolver:
    """Joins a read document's figures to their sources (checked by the document: every key is known)."""

    def __init__(self, sources: dict[str, _SourceEntry]) -> None:
        self.sources = {key: entry.source(key) for key, entry in sources.items()}
        self.default = _default_source(sources)

    def figure(self, entry: _FigureEntry | None) -> Figure | None:
        if entry is None:
            return None
        key = entry.source if entry.source is not None else self.default
        assert key is not None
        return Figure(float(entry.median), _float(entry.min), _float(entry.max), entry.passes, self.sources[key])

    def format(self, entry: _FormatEntry) -> FormatFigures:
        return FormatFigures(runs=entry.runs, reason=entry.reason, decode_tok_s=self.figure(entry.decode_tok_s),
                             prefill_tok_s=self.figure(entry.prefill_tok_s),
                             weights_bytes_ratio=self.figure(entry.weights_bytes_ratio))

    def compiled(self, entry: _CompiledEntry | None) -> CompiledFigures | None:
        if entry is None:
            return None
        return CompiledFigures(
            weight_format=entry.weight_format, decode_tok_s=self.figure(entry.decode_tok_s),
            prefill_tok_s=self.figure(entry.prefill_tok_s), ready_cold_s=self.figure(entry.ready_cold_s),
            ready_warm_s=self.figure(entry.ready_warm_s), extra_bytes=self.figure(entry.extra_bytes),
            cold_peak_ratio=self.figure(entry.cold_peak_ratio),
            decode_weight_gbps=self.figure(entry.decode_weight_gbps),
            cpp_wrapper=self.cpp_wrapper(entry.cpp_wrapper))

    def cpp_wrapper(self, entry: _CppWrapperEntry | None) -> CppWrapperFigures | None:
        if entry is None:
            return None
        ours, control = self.figure(entry.decode_tok_s), self.figure(entry.control_decode_tok_s)
        assert ours is not None and control is not None
        return CppWrapperFigures(decode_tok_s=ours, control_decode_tok_s=control,
                                 ready_cold_s=self.figure(entry.ready_cold_s),
                                 cold_peak_ratio=self.figure(entry.cold_peak_ratio))


    def speech(self, entry: _SpeechEntry | None) -> SpeechFigures | None:
        if entry is None:
            return None
        process = self.figure(entry.process_bytes)
        assert process is not None
        return SpeechFigures(process_bytes=process, per_transcription_bytes=self.figure(entry.per_transcription_bytes),
                             load_peak_ratio=self.figure(entry.load_peak_ratio))


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _profile(doc: _ProfileDocument, file: str) -> Profile:
    resolve = _Resolver(doc.sources)
    formats = doc.formats or {}
    runtime = doc.runtime or _RuntimeEntry()
    threads = doc.threads or _ThreadsEntry()
    return Profile(
        name=doc.name, file=file, device_class=doc.device_class.value, kind=doc.kind,
        description=doc.description or "", match=doc.match.match(),
        formats={WeightFormat(n): resolve.format(e) for n, e in formats.items() if n in set(WeightFormat)},
        process_bytes=resolve.figure(runtime.process_bytes),
        processes={**DEFAULT_PROCESSES, **{Topology(t): n for t, n in (runtime.processes or {}).items()}},
        workspace_bytes_per_token=resolve.figure(runtime.workspace_bytes_per_token),
        load_peak_ratio=resolve.figure(runtime.load_peak_ratio),
        ready_s=resolve.figure(runtime.ready_s),
        reserve_frontend_core=threads.reserve_frontend_core,
        reserve_evidence=threads.evidence,
        compilation=doc.compilation,
        bandwidth_gbps=resolve.figure(doc.bandwidth_gbps),
        sources=resolve.sources,
        emulated=doc.emulated or None,
        compiled=resolve.compiled(doc.compiled),
        recorded_not_served={n: resolve.format(e) for n, e in formats.items() if n in RECORDED_NOT_SERVED},
        tokenizer_bytes=resolve.figure(runtime.tokenizer_bytes),
        speech=resolve.speech(doc.speech),
        thread_wait=threads.wait,
        thread_wait_evidence=threads.wait_evidence,
    )


def _dates_as_text(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with each source's date as text: YAML reads an unquoted ``2026-12-01`` as a date."""
    sources = raw.get("sources")
    if not isinstance(sources, dict):
        return raw
    as_text = {key: ({**s, "date": str(s["date"])} if isinstance(s, dict) and isinstance(s.get("date"), _dt.date)
                     else s) for key, s in sources.items()}
    return {**raw, "sources": as_text}


def parse_profile(raw: Any, file: str) -> tuple[Profile | None, list[str]]:
    """Validate one profile document; return it (or None) and every problem found, each
    ``file: path.to.field: problem``."""
    if not isinstance(raw, dict):
        return None, [f"{file}: (top level): expected an object, got {codec.kind_of(raw)}"]
    doc, problems = codec.read(_ProfileDocument, _dates_as_text(raw), "profile")
    errors = [f"{file}: {p.removeprefix('profile.')}" for p in problems]
    if errors:
        return None, errors
    assert isinstance(doc, _ProfileDocument)
    return _profile(doc, file), []


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


def select_profile(profiles: list[Profile], facts: HostFacts) -> tuple[Profile, list[str]]:
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
