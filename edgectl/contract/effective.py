"""Did the plan take effect? A plan against the settings read back from a running engine.

The effective settings (schema ``edgectl.effective/1``) are read inside the process that holds
the model (``runtime/edgectl_runtime/service/readback.py``): what the forward pass really uses, not what
a config object says. :func:`mismatches` is the one comparison, shared by the worker (which
refuses to serve on any difference, exit code ``EXIT_MISMATCH``) and the bench (which marks such
a pass invalid). The fields it compares:

    kv_cache_bytes         bytes of the KV tensors actually allocated
    rope_rows              {module: rows of its cos/sin table}
    linear_formats         {layer: "cpu_int4/g32" | "bf16" | ...}, the output head included; each int4
                           layer's group is what the plan's group size gives its width (for
                           weights quantized at load; a 4-bit checkpoint keeps its own groups)
    linear_in_features     {layer: in_features}, for that rule
    lm_head_format         the output head's format
    kernel_isa             the ISA level edgectl's own kernels dispatch to (avx512vnni | avxvnni | avx2 | scalar),
                           None where the library is not loaded
    threads                torch's intra-op threads in the engine
    processes              processes in the server's tree (itself included): 1 in the single-process
                           topology, more in vLLM's own
    kv_cache_dtype         the attention layers' KV cache dtype, and kv_tensor_dtypes the KV
                           tensors' own (uint8 for fp8)
    embedding_pack         {layer: {"state": "packed" | "not packed" | "no packed kernel", "lm_head": bool}}
                           for every dense embedding table (the LM head included); "no packed
                           kernel": vLLM tried and this CPU has no packed GEMM for it (AVX2:
                           runtime/edgectl_runtime/vllm_plugin/embedding.py), which a plan that keeps the copy accepts
    optional_imports       {package: "kept out" | "loaded" | "not imported"} in the server's process
    tokenizer              {"lean": bool, "processor_loaded": bool | None (read again after the warm-up,
                           which is when vLLM probes for a processor), "construction_inputs":
                           {"held": [...], "read_after_init": [...]} | None}
    idle_trim              {"enabled": bool, "available": bool (glibc's malloc_trim found), "trims": n,
                           "released_bytes", "last_ms", "max_ms", ...}: the trimmer's running figures
    python_optimize        the server process's ``sys.flags.optimize``
    tower_tiles            a vision plan's: {"tiles": the tiles a tower batch as installed (0: all, vLLM's
                           way), "calls": n, "batches": n} (runtime/edgectl_runtime/vllm_plugin/tower_tiles.py)
    max_model_len, max_num_seqs
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgectl.contract import codec, int4_layout
from edgectl.contract.codec import check
from edgectl.contract.vllm_args import GGUF_LOAD_FORMAT
from edgectl.errors import EdgectlError

if TYPE_CHECKING:
    from edgectl.contract.plan import Plan

SCHEMA = "edgectl.effective/1"


# -- the read-back's type --------------------------------------------------------------------------
#
# Every field is optional: which ones a read-back holds depends on who read it (the edgectl worker
# reports all of them; the bench's unmodified-vLLM arm what vLLM's routes and the read-back extension
# give, ``edgectl/bench/arms.py``; its llama.cpp arm what ``/props`` gives) and on the edgectl that
# wrote it (bench artifacts keep older read-backs). A field left at its default was not read back;
# :attr:`Effective.reported` names the ones that were, where absent and null differ.


@dataclass(frozen=True)
class ConstructionInputs:
    """The tokenizer's construction inputs it still holds, and those its class reads after ``__init__``."""

    held: tuple[str, ...] = ()
    read_after_init: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenizerState:
    """The served tokenizer (``runtime/edgectl_runtime/vllm_plugin/lean.py`` ``tokenizer_state``)."""

    lean: bool = False
    processor_loaded: bool | None = None  # None: not known (read again after the warm-up)
    construction_inputs: ConstructionInputs | None = None


@dataclass(frozen=True)
class IdleTrim:
    """The idle trimmer's running figures (``runtime/edgectl_runtime/service/idle_trim.py`` ``state``)."""

    enabled: bool = False
    available: bool | None = None  # glibc's malloc_trim found
    idle_s: float | None = None
    trims: int | None = None
    released_bytes: int | None = None
    last_ms: float | None = None
    max_ms: float | None = None
    in_flight: int | None = None


@dataclass(frozen=True)
class EmbeddingPackState:
    """One dense embedding table's packed copy: "packed" | "not packed" | "no packed kernel"."""

    state: str | None = None
    lm_head: bool = False


@dataclass(frozen=True)
class Resident:
    """Resident bytes of the model's parameters and buffers, by dtype (``describe_model``)."""

    by_dtype: dict[str, int] | None = None
    parameters_bytes: int | None = None
    buffers_bytes: int | None = None
    total_bytes: int | None = None
    outside_parameters_bytes: int | None = None  # weights vLLM moved out of the parameters


@dataclass(frozen=True)
class KernelFacts:
    """The kernels' view of this CPU in the model's process."""

    cpu_capability: str | None = None  # torch's
    int4_block_rows: int | None = None
    edgectl_isa: str | None = None  # edgectl's kernel library: avx512vnni | avxvnni | avx2 | scalar, None when not loaded
    torch_threads: int | None = None


def _is_this_schema(schema: Any) -> str | None:
    return None if schema == SCHEMA else f"{schema!r} is not {SCHEMA!r}"


@dataclass(frozen=True)
class Effective:
    """What a running engine reports of its settings (schema ``edgectl.effective/1``; the
    fields compared with the plan are described in this module's docstring)."""

    schema: str = field(default=SCHEMA, metadata=check(_is_this_schema))
    readback_via: str | None = None  # added by the bench: which routes it was read from
    # the engine's configuration, as vLLM holds it
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes_config: int | None = None
    quantization: str | None = None
    load_format: str | None = None
    enforce_eager: bool | None = None
    # read in the process that holds the model
    worker_pid: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_dtype: tuple[str, ...] | None = None
    kv_tensor_dtypes: tuple[str, ...] | None = None
    attention_isa: tuple[str, ...] | None = None
    # whose kernel attention calls take in the worker: {"kernel": "edgectl" | "vllm", "calls": {"edgectl": n, "vllm": n}}
    decode_attention: dict[str, Any] | None = None
    # how a decoder layer's attention reaches vLLM's ops: {"path": "lean" | "vllm", "calls": {"lean": n, "vllm": n}}
    lean_attention: dict[str, Any] | None = None
    embedding_pack: dict[str, EmbeddingPackState] | None = None
    rope_rows: dict[str, int] | None = None
    linear_formats: dict[str, str] | None = None
    linear_in_features: dict[str, int] | None = None
    linear_format_counts: dict[str, int] | None = None
    lm_head_format: str | None = None
    resident: Resident | None = None
    quantization_readback: dict[str, Any] | None = None  # the quantization method's own description
    levers: dict[str, str | None] | None = None  # the runtime's levers as its environment has them
    kernel: KernelFacts | None = None
    compile: dict[str, Any] | None = None  # the compiled graph's provenance (compile_cache.facts)
    kernel_isa: str | None = None
    threads: int | None = None
    thread_wait: str | None = None  # spin | passive | active: OMP_WAIT_POLICY as the worker's OpenMP runtime read it
    omp_cpus: tuple[int, ...] | None = None
    # vLLM's one-rank gloo groups after start: {"released": n, "transport_threads": n left} or {"kept": why, ...}
    gloo_groups: dict[str, Any] | None = None
    speech_head: str | None = None  # a Whisper's: dense | w8-scan, as its model class computes the logits
    # a vision tower's batches: {"tiles": the lever as installed (0: not), "calls": n, "batches": n}
    tower_tiles: dict[str, int] | None = None
    # the server's process tree and its own process
    server_pid: int | None = None
    processes: int | None = None
    process_names: tuple[str, ...] | None = None
    python_optimize: int | None = None
    optional_imports: dict[str, str] | None = None
    tokenizer: TokenizerState | None = None
    idle_trim: IdleTrim | None = None
    # the edgectl worker's own report (GET /edgectl/effective)
    phase: str | None = None
    ready_s: float | None = None
    load_peak: dict[str, int] | None = None  # {} until the first sample
    warmup: dict[str, str | None] | None = None  # {"answer", "suspect"}
    plan_kv_cache_bytes: int | None = None
    audio_seconds: float | None = None  # audio transcribed since the start (None: no audio routes)
    transcriptions: int | None = None  # the requests that transcribed (or translated) it, answered 200
    images_served: int | None = None  # images that passed the image guard, answered 2xx (None: not a vision plan)
    image_requests: int | None = None  # the chat completions that carried them
    # what the bench reads from other servers: llama.cpp's /props, vLLM's /metrics
    model_path: str | None = None
    build_info: str | None = None
    cache_config_info: dict[str, str | None] | None = None
    unverified: tuple[str, ...] | None = None  # what the bench could not read back, and why
    # the fields the read-back held (not a JSON field: set by read())
    reported: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    @classmethod
    def read(cls, data: Any) -> tuple[Effective | None, list[str]]:
        """A read-back from its JSON, strictly: (it or None, every problem as ``effective.field: problem``)."""
        got, problems = codec.read(cls, data, "effective")
        if not isinstance(got, Effective):
            return None, problems
        object.__setattr__(got, "reported", frozenset(data))
        return got, problems

    @classmethod
    def from_dict(cls, data: Any) -> Effective:
        """:meth:`read`, or EdgectlError naming every bad field."""
        got, problems = cls.read(data)
        if got is None:
            raise EdgectlError(f"the engine's read-back does not fit {SCHEMA}: {problems[0]}",
                               details=problems[1:])
        return got


def is_int4(fmt: str | None) -> bool:
    """Whether a read-back layer format is 4-bit (edgectl's cpu_int4, or a w4a* kernel)."""
    return fmt is not None and fmt.startswith(("cpu_int4", "w4a"))


def head_family(fmt: str | None) -> str:
    """A read-back head format as the plan names it: int4, int8 (edgectl's W8) or dense."""
    if is_int4(fmt):
        return "int4"
    return "int8" if fmt and fmt.startswith("w8a8") else "dense"


def mismatches(plan: Plan, effective: Effective | Mapping[str, Any]) -> list[str]:
    """Every way the running engine differs from the plan; empty when the plan took effect.

    ``effective`` is the read-back, or its JSON (read strictly: a read-back that does not fit the
    schema is itself the difference, one line per bad field).
    """
    if not isinstance(effective, Effective):
        got, problems = Effective.read(effective)
        if got is None:
            return problems
        effective = got
    out: list[str] = []

    def differ(what: str, planned: Any, got: Any) -> None:
        if got != planned:
            out.append(f"{what} is {got!r}, the plan says {planned!r}")

    differ("max_model_len", plan.max_model_len, effective.max_model_len)
    differ("max_num_seqs", plan.max_num_seqs, effective.max_num_seqs)
    differ("KV cache bytes", plan.kv_cache_bytes, effective.kv_cache_bytes)
    differ("threads", plan.threads, effective.threads)
    if effective.thread_wait is not None:  # reported by workers since the lever exists
        differ("the OpenMP threads' wait", str(plan.levers.thread_wait), effective.thread_wait)
    if plan.speech is None:  # Whisper's positions are learned tables, not RoPE
        out += _rope_rows(plan, effective)
    elif effective.speech_head is not None:  # reported by workers since the int8 scan exists
        differ("the speech head", plan.speech.head, effective.speech_head)
    out += _linear_formats(plan, effective)
    if (plan.model.checkpoint_format == "gguf" and "load_format" in effective.reported
            and effective.load_format != GGUF_LOAD_FORMAT):
        out.append(f"the model was loaded with {effective.load_format!r}, a GGUF is served by {GGUF_LOAD_FORMAT!r}")
    out += _processes(plan, effective)
    out += _kv_dtype(plan, effective)
    if plan.vision is not None and effective.tower_tiles is not None:  # reported by workers since the lever exists
        differ("the tiles the vision tower encodes at once (0: all)", plan.vision.tower_tiles,
               effective.tower_tiles.get("tiles"))
    if effective.decode_attention is not None:  # reported by workers since the lever exists
        differ("the decode attention's kernel", "edgectl" if plan.levers.decode_attention else "vllm",
               effective.decode_attention.get("kernel"))
    if effective.lean_attention is not None:  # reported by workers since the lever exists
        differ("the path of the attention's calls into vLLM's ops", "lean" if plan.levers.lean_attention else "vllm",
               effective.lean_attention.get("path"))
    if effective.compile and "wrapper" in effective.compile:  # a compiled graph, reported since the lever exists
        differ("the compiled graph's wrapper", "cpp" if plan.levers.cpp_wrapper else "python",
               effective.compile["wrapper"])
    out += _memory_levers(plan, effective)
    return out


def _rope_rows(plan: Plan, effective: Effective) -> list[str]:
    rope = effective.rope_rows
    if not rope:
        return ["RoPE table rows could not be read back"]
    wrong = {k: v for k, v in rope.items() if v != plan.rope_rows}
    if wrong:
        name, rows = next(iter(wrong.items()))
        return [f"RoPE table {name} has {rows} rows, the plan says {plan.rope_rows}"]
    return []


def _linear_formats(plan: Plan, effective: Effective) -> list[str]:
    """The linear layers' formats: 4-bit where the plan quantizes, in its groups; the output head's
    format; edgectl's kernel library loaded where the plan runs on it."""
    formats = effective.linear_formats
    if not formats:
        return ["linear layer formats could not be read back"]
    out: list[str] = []
    if plan.vision is not None and plan.weight_format != "bf16":
        formats, tower = _language_model_part(formats, effective)
        out += tower
    int4 = [n for n, f in formats.items() if is_int4(f)]
    if not plan.weight_format.is_int4:
        if int4:
            out.append(f"{len(int4)} linear layers are 4-bit, the plan says bf16 (e.g. {int4[0]})")
    elif plan.weight_format == "w8a8":
        not_w8 = sorted(n for n, f in formats.items() if n != "lm_head" and not f.startswith("w8a8"))
        if not_w8:
            out.append(f"{len(not_w8)} linear layers are not edgectl's W8 although the plan says w8a8 "
                       f"(e.g. {not_w8[0]}: {formats[not_w8[0]]})")
    else:
        out += _int4_body(plan, formats, int4, effective)
    head = effective.lm_head_format if "lm_head_format" in effective.reported else formats.get("lm_head")
    if head_family(head) != plan.lm_head_format:
        planned = "keeps it unquantized" if plan.lm_head_format == "dense" else f"has it {plan.lm_head_format}"
        out.append(f"the output head is {head}, the plan {planned}")
    if ((plan.weight_format in ("w4a8", "w8a8") or plan.lm_head_format == "int8")
            and "kernel_isa" in effective.reported and not effective.kernel_isa):
        out.append(f"edgectl's kernel library is not loaded, the plan's {plan.weight_format} runs on it")
    return out


def _language_model_part(formats: dict[str, str], effective: Effective) -> tuple[dict[str, str], list[str]]:
    """A vision-language plan quantizes its language model only: the layers under the parts the runtime
    kept dense (vLLM's map of the model: the tower and the connector) must be dense; the rest is checked
    as a text plan's layers."""
    parts = (effective.quantization_readback or {}).get("dense_parts")
    if not parts:
        return formats, ["the runtime did not say which parts of the vision-language model it kept dense"]

    def in_tower(name: str) -> bool:
        return any(name == part or name.startswith(part + ".") for part in parts)

    tower = {n: f for n, f in formats.items() if in_tower(n)}
    quantized = sorted(n for n, f in tower.items() if is_int4(f) or f.startswith("w8a8"))
    out = [f"{len(quantized)} layers of the vision tower or connector are quantized, the plan keeps them bf16 "
           f"(e.g. {quantized[0]}: {tower[quantized[0]]})"] if quantized else []
    if not tower:
        out.append(f"no linear layer was read back under {', '.join(parts)}, the parts the runtime kept dense")
    return {n: f for n, f in formats.items() if not in_tower(n)}, out


def _int4_body(plan: Plan, formats: Mapping[str, str], int4: list[str], effective: Effective) -> list[str]:
    """A 4-bit plan: every layer but the output head 4-bit (``int4``: those that are), in the plan's groups."""
    out: list[str] = []
    body = {n: f for n, f in formats.items() if n != "lm_head"}

    # a GGUF served as it is keeps its Q5_0 layers in edgectl's 5-bit blocks and its other 5-8-bit layers
    # in its 8-bit blocks (docs/gguf.md)
    def held(fmt: str) -> bool:
        return is_int4(fmt) or (plan.model.checkpoint_format == "gguf" and fmt.startswith(("w5a8", "w8a8")))

    not_int4 = sorted(n for n, f in body.items() if not held(f))
    if not int4:
        out.append(f"no linear layer is 4-bit, the plan says {plan.weight_format}")
    elif not_int4:
        out.append(f"{len(not_int4)} linear layers are not 4-bit although the plan quantizes them "
                   f"(e.g. {not_int4[0]}: {formats[not_int4[0]]})")
    # quantized at load by the plan's group rule (edgectl's w4a8 blocks are 32 columns whatever it says)
    if plan.model.checkpoint_format == "bf16" and plan.weight_format != "w4a8":
        out += _group_mismatches(plan, body, effective.linear_in_features)
    return out


def _processes(plan: Plan, effective: Effective) -> list[str]:
    """The processes serving: one in the single-process topology, several in vLLM's own."""
    processes = effective.processes
    out: list[str] = []
    if plan.topology == "single-process" and processes != 1:
        out.append(f"{processes} processes serve, the plan's single-process topology has 1")
    if plan.topology == "stock" and not (processes is not None and processes > 1):
        out.append(f"{processes} process(es) serve, vLLM's own topology has an API server and an engine")
    return out


# The KV tensors' element type per KV cache dtype (vLLM's CPU backend keeps fp8 KV as uint8).
KV_TENSOR_DTYPE = {"auto": "bfloat16", "fp8_e4m3": "uint8", "int8": "uint8"}  # int8: vLLM's one-byte allocation


def _kv_dtype(plan: Plan, effective: Effective) -> list[str]:
    want = str(plan.kv_cache_dtype)
    layers = effective.kv_cache_dtype
    tensors = effective.kv_tensor_dtypes
    if not layers or not tensors:
        return ["the KV cache dtype could not be read back"]
    out = []
    if set(layers) != {want}:
        out.append(f"the attention layers' KV cache dtype is {', '.join(sorted(layers))}, the plan says {want}")
    # "auto" is the model's dtype: bf16 for every text plan, a speech plan's own dtype
    tensor = plan.dtype if want == "auto" and plan.speech is not None else KV_TENSOR_DTYPE[want]
    if set(tensors) != {tensor}:
        out.append(f"the KV tensors are {', '.join(sorted(tensors))}, the plan's {want} KV is {tensor}")
    return out


def _memory_levers(plan: Plan, effective: Effective) -> list[str]:
    out = []
    optimize = effective.python_optimize
    if optimize != plan.levers.python_optimize:
        out.append(f"Python's optimization level is {optimize!r}, the plan says {plan.levers.python_optimize}")
    out += _optional_imports(plan, effective.optional_imports)
    out += _tokenizer(plan, effective.tokenizer)
    trim = effective.idle_trim
    if trim is None:
        out.append("the idle trim's state could not be read back")
    elif trim.enabled != plan.levers.idle_trim:
        out.append(f"the idle trim is {'on' if trim.enabled else 'off'}, the plan's idle_trim is "
                   f"{'on' if plan.levers.idle_trim else 'off'}")
    elif plan.levers.idle_trim and not trim.available:
        out.append("the idle trim is on but this C library has no malloc_trim (glibc's)")
    out += _embedding_pack(plan, effective.embedding_pack)
    return out


def _optional_imports(plan: Plan, imports: Mapping[str, str] | None) -> list[str]:
    if not imports:
        return ["the optional imports could not be read back"]
    skip = str(plan.levers.optional_imports) == "skip"
    wrong = sorted(n for n, state in imports.items() if state == ("loaded" if skip else "kept out"))
    if wrong:
        return [f"{', '.join(wrong)} {'loaded' if skip else 'kept out'}, the plan says "
                f"{plan.levers.optional_imports}"]
    return []


def _tokenizer(plan: Plan, tokenizer: TokenizerState | None) -> list[str]:
    if tokenizer is None:
        return ["the tokenizer's state could not be read back"]
    out = []
    lean = str(plan.levers.tokenizer) == "lean"
    if tokenizer.lean != lean:
        out.append(f"the tokenizer is {'lean' if tokenizer.lean else 'as vLLM holds it'}, the plan's "
                   f"tokenizer is {plan.levers.tokenizer}")
    inputs = tokenizer.construction_inputs or ConstructionInputs()
    releasable = sorted(set(inputs.held) - set(inputs.read_after_init))
    if lean and releasable:
        out.append(f"the tokenizer still holds {', '.join(releasable)}, the plan's tokenizer is lean")
    return out


def _embedding_pack(plan: Plan, packs: Mapping[str, EmbeddingPackState] | None) -> list[str]:
    if packs is None:
        return ["the embedding tables' packed copies could not be read back"]
    # empty when no embedding is dense (an int4 tied head)
    mode = str(plan.levers.embedding_pack)
    # a table the plan leaves to vLLM is packed where the CPU has a packed GEMM, and only there
    kept = ("packed", "no packed kernel")

    def left_to_vllm(lm_head: bool) -> bool:
        return mode == "vllm" or (mode == "lm-head" and lm_head)

    wrong = sorted(n for n, layer in packs.items() if (layer.state in kept) != left_to_vllm(layer.lm_head))
    if wrong:
        return [f"embedding table(s) {', '.join(wrong)}: {packs[wrong[0]].state}, the plan's "
                f"embedding_pack is {plan.levers.embedding_pack}"]
    return []


def _group_mismatches(plan: Plan, formats: Mapping[str, str], in_features: Mapping[str, int] | None) -> list[str]:
    """Each int4 layer's group against the one the plan's rule gives its input width
    (``int4_layout.choose_group_size``: the plan's group where it divides K, else the nearest)."""
    if in_features is None:
        return ["the int4 layers' input widths could not be read back (their group sizes cannot be checked)"]
    wrong = []
    for name, fmt in formats.items():
        group, k = group_size_of(fmt), in_features.get(name)
        if group is None:
            continue
        expected = int4_layout.choose_group_size(k, plan.group_size) if k is not None else None
        if group != expected:
            wrong.append(f"{name} uses groups of {group}, the plan's group size {plan.group_size} gives {expected}")
    return [f"{len(wrong)} int4 layer(s) differ in group size (e.g. {wrong[0]})"] if wrong else []


def group_size_of(fmt: str | None) -> int | None:
    """The int4 group of a read-back layer format (``cpu_int4/g32`` → 32; a tied copy → None)."""
    if not fmt or not is_int4(fmt) or "tied" in fmt:
        return None
    match = re.search(r"/g(\d+)", fmt)
    return int(match.group(1)) if match else None
