"""How vLLM's engine runs: its process topology, its execution mode, and edgectl's levers.

Each lever is on or off by edgectl's default (with the measurement behind it, docs/facts.md)
unless asked; the bench switches them one at a time (``edgectl/bench/arms.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgectl.contract.decode_attention import shape_refused
from edgectl.contract.plan import (
    BenchLevers,
    Compilation,
    EmbeddingPack,
    Levers,
    OptionalImports,
    Reason,
    Request,
    Source,
    ThreadWait,
    TokenizerLever,
    Topology,
    WeightFormat,
)
from edgectl.models.facts import SLIDING_ATTENTION
from edgectl.planner.decided import Decided
from edgectl.planner.formats import kernels_run
from edgectl.planner.ledger import MAX_BATCHED_TOKENS, batched_tokens

if TYPE_CHECKING:
    from edgectl.models.facts import ModelFacts
    from edgectl.probe.facts import HostFacts
    from edgectl.profiles import Profile


def choose_topology(asked: BenchLevers) -> Decided[Topology]:
    if asked.topology:
        topology = Topology(asked.topology)
        source = Source.FLAG
    else:
        topology, source = Topology.SINGLE_PROCESS, Source.DEFAULT
    detail = ("API server, engine core and model worker in one process: each process that imports torch and "
              "vLLM costs ~0.5 GB (docs/facts.md)" if topology is Topology.SINGLE_PROCESS
              else "vLLM's own process layout")
    return Decided(topology, Reason("topology", topology, source, detail))


def choose_compilation(request: Request, profile: Profile) -> Decided[Compilation]:
    """Eager or vLLM's compiled mode: asked, else from the profile's figures for both modes.

    With both measured (``compiled`` beside the eager figures of the same weight format),
    compiled mode is chosen when every compiled pass decoded faster than every eager pass (the
    medians when a figure has no spread). Its cold start (the compile) is paid once, at deploy;
    the bench records a warm start only when it loaded the saved graph, so a recorded
    ``ready_warm_s`` is what every later start costs.
    """
    measured_in = profile.compilation or Compilation.EAGER  # the mode the profile's format figures are for
    compared = _compare_modes(profile)
    compiled_fmt = profile.compiled.weight_format if profile.compiled is not None else None
    asked_other = (compared is not None and request.weight_format is not None
                   and request.weight_format != compiled_fmt)
    if request.compilation:
        mode, source = Compilation(request.compilation), Source.FLAG
        detail = "asked with --compilation" + (f" ({compared[1]})" if compared else "")
    elif asked_other:
        # compiled mode was measured for one format only; another one asked for runs as measured
        mode, source = measured_in, Source.FLAG
        detail = (f"{measured_in}: --format {request.weight_format} was measured in {measured_in} mode only "
                  f"on {profile.name} (compiled mode was measured for {compiled_fmt})")
    elif compared is not None:
        faster, evidence = compared
        mode, source = (Compilation.DEFAULT if faster else Compilation.EAGER), profile.reason_source
        detail = (("compiled: it decodes faster on this device class: " if faster else
                   "eager: compiled mode does not decode faster beyond the spread on this device class: ") + evidence)
    elif profile.compilation is not None:
        mode, source = profile.compilation, profile.reason_source
        detail = _plain_detail(mode)
    else:
        mode, source = Compilation.EAGER, Source.DEFAULT
        detail = _plain_detail(mode)
    if (compared is None or asked_other) and mode != measured_in:
        detail += (f"; the profile's figures were measured in {measured_in} mode, so the memory "
                   "and speed predictions are for that mode")
    return Decided(mode, Reason("compilation", mode, source, detail))


def _plain_detail(mode: Compilation) -> str:
    return ("eager: no torch.compile start-up cost (vLLM's default mode took 260 s to start on 2 cores, "
            "eager 56 s: docs/facts.md)" if mode is Compilation.EAGER
            else "vLLM's default CPU compilation (DYNAMO_TRACE_ONCE + inductor)")


def _compare_modes(profile: Profile) -> tuple[bool, str] | None:
    """(compiled decodes faster, the evidence) when the profile measured both modes, else None."""
    compiled = profile.compiled
    if profile.compilation not in (None, Compilation.EAGER) or compiled is None:
        return None
    eager = profile.formats.get(compiled.weight_format)
    if compiled.decode_tok_s is None or compiled.ready_warm_s is None or eager is None or eager.decode_tok_s is None:
        return None
    c, e = compiled.decode_tok_s, eager.decode_tok_s
    lo = c.min if c.min is not None else c.median
    hi = e.max if e.max is not None else e.median
    evidence = (f"{compiled.weight_format} decodes at {c.describe('tok/s')} compiled vs {e.describe('tok/s')} eager; "
                + (f"the first start compiles ({compiled.ready_cold_s.describe('s')} to ready), " if compiled.ready_cold_s
                   else "")
                + f"later starts load the saved graph ({compiled.ready_warm_s.describe('s')} to ready)")
    return lo > hi, evidence


@dataclass(frozen=True)
class LeverChoice:
    rope_cap: bool  # the RoPE table has max_model_len rows (its reason: rope_rows)
    layerwise_repack: bool  # int4 layers are packed as their checkpoint shards arrive


def choose_levers(asked: BenchLevers) -> Decided[LeverChoice]:
    """The levers, on or off; their reasons matter only when the weights are int4 (the plan takes
    them then). The RoPE cap's reason is the table's rows (``rope_rows``); the output head's
    depends on the weight format (:func:`choose_lm_head`)."""
    levers = LeverChoice(
        rope_cap=True if asked.rope_cap is None else asked.rope_cap,
        layerwise_repack=True if asked.layerwise_repack is None else asked.layerwise_repack,
    )
    return Decided(
        levers,
        Reason("layerwise_repack", levers.layerwise_repack,
               Source.FLAG if asked.layerwise_repack is not None else Source.DEFAULT,
               "asked" if asked.layerwise_repack is not None else
               "each layer is packed as soon as its checkpoint shard arrives: no dense copy of the model is "
               "ever resident (load peak 0.96 GB instead of 1.08 GB, docs/facts.md)"),
    )


def lm_head_quantized(fmt: WeightFormat, asked: bool | None) -> bool:
    """Whether the output head is quantized next to ``fmt``'s layers: as asked, else edgectl's int8
    head with its own kernels (w4a8), and the model dtype otherwise."""
    return asked if asked is not None else fmt is WeightFormat.W4A8


def choose_lm_head(asked: BenchLevers, fmt: WeightFormat) -> Decided[bool]:
    quantized = lm_head_quantized(fmt, asked.quantize_lm_head)
    bits = "int8 (edgectl's blocks)" if fmt is WeightFormat.W4A8 else "int4"
    if asked.quantize_lm_head is not None:
        detail = f"asked: the output head {bits}" if quantized else "asked: the output head in the model dtype"
        return Decided(quantized, Reason("quantize_lm_head", quantized, Source.FLAG, detail))
    if fmt is WeightFormat.W4A8:
        detail = LM_HEAD_INT8_EVIDENCE
    else:
        detail = ("the output head stays bf16: with it in int4 the service held 0.80 GB instead of 0.99 GB, but "
                  "its top-1 agreement with bf16 fell to 0.855, below the 0.90 fidelity bar (docs/facts.md)")
    return Decided(quantized, Reason("quantize_lm_head", quantized, Source.DEFAULT, detail))


# Why w4a8 plans quantize the output head to int8 (measured, docs/kernels.md "Engine decode").
LM_HEAD_INT8_EVIDENCE = ("the output head in edgectl's int8 blocks: SmolLM2-135M decoded 50.6 tok/s with it and "
                         "35.3 with a bf16 head on x86_64-amx, 32.7 and 24.3 on the AVX2 path (medians of 3 "
                         "interleaved passes, docs/kernels.md \"Engine decode\")")


# Why the worker holds its tokenizer lean (measured, docs/memory.md "A large vocabulary").
TOKENIZER_LEAN_EVIDENCE = ("one tokenizer load, not two (vLLM loads it again at the first chat render to look "
                           "for a processor the model directory does not have), and without the vocabulary and "
                           "merges transformers keeps as Python objects after building the Rust tokenizer: "
                           "Gemma-3-270M 1.36 GB steady against 1.82 GB, SmolLM2-135M 0.85 against 0.87 GB, decode "
                           "within the spread; SmolLM2's prefill median 3-8% lower in three runs whose ranges overlap, "
                           "unexplained (x86_64-avx512-bf16, 3 interleaved passes each, docs/memory.md \"A large "
                           "vocabulary\")")


@dataclass(frozen=True)
class MemoryLevers:
    embedding_pack: EmbeddingPack
    optional_imports: OptionalImports
    python_optimize: int
    tokenizer: TokenizerLever = TokenizerLever.LEAN
    idle_trim: bool = True
    huge_pages: bool = False
    decode_attention: bool = False
    lean_attention: bool = False
    cpp_wrapper: bool = False

    def levers(self, *, rope_cap: bool, layerwise_repack: bool, topology: Topology,
               reserve_frontend_core: bool, thread_wait: ThreadWait) -> Levers:
        """The plan's levers: these memory levers with the engine's own (every planner writes them so)."""
        return Levers(rope_cap=rope_cap, kv_exact=True, layerwise_repack=layerwise_repack, topology=topology,
                      reserve_frontend_core=reserve_frontend_core, embedding_pack=self.embedding_pack,
                      optional_imports=self.optional_imports, python_optimize=self.python_optimize,
                      tokenizer=self.tokenizer, idle_trim=self.idle_trim, thread_wait=thread_wait,
                      huge_pages=self.huge_pages, decode_attention=self.decode_attention,
                      lean_attention=self.lean_attention, cpp_wrapper=self.cpp_wrapper)


# Why the worker gives freed heap memory back when it goes quiet (measured, docs/memory.md "Freed but resident").
IDLE_TRIM_EVIDENCE = ("freed heap memory goes back to the kernel once no request has run for 1 s (glibc keeps what a "
                      "request frees resident inside its arenas otherwise: prompt_logprobs responses left up to "
                      "98 MiB): SmolLM2-135M 0.87 GB steady after the bench's requests against 0.96 GB without it, "
                      "decode within the spread (x86_64-avx512-bf16, 3 interleaved passes, docs/memory.md \"Freed "
                      "but resident\")")


# Why PyTorch's allocations are not put on transparent huge pages by default (the bench's huge-pages arm).
HUGE_PAGES_EVIDENCE = ("off: with the weights and the KV on transparent huge pages decode did not change beyond the "
                       "host's noise, SmolLM2-135M 140.2 against 121.6 tok/s (pass by pass +3%, -17%, +30%) and the "
                       "1B-class shape 41.2 against 42.8 (already at ~91% of the copy bandwidth), at the same PSS "
                       "(x86_64-avx512-bf16, 3 interleaved passes each, docs/kernels.md \"Huge pages\"); the bench's "
                       "huge-pages arm measures it on other boxes")


# Why a compiled graph keeps inductor's Python wrapper by default (the bench's cpp-wrapper arm).
CPP_WRAPPER_EVIDENCE = ("off: inductor's C++ wrapper (the code that calls a step's kernels and ops, in C++ instead of "
                        "Python) decoded SmolLM2-135M at 117.8 tok/s against 150.4 on the Python one, prefill 2085 "
                        "against 2519 (x86_64-avx512-bf16, 3 interleaved passes, both arms quiet), and by hand within "
                        "+7%: the Python it removes is a small part of a step (docs/kernels.md \"The graph's wrapper "
                        "in C++\"); `edgectl bench --arms planned,cpp-wrapper` measures it on other boxes")


def cpp_wrapper_default(profile: Profile, compilation: Compilation) -> tuple[bool, str]:
    """Whether a compiled plan's graph keeps inductor's Python wrapper or has it in C++, and why: on where
    this class's profile measured the C++ wrapper decoding faster than the Python one in one run, beyond the
    Python wrapper's own range (``compiled.cpp_wrapper``); off where it measured otherwise, off (with the
    other class's evidence) where it was not measured, and nothing to choose in eager mode."""
    if compilation is not Compilation.DEFAULT:
        return False, "off: eager mode has no compiled graph to wrap"
    figures = profile.compiled.cpp_wrapper if profile.compiled is not None else None
    if figures is None:
        return False, f"not measured on {profile.name}; {CPP_WRAPPER_EVIDENCE}"
    ours, control = figures.decode_tok_s, figures.control_decode_tok_s
    measured = (f"inductor's C++ wrapper (the code that calls a step's kernels and ops, in C++ instead of Python) "
                f"decoded at {ours.describe('tok/s')} against {control.describe('tok/s')} on the Python wrapper, "
                f"interleaved in one run on {profile.name}")
    if ours.median <= (control.max if control.max is not None else control.median):
        return False, (f"off: {measured}: not above the Python wrapper's range (docs/kernels.md \"The graph's "
                       f"wrapper in C++\")")
    cost = "".join([
        f"; its first start compiles longer ({figures.ready_cold_s.describe('s')} to ready)"
        if figures.ready_cold_s else "",
        f" and peaks at {figures.cold_peak_ratio.describe('x')} the steady PSS while g++ builds it (the start "
        "timeout and the memory limit use these)" if figures.cold_peak_ratio else ""])
    return True, (f"on: {measured}{cost} (docs/kernels.md \"The graph's wrapper in C++\"); `edgectl bench --arms "
                  "planned,python-wrapper` measures the other way")


def choose_graph_wrapper(profile: Profile, compilation: Compilation,
                         asked: bool | None) -> tuple[Profile, tuple[bool, str]]:
    """The profile a plan is sized, timed and predicted by under the wrapper it will have (asked, else
    :func:`cpp_wrapper_default`), and that default with its evidence for ``choose_memory_levers``."""
    default = cpp_wrapper_default(profile, compilation)
    on = default[0] if asked is None else asked
    return (with_cpp_wrapper(profile) if on else profile), default


def with_cpp_wrapper(profile: Profile) -> Profile:
    """The profile a plan with the C++ wrapper is sized and timed by: its compiled figures with the C++
    wrapper's decode, first start and compile-time peak where the profile measured them."""
    compiled = profile.compiled
    if compiled is None or compiled.cpp_wrapper is None:
        return profile
    figures = compiled.cpp_wrapper
    return dataclasses.replace(profile, compiled=dataclasses.replace(
        compiled, decode_tok_s=figures.decode_tok_s,
        ready_cold_s=figures.ready_cold_s or compiled.ready_cold_s,
        cold_peak_ratio=figures.cold_peak_ratio or compiled.cold_peak_ratio))


# Whether a decoder layer's calls reach vLLM's attention ops with less Python
# (runtime/edgectl_runtime/vllm_plugin/lean_attention.py: the same ops, the same arguments).
LEAN_ATTENTION_TEXT = (
    "on: a decoder layer's KV write and attention call vLLM's same two C++ ops with the same arguments, without "
    "the cache views, slices and keyword wrappers of its methods at every call: SmolLM2-135M decoded at 250.1 "
    "[247.9-250.8] tok/s against 228.9 [221.1-234.7] through vLLM's methods, 8 streams 1158.0 against 1090.9, "
    "held to AVX2 (emulated) 236.5 against 218.1 (x86_64-amx, 3 interleaved passes each, every arm quiet, the same "
    "greedy text in 24 pairs by hand; docs/kernels.md \"On x86_64-amx the C++ wrapper pays, and the planner decides "
    "it from the profile\"); `edgectl bench --arms planned,vllm-attention-calls` measures it")
LEAN_ATTENTION_VISION = (
    "on: the language model's calls into vLLM's attention ops the lean way (the same ops, the same arguments): "
    "synth-smolvlm-256m decoded with an image in context at 165.4 [159.1-170.3] tok/s against 153.0 [148.4-154.6] "
    "through vLLM's methods, text-only 186.3 against 171.6, the time to the first token unchanged (x86_64-amx, "
    "3 interleaved passes, both arms quiet; docs/vision.md \"The lean path into vLLM's attention ops\"); "
    "`edgectl bench --arms planned,vllm-attention-calls` measures it")
LEAN_ATTENTION_NOT_MEASURED = (
    "off until measured in this modality's engine: the lean path into vLLM's attention ops is measured on text "
    "models (docs/kernels.md \"On x86_64-amx the C++ wrapper pays, and the planner decides it from the profile\"); "
    "`edgectl bench --arms planned,lean-attention` measures it here")


# Whether decode steps attend with edgectl's kernel (runtime/edgectl_runtime/vllm_plugin/decode_attention.py).
DECODE_ATTENTION_VISION = (
    "on: with an image's ~1150 tokens in context a decode step's attention is most of what the image costs; "
    "edgectl's kernel over vLLM's bf16 KV took 0.90-1.06 ms a token for 30 layers of this shape where vLLM's op "
    "took 1.61-1.90 ms (the two ops interleaved, the KV from memory as in a step, x86_64-avx512-bf16; tested "
    "against vLLM's op on caches vLLM wrote); in the engine one run so far, within the host's noise: decode with "
    "the image 64.2 against 57.0 tok/s, 0.89x against 0.91x text-only (docs/vision.md \"An attention of "
    "edgectl's\"); `edgectl bench --arms planned,vllm-attention` measures it")
DECODE_ATTENTION_VISION_AMX = (
    "off on AMX hosts: vLLM's AMX attention read the image's KV about as fast as edgectl's kernel does (with "
    "the lever on, vLLM writes the KV in its \"vec\" layout for it): decode with the image 81.5 [67.4-92.4] "
    "tok/s on edgectl's against 87.5 [84.2-88.3] on vLLM's AMX attention, 0.74x against 0.79x text-only "
    "(synth-smolvlm-256m, w8a8 compiled, x86_64-amx, 3 interleaved passes, both arms noisy by the gate; "
    "docs/vision.md \"Decode attention on AMX hosts\"); `edgectl bench --arms planned,edgectl-attention` "
    "measures it")
DECODE_ATTENTION_TEXT_AMX = (
    "off on AMX hosts: vLLM packs the KV for its AMX attention here (vllm/v1/attention/backends/"
    "cpu_attn.py _get_attn_isa) and edgectl's kernel reads only the \"vec\" layout, so with the "
    "lever vLLM writes that layout and prefills on its vec kernel; measured, it did not pay: "
    "SmolLM2-135M decode at a 2048-token context 88.0 [75.0-110.0] tok/s against 101.1 "
    "[82.2-101.7] on vLLM's AMX attention, prefill 2896 against 3404 (x86_64-amx, 3 interleaved "
    "passes, the lever's arm noisy by the gate; docs/kernels.md \"Decode attention\"); "
    "`edgectl bench --arms planned,edgectl-attention` measures it")
DECODE_ATTENTION_NOT_MEASURED = (
    "off until measured in this modality's engine: edgectl's decode attention is measured on text and vision-"
    "language models (docs/kernels.md \"Decode attention\", docs/vision.md \"An attention of edgectl's\"); "
    "`edgectl bench --arms planned,edgectl-attention` measures it here")
DECODE_ATTENTION_TEXT = (
    "on: decode at a 2048-token context faster with edgectl's kernel than with vLLM's op in every measurement "
    "(SmolLM2-135M, x86_64-avx512-bf16: 124.5 against 100.9 tok/s, both arms quiet, and 101.5 against 96.6 in two "
    "bench runs; by hand 1.04-1.34x in each of 8 interleaved pairs; the 1B shape 37.1 against 36.6); after a short "
    "prompt within the host's noise (1.01x, 0.87x, 1.05x by hand; the 1B shape 1.03x) (docs/kernels.md "
    "\"Decode attention\"); `edgectl bench --arms planned,vllm-attention` measures it")


def text_decode_attention(facts: HostFacts, model: ModelFacts) -> tuple[bool, str]:
    """A text plan's default for edgectl's decode attention and why (:func:`_decode_attention_default`)."""
    return _decode_attention_default(facts, model, DECODE_ATTENTION_TEXT, DECODE_ATTENTION_TEXT_AMX)


def vision_decode_attention(facts: HostFacts, model: ModelFacts) -> tuple[bool, str]:
    """A vision-language plan's default for edgectl's decode attention and why."""
    return _decode_attention_default(facts, model, DECODE_ATTENTION_VISION, DECODE_ATTENTION_VISION_AMX)


def _decode_attention_default(facts: HostFacts, model: ModelFacts, on: str, amx: str) -> tuple[bool, str]:
    """On where edgectl's kernels run (x86 with AVX2 + FMA) and take the model's decoder layers, with the
    modality's evidence ``on``; off where they do not run, off for a model none of whose layers the kernel
    takes (its calls would all stay on vLLM's op: the lever would be on in name only), and off on AMX
    hosts, where vLLM's AMX attention was measured as fast or faster (``amx``)."""
    runs, why = kernels_run(facts)
    if not runs:
        return False, f"off: {why}"
    refused = decode_attention_refused(model)
    if refused:
        return False, f"off: {refused}"
    if facts.cpu.isa.amx_tile:
        return False, amx
    return True, on


def decode_attention_refused(model: ModelFacts) -> str | None:
    """Why edgectl's decode attention would take none of the model's decode calls, None when it takes some:
    the kernel's shapes (``contract/decode_attention.py``, what the worker's plugin checks per layer), and
    a window on every layer (the kernel reads the whole context; a model with some full-attention layers
    has those taken)."""
    refused = shape_refused(model.num_attention_heads, model.num_kv_heads, model.head_dim)
    if refused:
        return f"{model.name}: {refused}"
    if model.layer_types and all(t == SLIDING_ATTENTION for t in model.layer_types):
        return (f"every layer of {model.name} attends over a sliding window of {model.sliding_window} tokens, "
                "which edgectl's decode attention does not take")
    return None


def vllm_packs_embeddings(facts: HostFacts) -> bool | None:
    """Whether vLLM 0.32 makes a prepacked GEMM copy of a dense embedding table on this host
    (``dispatch_cpu_unquantized_gemm``, vllm/model_executor/layers/utils.py:470-608): sgl-kernel
    with AMX tiles, oneDNN where it builds a bf16 matmul, from AVX-512 (core) up; on x86 below
    AVX-512 oneDNN refuses ("Failed to create oneDNN linear") and the layer falls back to an
    unpacked F.linear, so no copy exists (the worker reads back "no packed kernel"). None: not
    known for this architecture (nobody measured it)."""
    isa, arch = facts.cpu.isa, facts.cpu.arch
    if arch == "x86_64":
        return bool(isa.amx_tile or isa.avx512)
    return None


def _embedding_pack_detail(facts: HostFacts) -> str:
    measured = ("−55 MiB anonymous for SmolLM2 (816 vs 871 MiB) on x86_64-amx, decode and prefill within the "
                "spread (docs/memory.md)")
    packs = vllm_packs_embeddings(facts)
    if packs:
        return ("only the LM head keeps vLLM's prepacked copy of a dense embedding table: vLLM packs a tied table "
                f"twice, and the input embedding only does lookups; {measured}")
    if packs is False:
        return ("saves nothing on this host: without AVX-512 or AMX vLLM makes no prepacked copy of an embedding "
                "table (oneDNN builds no bf16 matmul here: vllm/model_executor/layers/utils.py:470-608 falls back "
                "to F.linear); the same setting as on AVX-512/AMX hosts, where it saves the head's duplicate, "
                f"{measured}")
    return (f"whether vLLM prepacks embedding tables on {facts.cpu.arch or 'this architecture'} was not measured; "
            f"where it does, only the LM head keeps its copy ({measured})")


def choose_memory_levers(asked: BenchLevers, facts: HostFacts, topology: Topology = Topology.SINGLE_PROCESS,
                         *, decode_attention: tuple[bool, str] = (False, ""),
                         lean_attention: tuple[bool, str] = (False, LEAN_ATTENTION_NOT_MEASURED),
                         cpp_wrapper: tuple[bool, str] = (False, CPP_WRAPPER_EVIDENCE)) -> Decided[MemoryLevers]:
    """What the worker's runtime holds beyond the model (docs/memory.md: each measured on SmolLM2's
    default plan against the plan without it, 3 interleaved passes on x86_64-amx). The embedding
    lever's saving depends on the host: it says which (``vllm_packs_embeddings``).
    ``decode_attention``: the planner's default for that lever and its evidence (by modality:
    ``text_decode_attention``, ``vision_decode_attention``, ``DECODE_ATTENTION_NOT_MEASURED``); ``lean_attention``
    likewise (``LEAN_ATTENTION_TEXT``; off, not measured, unless given); ``cpp_wrapper`` likewise
    (:func:`cpp_wrapper_default`; off with the other class's evidence unless given)."""
    levers = MemoryLevers(
        embedding_pack=EmbeddingPack(asked.embedding_pack or EmbeddingPack.LM_HEAD),
        optional_imports=OptionalImports(asked.optional_imports or OptionalImports.SKIP),
        python_optimize=2 if asked.python_optimize is None else asked.python_optimize,
        tokenizer=TokenizerLever(asked.tokenizer or TokenizerLever.LEAN),
        # the trim runs on the in-process engine thread's idle beats (runtime/edgectl_runtime/vllm_plugin/inproc.py)
        idle_trim=(topology is Topology.SINGLE_PROCESS) if asked.idle_trim is None else asked.idle_trim,
        huge_pages=bool(asked.huge_pages),
        decode_attention=decode_attention[0] if asked.decode_attention is None else asked.decode_attention,
        lean_attention=lean_attention[0] if asked.lean_attention is None else asked.lean_attention,
        cpp_wrapper=cpp_wrapper[0] if asked.cpp_wrapper is None else asked.cpp_wrapper,
    )

    def source(value: object) -> Source:
        return Source.FLAG if value is not None else Source.DEFAULT

    return Decided(
        levers,
        Reason("embedding_pack", levers.embedding_pack, source(asked.embedding_pack),
               "asked" if asked.embedding_pack is not None else _embedding_pack_detail(facts)),
        Reason("optional_imports", levers.optional_imports, source(asked.optional_imports),
               "asked" if asked.optional_imports is not None else
               "opentelemetry, cv2 and accelerate, which vLLM and transformers treat as optional and a CPU text "
               "server never runs, are kept out: −11 MiB anonymous and −19 MiB of mapped files (docs/memory.md)"),
        Reason("python_optimize", levers.python_optimize, source(asked.python_optimize),
               "asked" if asked.python_optimize is not None else
               "the worker runs under python -OO (no docstrings, no asserts): −29 MiB anonymous, speed within the "
               "spread, with the .opt-2.pyc files scripts/setup.sh compiles (docs/memory.md)"),
        Reason("tokenizer", levers.tokenizer, source(asked.tokenizer),
               "asked" if asked.tokenizer is not None else TOKENIZER_LEAN_EVIDENCE),
        Reason("idle_trim", levers.idle_trim, source(asked.idle_trim),
               "asked" if asked.idle_trim is not None else IDLE_TRIM_EVIDENCE if levers.idle_trim else
               "off: the engine runs in vLLM's own processes, where edgectl has no idle beat to trim on"),
        Reason("huge_pages", levers.huge_pages, source(asked.huge_pages),
               "asked" if asked.huge_pages is not None else HUGE_PAGES_EVIDENCE),
        Reason("decode_attention", levers.decode_attention, source(asked.decode_attention),
               "asked" if asked.decode_attention is not None else decode_attention[1]),
        Reason("lean_attention", levers.lean_attention, source(asked.lean_attention),
               "asked" if asked.lean_attention is not None else lean_attention[1]),
        Reason("cpp_wrapper", levers.cpp_wrapper, source(asked.cpp_wrapper),
               "asked" if asked.cpp_wrapper is not None else cpp_wrapper[1]),
    )


def choose_batched_tokens(max_model_len: int) -> Decided[int]:
    """The largest engine step: prefill runs in chunks of at most MAX_BATCHED_TOKENS tokens."""
    batched = batched_tokens(max_model_len)
    detail = (f"prefill in chunks of {MAX_BATCHED_TOKENS} tokens: as fast as 2048-token chunks, 30 MB less, and "
              "each engine step (what the watchdog and other requests wait for) a quarter as long (docs/facts.md)"
              if batched == MAX_BATCHED_TOKENS else
              f"the whole context ({max_model_len} tokens) in one step: it is shorter than a {MAX_BATCHED_TOKENS}-token chunk")
    return Decided(batched, Reason("max_num_batched_tokens", batched, Source.DEFAULT, detail))
