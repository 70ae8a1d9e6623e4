"""The plan (schema ``edgectl.plan/1``): what the planner decided, as the runtime reads it.

A plan is written by the control plane (``edgectl plan --json``, ``/etc/edgectl/NAME/plan.json``,
a bench pass's ``plan.json``) and read by everything downstream: the worker, the unit writer,
the bench, ``status``, ``serve``. They all read it through :meth:`Plan.from_dict` (or
:meth:`Plan.load`), which refuses a malformed plan naming every bad field
(``plan.serve.port: 70000 is not a TCP port (1-65535)``), so no reader looks a key up itself.

Adding a field: declare it on the dataclass it belongs to, with a default (``field(default=...,
kw_only=True)``) so that plans written before it still load; the annotation is its schema
(``codec.py``). Unknown fields are refused, so a typo in a hand-edited plan is named, not
ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from edgectl.contract import codec
from edgectl.contract.codec import check, flat
from edgectl.contract.vision import VisionServe
from edgectl.errors import EdgectlError

SCHEMA = "edgectl.plan/1"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_NAME = "default"


# -- closed sets --------------------------------------------------------------------------------


class DeviceClass(StrEnum):
    """The instruction-set class a deployment is planned for, from the *usable* ISA (the probe
    decides it: ``edgectl/probe/cpu.py``; profiles are measured per class)."""

    X86_64_AMX = "x86_64-amx"
    X86_64_AVX512_BF16 = "x86_64-avx512-bf16"
    X86_64_AVX512 = "x86_64-avx512"
    X86_64_AVX2 = "x86_64-avx2"
    AARCH64_SVE = "aarch64-sve"
    AARCH64_NEON = "aarch64-neon"
    GENERIC = "generic"


class WeightFormat(StrEnum):
    """How the linear layers' weights are stored and multiplied: the formats edgectl serves.

    A format others measured but edgectl's runtime cannot serve is not one of them (a profile may
    still carry its figures, apart: ``edgectl.profiles.RECORDED_NOT_SERVED``)."""

    W4A16 = "w4a16"  # int4 weights, bf16 activations: PyTorch's _weight_int4pack_mm_for_cpu
    # int4 weights in blocks of 32 (GGUF Q4_1), activations quantized to int8 per call: edgectl's
    # own kernels (runtime/edgectl_runtime/kernels/ops, docs/kernels.md), AVX2 or AVX-512 VNNI at run time
    W4A8 = "w4a8"
    # int8 weights in blocks of 32 with one scale (GGUF Q8_0), activations quantized to int8 per call:
    # edgectl's W8 kernels; a speech model's linear layers (docs/speech.md "Weights")
    W8A8 = "w8a8"
    W4A16_VLLM = "w4a16-vllm"  # int4 weights on vLLM's cpu_gemm_wna16 (its AVX-512 libraries)
    BF16 = "bf16"

    @property
    def is_int4(self) -> bool:
        """Quantized by edgectl's cpu_int4 method (4-bit, or edgectl's W8 for w8a8): not dense."""
        return self is not WeightFormat.BF16


class Topology(StrEnum):
    """How many processes serve: vLLM's own layout, or all of it in one process."""

    SINGLE_PROCESS = "single-process"
    STOCK = "stock"


class Compilation(StrEnum):
    """vLLM's model execution mode: eager, or its default torch.compile (Dynamo + inductor)."""

    EAGER = "eager"
    DEFAULT = "default"


class EmbeddingPack(StrEnum):
    """Which dense embedding tables keep vLLM's prepacked GEMM copy (docs/memory.md)."""

    VLLM = "vllm"  # every one, as unmodified vLLM does: a tied table is packed twice
    LM_HEAD = "lm-head"  # only the layer that computes logits
    # none: no layer keeps one. Only where no logits go through vLLM's GEMM: a Whisper whose head is
    # the int8 scan (runtime/edgectl_runtime/vllm_plugin/whisper_exact_top.py)
    NONE = "none"


class ThreadWait(StrEnum):
    """How the engine's OpenMP threads wait between parallel regions (GNU libgomp, which torch's CPU
    build uses: ``OMP_WAIT_POLICY``; docs/kernels.md "Waiting threads")."""

    SPIN = "spin"  # libgomp's default: spin up to GOMP_SPINCOUNT (300000) times, then sleep
    PASSIVE = "passive"  # sleep at once (OMP_WAIT_POLICY=PASSIVE): the CPU goes to whatever else is runnable
    # spin briefly, then sleep (GOMP_SPINCOUNT=environment.SHORT_SPINCOUNT): the gaps between a step's
    # parallel regions are spun through, a descheduled partner is not waited for at length
    SPIN_SHORT = "spin-short"


class OptionalImports(StrEnum):
    """Whether the worker imports the packages vLLM treats as optional and a CPU text server never
    runs (opentelemetry, cv2, accelerate: runtime/edgectl_runtime/vllm_plugin/lean.py)."""

    LOAD = "load"
    SKIP = "skip"


class TokenizerLever(StrEnum):
    """How many copies of the tokenizer the worker holds (runtime/edgectl_runtime/vllm_plugin/lean.py)."""

    VLLM = "vllm"  # as unmodified vLLM: a second load at the first chat render, construction inputs kept
    LEAN = "lean"  # no second load where the model has no processor; construction inputs released


class KvCacheDtype(StrEnum):
    """The KV cache's element type (vLLM's ``--kv-cache-dtype``)."""

    AUTO = "auto"  # the model's dtype (bf16)
    FP8_E4M3 = "fp8_e4m3"  # one byte per value; vLLM's CPU attention needs AVX-512 or AMX
    # edgectl's: one byte per value and a float32 scale per token, KV head and half, written and read by
    # edgectl's kernels (runtime/edgectl_runtime/vllm_plugin/kv_int8.py); vLLM allocates it as fp8_e4m3
    INT8 = "int8"

    @property
    def bytes_per_value(self) -> int:
        return 2 if self is KvCacheDtype.AUTO else 1

    @property
    def vllm_name(self) -> str:
        """vLLM's --kv-cache-dtype for this KV: its one-byte fp8 allocation holds edgectl's int8."""
        return KvCacheDtype.FP8_E4M3.value if self is KvCacheDtype.INT8 else self.value


class Source(StrEnum):
    """Where the number or choice behind a decision comes from."""

    PROFILE = "profile"  # a figure measured on this device class (profiles/*.yaml)
    MODEL_CONFIG = "model-config"  # the model's config.json or its safetensors headers
    FLAG = "flag"  # the user asked for it
    PROBE = "probe"  # what the probe found on the host
    FALLBACK = "fallback"  # a stated guess, because nothing measured it
    DEFAULT = "default"  # edgectl's design choice unless asked, with its evidence in the detail


class ProfileKind(StrEnum):
    MEASURED = "measured"  # measured with edgectl bench
    EXTERNAL = "external"  # published figures, with a reference
    FALLBACK = "fallback"  # conservative guesses for a class nobody measured


# -- field rules --------------------------------------------------------------------------------

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _nonempty(text: str) -> str | None:
    return None if text else "expected a non-empty string"


def _at_least(minimum: float) -> Callable[[float], str | None]:
    def rule(value: float) -> str | None:
        return None if value >= minimum else f"expected a number >= {minimum}, got {value!r}"
    return rule


def _port(port: int) -> str | None:
    return None if 1 <= port <= 65535 else f"{port} is not a TCP port (1-65535)"


def _cpu_list(cpus: list[int]) -> str | None:
    if cpus and all(c >= 0 for c in cpus) and len(set(cpus)) == len(cpus):
        return None
    return f"expected a non-empty list of distinct CPU numbers, got {cpus!r}"


def _optimize_level(level: int) -> str | None:
    return None if level in (0, 1, 2) else f"expected a Python optimization level 0, 1 or 2, got {level!r}"


def _env_name(name: str) -> str | None:
    return None if _ENV_NAME_RE.fullmatch(name) else f"{name!r} is not a variable name"


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchLevers:
    """What the bench switches, one arm at a time, to measure each lever against the plan
    (``edgectl/bench/arms.py``); no command's flag sets them. ``None``: the planner's choice."""

    topology: str | None = None
    rope_cap: bool | None = None
    layerwise_repack: bool | None = None
    reserve_frontend_core: bool | None = None
    quantize_lm_head: bool | None = None
    kv_cache_bytes: int | None = None  # exact KV bytes (the bench's stock arm copies the plan's)
    embedding_pack: str | None = None
    optional_imports: str | None = None
    tokenizer: str | None = None  # vllm | lean
    idle_trim: bool | None = None
    python_optimize: int | None = None  # 0 or 2 (python -OO)
    thread_wait: str | None = None  # spin | passive | spin-short
    huge_pages: bool | None = None  # PyTorch's allocations of 2 MiB or more on transparent huge pages
    decode_attention: bool | None = None  # decode steps on edgectl's attention kernel (else vLLM's)
    lean_attention: bool | None = None  # vLLM's attention ops called with less Python (else through its methods)
    cpp_wrapper: bool | None = None  # the compiled graph's wrapper in C++ (inductor's cpp_wrapper), else Python
    speech_head: str | None = None  # a speech model's: dense | w8-scan
    speech_dtype: str | None = None  # a speech model's activations with --format w8a8: float16 | bfloat16 | float32
    tower_tiles: int | None = None  # a vision model's: the tiles its tower encodes at once (0: all, vLLM's way)


@dataclass(frozen=True)
class Request:
    """What the user asked for; ``None`` means "let the planner decide". Recorded in the plan, with
    the bench's levers among its keys: one flat object, as plans were written before they were apart."""

    model: str
    max_model_len: int | None = None
    max_num_seqs: int = 1
    weight_format: str | None = None
    group_size: int | None = None  # preferred int4 group; None: the model's hint, else 128
    # Why a model prefers a group size (the catalog knows how its weights were made).
    group_size_hint: tuple[int, str] | None = None
    threads: int | None = None
    name: str = DEFAULT_NAME
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    compilation: str | None = None
    kv_cache_dtype: str | None = None  # auto | fp8_e4m3 | int8; None: bf16, fp8 only where bf16 cannot fit
    watchdog_s: int | None = None  # WatchdogSec; default: from the predicted longest engine step
    bench: BenchLevers = field(default_factory=BenchLevers, metadata=flat())

    # The keys' order in a plan's JSON, the levers among the rest (as plans have always had it).
    _json_order = ("model", "max_model_len", "max_num_seqs", "weight_format", "group_size", "group_size_hint",
                   "threads", "name", "host", "port", "topology", "rope_cap", "layerwise_repack",
                   "reserve_frontend_core", "compilation", "quantize_lm_head", "kv_cache_bytes", "kv_cache_dtype",
                   "embedding_pack", "optional_imports", "tokenizer", "idle_trim", "python_optimize", "thread_wait",
                   "huge_pages", "decode_attention", "lean_attention", "cpp_wrapper", "speech_head", "speech_dtype",
                   "tower_tiles", "watchdog_s")

    @classmethod
    def from_flat(cls, **values: Any) -> Request:
        """A request from flat names, as a plan's JSON and the bench's arms write them: a lever's
        name (a field of BenchLevers) goes to ``bench``."""
        lever_names = {f.name for f in fields(BenchLevers)}
        levers = {k: v for k, v in values.items() if k in lever_names}
        asked = {k: v for k, v in values.items() if k not in lever_names}
        return cls(**asked, bench=BenchLevers(**levers))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = codec.to_json(self)
        return data


@dataclass(frozen=True)
class Reason:
    decision: str
    value: Any
    source: Source
    detail: str

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = codec.to_json(self)
        return data


@dataclass(frozen=True)
class ModelRef:
    name: str = field(metadata=check(_nonempty))
    path: str = field(metadata=check(_nonempty))
    architecture: str
    checkpoint_format: str  # bf16 | cpu_int4 | gptq | awq | gguf (served as it is) | the quant_method config.json names


@dataclass(frozen=True)
class ProfileRef:
    name: str
    file: str
    kind: ProfileKind


@dataclass(frozen=True)
class Levers:
    """The settings a benchmark switches one at a time (each has a bench arm)."""

    rope_cap: bool
    kv_exact: bool
    layerwise_repack: bool
    topology: Topology
    reserve_frontend_core: bool
    # The memory levers (docs/memory.md). Their defaults are unmodified vLLM's behaviour, what a
    # plan written before them ran with.
    embedding_pack: EmbeddingPack = field(default=EmbeddingPack.VLLM, kw_only=True)
    optional_imports: OptionalImports = field(default=OptionalImports.LOAD, kw_only=True)
    tokenizer: TokenizerLever = field(default=TokenizerLever.VLLM, kw_only=True)
    # return freed heap memory to the kernel when the server goes quiet (runtime/edgectl_runtime/service/idle_trim.py)
    idle_trim: bool = field(default=False, kw_only=True)
    python_optimize: int = field(default=0, kw_only=True, metadata=check(_optimize_level))
    thread_wait: ThreadWait = field(default=ThreadWait.SPIN, kw_only=True)
    # PyTorch's CPU allocator asks for transparent huge pages on allocations of 2 MiB or more
    # (THP_MEM_ALLOC_ENABLE): the weights and the KV cache on fewer TLB entries
    huge_pages: bool = field(default=False, kw_only=True)
    # decode steps attend with edgectl's kernel over the bf16 KV (EDGECTL_DECODE_ATTENTION), vLLM's otherwise
    decode_attention: bool = field(default=False, kw_only=True)
    # a decoder layer's KV write and attention call vLLM's C++ ops directly, with less Python (EDGECTL_LEAN_ATTENTION)
    lean_attention: bool = field(default=False, kw_only=True)
    # compiled mode: inductor writes the graph's wrapper (the code calling each kernel and op of a step) in C++
    # instead of Python (TORCHINDUCTOR_CPP_WRAPPER, with vLLM's layer names as plain strings: VLLM_USE_LAYERNAME=0)
    cpp_wrapper: bool = field(default=False, kw_only=True)


@dataclass(frozen=True)
class Memory:
    """The ledger: what the service's processes hold, steady state, as PSS (planner/ledger.py)."""

    weights_bytes: int
    kv_cache_bytes: int
    rope_bytes: int
    runtime_bytes: int
    workspace_bytes: int
    total_bytes: int
    high_bytes: int = field(metadata=check(_at_least(1)))
    limit_bytes: int = field(metadata=check(_at_least(1)))
    kv_scales_bytes: int = field(default=0, kw_only=True)  # an int8 KV's scales, beside vLLM's KV tensors

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        if "high_bytes" in v and "limit_bytes" in v and v["high_bytes"] > v["limit_bytes"]:
            yield "high_bytes", f"{v['high_bytes']} is above limit_bytes {v['limit_bytes']}"


@dataclass(frozen=True)
class Predicted:
    decode_tok_s: float | None
    prefill_tok_s: float | None
    ready_s: float | None
    # The model the profile's figures were measured on (None: not recorded, or no figures). A plan for
    # another model has them moved to it by planner/speed.py's rule.
    measured_on: str | None = None


@dataclass(frozen=True)
class Serve:
    name: str = field(metadata=check(_nonempty))
    host: str = field(metadata=check(_nonempty))
    port: int = field(metadata=check(_port))


@dataclass(frozen=True)
class Timeouts:
    """Seconds; written as whole seconds by the planner, rounded up if a hand-edited plan has a fraction."""

    start_s: float = field(metadata=check(_at_least(1)))
    watchdog_s: float = field(metadata=check(_at_least(1)))
    stop_s: float = field(metadata=check(_at_least(1)))


_SPEECH_DTYPES = ("float16", "bfloat16", "float32")


def _speech_dtype(dtype: str) -> str | None:
    return None if dtype in _SPEECH_DTYPES else f"expected one of {', '.join(_SPEECH_DTYPES)}, got {dtype!r}"


SPEECH_HEADS = ("dense", "w8-scan")


def _speech_head(head: str) -> str | None:
    return None if head in SPEECH_HEADS else f"expected one of {', '.join(SPEECH_HEADS)}, got {head!r}"


@dataclass(frozen=True)
class SpeechServe:
    """How a speech-to-text model (Whisper, an encoder-decoder) is served; a text model's plan has none.

    vLLM cuts audio longer than one window into windows itself; the service refuses an upload
    longer than ``max_audio_s`` or bigger than ``max_upload_bytes`` before it reaches the engine
    (runtime/edgectl_runtime/service/audio_upload.py), and vLLM's own limits are set to the same
    (``environment``: ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB``, ``VLLM_MAX_AUDIO_DECODE_DURATION_S``).
    """

    dtype: str = field(metadata=check(_speech_dtype))  # the dense weights' and activations' dtype (vLLM's --dtype)
    window_s: int = field(metadata=check(_at_least(1)))  # one encoder window (Whisper: 30 s)
    encoder_positions: int = field(metadata=check(_at_least(1)))  # the encoder's output per window (cross-attention KV rows)
    max_audio_s: int = field(metadata=check(_at_least(1)))  # the longest upload served
    max_upload_bytes: int = field(metadata=check(_at_least(1)))
    # KV held per transcription: the decoder's own tokens plus the cross-attention rows of one window
    kv_bytes_per_seq: int = field(metadata=check(_at_least(1)))
    # False for an English-only model (tiny.en): served by edgectl's class that prompts it as it was
    # trained (runtime/edgectl_runtime/vllm_plugin/whisper_english.py)
    multilingual: bool = field(default=True, kw_only=True)
    # How the logits are computed (runtime/edgectl_runtime/vllm_plugin/whisper_exact_top.py): dense, the
    # tied table in the model's dtype; w8-scan, an int8 copy of it scanned on edgectl's kernels. Either way
    # each step's best 8 again in float32.
    head: str = field(default="dense", kw_only=True, metadata=check(_speech_head))


@dataclass(frozen=True)
class Plan:
    schema: str = field(default=SCHEMA, kw_only=True)
    model: ModelRef
    device_class: DeviceClass
    profile: ProfileRef
    weight_format: WeightFormat
    group_size: int
    # The output head (and a tied embedding) is quantized: int4 next to w4a16 layers, edgectl's
    # int8 blocks next to w4a8 layers (lm_head_format).
    quantize_lm_head: bool
    max_model_len: int = field(metadata=check(_at_least(1)))
    max_num_seqs: int = field(metadata=check(_at_least(1)))
    max_num_batched_tokens: int = field(metadata=check(_at_least(1)))
    kv_bytes_per_token: int
    kv_cache_dtype: KvCacheDtype = field(default=KvCacheDtype.AUTO, kw_only=True)
    block_size: int = field(metadata=check(_at_least(1)))
    rope_rows: int
    threads: int = field(metadata=check(_at_least(1)))
    cpus: list[int] = field(metadata=check(_cpu_list))
    topology: Topology
    compilation: Compilation
    levers: Levers
    memory: Memory  # KV bytes are held here, once (edgectl.plan/1 repeats them as kv_cache_bytes)
    predicted: Predicted
    serve: Serve
    timeouts: Timeouts
    env: dict[str, str] = field(metadata=check(_env_name, keys=True))  # set for the worker (contract/environment.py)
    reasons: list[Reason]
    request: Request
    speech: SpeechServe | None = field(default=None, kw_only=True)  # a speech-to-text model: how it hears
    vision: VisionServe | None = field(default=None, kw_only=True)  # a vision-language model: the images it takes

    @classmethod
    def _cross_check(cls, v: dict[str, Any]) -> Iterator[tuple[str, str]]:
        if "levers" in v and "topology" in v and v["levers"].topology != v["topology"]:
            yield "levers.topology", f"{v['levers'].topology} differs from topology {v['topology']}"

    @property
    def modality(self) -> str:
        """What the served model takes in: ``vision`` (images and text in, text out: a plan with a
        ``vision`` part), ``speech`` (audio in, text out: a ``speech`` part) or ``text``."""
        if self.vision is not None:
            return "vision"
        return "text" if self.speech is None else "speech"

    @property
    def dtype(self) -> str:
        """vLLM's ``--dtype``: bf16 for every text format (int4 activations included), the speech plan's own."""
        return "bfloat16" if self.speech is None else self.speech.dtype

    @property
    def kv_cache_bytes(self) -> int:
        return self.memory.kv_cache_bytes

    @property
    def lm_head_format(self) -> str:
        """The output head's format: dense (the model dtype), int4 or int8 (edgectl's W8)."""
        if not self.quantize_lm_head:
            return "dense"
        return "int8" if self.weight_format in (WeightFormat.W4A8, WeightFormat.W8A8) else "int4"

    def with_serve(self, **changes: Any) -> Plan:
        """The same plan served elsewhere (another name, host or port)."""
        return replace(self, serve=replace(self.serve, **changes))

    # -- JSON -----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = codec.to_json(self)
        out: dict[str, Any] = {}
        for key, value in d.items():
            if key in ("speech", "vision") and value is None:
                continue  # a text model's plan reads as it did before speech and vision
            if key == "memory" and not value.get("kv_scales_bytes"):
                value = {k: v for k, v in value.items() if k != "kv_scales_bytes"}  # likewise before the int8 KV
            out[key] = value
            if key == "max_num_batched_tokens":
                out["kv_cache_bytes"] = self.memory.kv_cache_bytes
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Plan:
        """A plan from its JSON, strictly; EdgectlError naming every bad field otherwise.

        ``source`` (a file) prefixes the messages: ``/etc/edgectl/x/plan.json: plan.cpus: ...``.
        """
        where = f"{source}: " if source else ""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            got = data.get("schema") if isinstance(data, dict) else None
            what = f"{source} is" if source else "this is"
            raise EdgectlError(
                f"{what} not an edgectl plan (schema {SCHEMA}"
                + (f", got schema {got!r}" if got is not None else
                   "" if isinstance(data, dict) else f"; plan: not a JSON object, got {codec.kind_of(data)}")
                + "): make one with `edgectl plan MODEL --json`")
        body = dict(data)
        kv = body.pop("kv_cache_bytes", None)
        plan, problems = codec.read(cls, body, "plan")
        memory = data.get("memory")
        ledger_kv = memory.get("kv_cache_bytes") if isinstance(memory, dict) else None
        if "kv_cache_bytes" not in data:
            problems.append("plan.kv_cache_bytes: missing")
        elif kv != ledger_kv and isinstance(ledger_kv, int):
            problems.append(f"plan.kv_cache_bytes: {kv!r} differs from memory.kv_cache_bytes {ledger_kv}")
        if problems:
            raise EdgectlError(where + problems[0], details=[where + p for p in problems[1:]])
        assert isinstance(plan, Plan)
        return plan

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """The plan in a file; EdgectlError saying what is wrong with it, naming the file."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise EdgectlError(f"cannot read the plan {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise EdgectlError(f"the plan {path} is not JSON: {exc.msg} at line {exc.lineno}") from None
        return cls.from_dict(data, source=str(path))
