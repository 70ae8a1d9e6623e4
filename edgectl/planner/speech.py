"""The planner for a speech-to-text model (Whisper: an encoder-decoder), in the order decided.

Shares the text planner's decisions where they are the same question (the profile, the process
topology, the CPUs and threads, the memory levers, the worker's environment) and sizes what an
encoder-decoder holds instead of a context:

    dtype                    the dense weights' dtype, from the probe (bf16 where the CPU multiplies it)
    concurrency              transcriptions decoded at once (``--max-num-seqs``)
    encoder batch            windows the encoder takes in one step (``--max-num-batched-tokens``)
    KV cache                 per transcription: the decoder's own tokens and one window's
                             cross-attention rows, in vLLM's blocks
    audio limits             the longest upload and its bytes; vLLM's own limits set the same
    memory                   weights + KV + runtime + the encoder's work and the audio buffers

The figures not measured on the profile's device class are stated fallbacks (``Source.FALLBACK``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edgectl.contract.int4_layout import BLOCK, block_packed_bytes
from edgectl.contract.plan import (
    SPEECH_HEADS,
    BenchLevers,
    Compilation,
    EmbeddingPack,
    Memory,
    ModelRef,
    Plan,
    Predicted,
    ProfileRef,
    Reason,
    Request,
    Serve,
    Source,
    SpeechServe,
    Timeouts,
    TokenizerLever,
    Topology,
    WeightFormat,
)
from edgectl.errors import EdgectlError
from edgectl.planner import ledger
from edgectl.planner.cpus import choose_cpus
from edgectl.planner.decided import Decided, Reasons
from edgectl.planner.engine import (
    DECODE_ATTENTION_NOT_MEASURED,
    MemoryLevers,
    choose_memory_levers,
    choose_topology,
)
from edgectl.planner.formats import kernels_run
from edgectl.planner.profile import choose_profile
from edgectl.planner.request import check_request
from edgectl.planner.service import (
    STOP_S,
    UNMEASURED_READY_S,
    start_for_ready,
    watchdog_for_step,
    worker_environment,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgectl.models.facts import ModelFacts, SpeechFacts
    from edgectl.probe.facts import HostFacts
    from edgectl.profiles import Figure, Profile

MiB = 1 << 20
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# What one process of vLLM's CPU server holds beside the weights and the KV cache when it serves
# Whisper (torch, vLLM, the audio libraries, the processor): a stated fallback until a profile
# measures it on its device class.
FALLBACK_SPEECH_PROCESS_BYTES = 900 * MiB
FALLBACK_SPEECH_PEAK_RATIO = 1.3
# The longest upload served unless asked: vLLM's own default (VLLM_MAX_AUDIO_DECODE_DURATION_S);
# an upload of that length decodes to 600 s × 16000 × 4 B = 38 MB of float32 samples.
DEFAULT_MAX_AUDIO_S = 600
# vLLM's own default upload limit (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB): a 600 s 16 kHz 16-bit WAV is 19.2 MB.
DEFAULT_MAX_UPLOAD_BYTES = 25 * 1000 * 1000
SAMPLE_BYTES = 4  # the decoded audio: float32 samples
# The longest step before the first measurement: one encoder window on a slow core (watchdog sizing).
UNMEASURED_SPEECH_STEP_S = 60.0


@dataclass(frozen=True)
class SpeechSizes:
    """What one transcription holds, and the engine settings that follow from the model."""

    decoder_tokens: int  # the decoder's longest output (max_target_positions): vLLM's max_model_len
    encoder_positions: int  # the encoder's output rows per window (cross-attention KV)
    blocks_per_seq: int  # KV blocks each transcription takes, in the larger of the two pools
    kv_bytes_per_block: int  # one block across every attention layer (self and cross)
    encoder_work_bytes: int  # the encoder's activations for one window (attention scores included)


def speech_sizes(speech: SpeechFacts, dtype: str) -> SpeechSizes:
    """The encoder-decoder's sizes, from its config.

    vLLM 0.32 keeps the decoder's self-attention and the cross-attention in separate KV pools of
    equal block count (one KV cache group per attention kind; ``vllm/v1/core/kv_cache_utils.py``),
    so a transcription takes ``max(ceil(448/B), ceil(1500/B))`` blocks of each: every attention
    layer's block is counted once per block of the larger pool.
    """
    size = DTYPE_BYTES[dtype]
    block = ledger.BLOCK_SIZE_TOKENS
    blocks = max(math.ceil(speech.max_target_positions / block), math.ceil(speech.max_source_positions / block))
    layers = speech.decoder_layers * 2  # each decoder layer: self-attention and cross-attention
    per_block = block * 2 * speech.d_model * size * layers  # K and V
    # The encoder over one window: its hidden states and FFN at a time (positions × (4 d + ffn)) and
    # one layer's attention scores (heads × positions², float32 softmax), the conv front-end's input
    # (mel bins × 2 × positions).
    p = speech.max_source_positions
    work = (p * (4 * speech.d_model + speech.encoder_ffn_dim) * size
            + speech.encoder_attention_heads * p * p * 4
            + speech.num_mel_bins * 2 * p * 4)
    return SpeechSizes(speech.max_target_positions, p, blocks, per_block, work)


def _weight_format(request: Request, facts: HostFacts, model: ModelFacts) -> Decided[WeightFormat]:
    """Dense unless asked: edgectl's w4a8 kernels run Whisper's linear layers (the output head stays
    dense), but cost words on this class (docs/speech.md "Weights"): not the default."""
    asked = request.weight_format
    if asked is None or asked in DTYPE_BYTES:
        return Decided(WeightFormat.BF16, Reason(
            "weight_format", "dense", Source.FLAG if asked else Source.DEFAULT,
            "dense weights in the speech dtype: edgectl's w4a8 kernels serve Whisper's linear layers too, and are "
            "measured against dense in the speech bench (docs/speech.md \"Weights\"); asked with --format w4a8"))
    if asked == WeightFormat.W4A8:
        return Decided(WeightFormat.W4A8, Reason(
            "weight_format", WeightFormat.W4A8, Source.FLAG,
            "asked: edgectl's int4 blocks of 32 with int8 activations for every linear layer but the output head "
            "(the tied embedding, kept dense)"))
    if asked == WeightFormat.W8A8:
        runs, why = kernels_run(facts)
        if not runs:
            raise EdgectlError(f"--format w8a8 runs edgectl's kernels: {why}; serve {model.name} dense (no --format)")
        return Decided(WeightFormat.W8A8, Reason(
            "weight_format", WeightFormat.W8A8, Source.FLAG,
            "asked: edgectl's int8 blocks of 32 (one scale each, GGUF Q8_0) with int8 activations for every linear "
            "layer but the output head (the tied embedding)"))
    raise EdgectlError(f"--format {asked}: a speech model is served dense ({', '.join(DTYPE_BYTES)}), as w4a8 or as "
                       "w8a8 (edgectl's kernels)")


# What bf16 costs Whisper's word error rate (docs/speech.md "Which dtype"): whisper-base on x86_64-amx, the
# shipped clip set. Logits rounded to bf16 cost words; edgectl's Whisper class recomputes each step's best
# logits in float32 (runtime/edgectl_runtime/vllm_plugin/whisper_exact_top.py), which gives back most of them.
BF16_WER_COST = ("whisper-base in bf16 with its best logits in float32 heard 17.5% of the shipped set's words wrong, "
                 "16.7% in float16 and in faster-whisper int8 on the same weights, 18.6% with bf16 logits "
                 "(docs/speech.md \"Which dtype\")")


def choose_dtype(facts: HostFacts, request: Request) -> Decided[str]:
    """bf16 where the CPU multiplies bf16 (AVX512-BF16 or AMX): the fastest here, within a point of the word
    error rate of float16 once the best logits are exact; else float16 where the CPU computes it
    (AVX512-FP16), as the checkpoint stores it; else float32, which every CPU computes."""
    asked = request.weight_format
    if asked in DTYPE_BYTES:
        return Decided(asked, Reason("speech_dtype", asked, Source.FLAG, "asked with --format"))
    lever = request.bench.speech_dtype
    if lever is not None:
        if lever not in DTYPE_BYTES or asked != WeightFormat.W8A8:
            raise EdgectlError(f"speech dtype {lever!r}: one of {', '.join(DTYPE_BYTES)}, with the w8a8 format")
        return Decided(lever, Reason("speech_dtype", lever, Source.FLAG, "asked: the activations of a w8a8 plan"))
    isa = facts.cpu.isa  # usable (enabled by the OS), not merely advertised
    if isa.avx512_bf16 or isa.amx_bf16:
        return Decided("bfloat16", Reason(
            "speech_dtype", "bfloat16", Source.PROBE,
            f"the CPU multiplies bf16 ({'AMX' if isa.amx_bf16 else 'AVX512-BF16'}): the fastest dtype here; "
            f"{BF16_WER_COST}; --format float16 or float32 for the last words"))
    if isa.avx512f and "avx512_fp16" in facts.cpu.flags:
        return Decided("float16", Reason(
            "speech_dtype", "float16", Source.PROBE,
            "the CPU computes float16 (AVX512-FP16) and not bf16: Whisper's weights as stored"))
    return Decided("float32", Reason(
        "speech_dtype", "float32", Source.PROBE,
        "no bf16 or float16 arithmetic on this CPU: float32, which every x86 and Arm CPU computes"))


# What scanning the vocabulary on an int8 copy of the table gains and costs (docs/speech.md "The head").
HEAD_SCAN_EVIDENCE = ("the head reads the tied table at every decoding step (whisper-base: 51865 x 512, 53 MB in bf16, "
                      "the largest single cost of a step); an int8 copy on edgectl's kernels reads 28 MB, and each "
                      "step's best 8 are recomputed from the table in float32, so greedy transcripts are the dense "
                      "head's (the shipped clips: the same 24 transcripts; docs/speech.md \"The head\")")


def choose_head(facts: HostFacts, request: Request, fmt: WeightFormat) -> Decided[str]:
    """The int8 scan where edgectl's kernels have a vector level for this CPU (x86 with AVX2 or more), else
    the dense head."""
    asked = request.bench.speech_head
    if asked is not None:
        if asked not in SPEECH_HEADS:
            raise EdgectlError(f"speech head {asked!r}: use one of {', '.join(SPEECH_HEADS)}")
        return Decided(asked, Reason("speech_head", asked, Source.FLAG, "asked"))
    if fmt is WeightFormat.W4A8:
        return Decided("dense", Reason("speech_head", "dense", Source.DEFAULT,
                                       "w4a8: the head stays as that format's plan keeps it"))
    if facts.cpu.arch == "x86_64" and facts.cpu.isa.avx2:
        return Decided("w8-scan", Reason("speech_head", "w8-scan", Source.PROBE,
                                         f"edgectl's int8 kernels run here (AVX2 or more): {HEAD_SCAN_EVIDENCE}"))
    return Decided("dense", Reason("speech_head", "dense", Source.PROBE,
                                   "edgectl's int8 kernels have no vector level for this CPU: the dense head"))


def _w4a8_dtype(facts: HostFacts, model: ModelFacts) -> Decided[str]:
    """edgectl's w4a8 kernels take bf16 activations: where the CPU has bf16 arithmetic."""
    if not (facts.cpu.isa.avx512_bf16 or facts.cpu.isa.amx_bf16):
        raise EdgectlError(f"--format w4a8 runs edgectl's kernels on bf16 activations, and this CPU has no bf16 "
                           f"arithmetic: serve {model.name} dense (no --format)")
    return Decided("bfloat16", Reason("speech_dtype", "bfloat16", Source.FLAG,
                                      f"w4a8 asked: its kernels take bf16 activations ({BF16_WER_COST})"))


def plan_speech(facts: HostFacts, model: ModelFacts, profiles: Sequence[Profile], request: Request) -> Plan:
    """Decide how a Whisper model is served here, and what it costs."""
    speech = model.speech
    if speech is None:
        raise EdgectlError(f"{model.name} is not a speech model")
    why = Reasons()
    profile = why.take(choose_profile(profiles, facts))
    fmt = why.take(_weight_format(request, facts, model))
    check_request(replace(request, weight_format=None))  # the rest as for a text model
    topology = why.take(choose_topology(request.bench))
    compilation = why.take(_compilation(request))
    memory_levers = why.take(_memory_levers(request.bench, facts, topology))
    cpus = why.take(choose_cpus(facts, request, profile, topology))
    dtype = why.take(_w4a8_dtype(facts, model) if fmt is WeightFormat.W4A8 else choose_dtype(facts, request))
    head = why.take(choose_head(facts, request, fmt))
    if head == "w8-scan" and request.bench.embedding_pack is None:
        memory_levers = replace(memory_levers, embedding_pack=EmbeddingPack.NONE)
        why.take(Decided(None, Reason("embedding_pack", EmbeddingPack.NONE, Source.DEFAULT,
                                      "the head is the int8 scan: vLLM's packed copy of the table would be read by "
                                      "nothing")))
    sizes = speech_sizes(speech, dtype)
    seqs = request.max_num_seqs
    why.take(_concurrency(seqs, request))
    max_audio_s, max_upload = DEFAULT_MAX_AUDIO_S, DEFAULT_MAX_UPLOAD_BYTES
    why.take(_audio_limits(max_audio_s, max_upload, speech))
    memory = why.take(_memory(model, fmt, head, memory_levers.embedding_pack, sizes, seqs, dtype, max_audio_s,
                              facts.memory.budget_bytes, profile))
    kv_per_seq = sizes.blocks_per_seq * sizes.kv_bytes_per_block
    timeouts = why.take(_timeouts(request))
    plan_levers = memory_levers.levers(rope_cap=False, layerwise_repack=False, topology=topology,
                                       reserve_frontend_core=cpus.reserve_frontend_core, thread_wait=cpus.thread_wait)
    env = worker_environment(cpus, plan_levers)
    env.update({"EDGECTL_SPEECH_HEAD": head,
                "VLLM_MAX_AUDIO_DECODE_DURATION_S": str(max_audio_s),
                "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": str(math.ceil(max_upload / (1 << 20)))})
    return Plan(
        model=ModelRef(model.name, model.path, model.architecture, "bf16" if fmt.is_int4 else "dense"),
        device_class=facts.device_class,
        profile=ProfileRef(profile.name, profile.file, profile.kind),
        weight_format=fmt,  # bf16: dense weights, their dtype the speech section's
        group_size=BLOCK if fmt.is_int4 else 0,  # the columns of edgectl's blocks
        quantize_lm_head=False,
        max_model_len=sizes.decoder_tokens,
        max_num_seqs=seqs,
        max_num_batched_tokens=sizes.encoder_positions,
        kv_bytes_per_token=sizes.kv_bytes_per_block // ledger.BLOCK_SIZE_TOKENS,
        block_size=ledger.BLOCK_SIZE_TOKENS,
        rope_rows=0,
        threads=cpus.threads,
        cpus=cpus.cpus,
        topology=topology,
        compilation=compilation,
        levers=plan_levers,
        memory=memory,
        predicted=Predicted(decode_tok_s=None, prefill_tok_s=None, ready_s=None),
        serve=Serve(request.name, request.host, request.port),
        timeouts=timeouts,
        env=env,
        reasons=why.items,
        request=request,
        speech=SpeechServe(dtype=dtype, window_s=speech.window_s, encoder_positions=sizes.encoder_positions,
                           max_audio_s=max_audio_s, max_upload_bytes=max_upload, kv_bytes_per_seq=kv_per_seq,
                           multilingual=speech.multilingual, head=head),
    )


def _compilation(request: Request) -> Decided[Compilation]:
    """Eager unless asked: the profile's compiled-mode figures are a text model's; vLLM compiles
    Whisper's decoder only (``compile_mm_encoder`` is off), and that was not measured against eager."""
    if request.compilation:
        mode = Compilation(request.compilation)
        return Decided(mode, Reason("compilation", mode, Source.FLAG, "asked with --compilation"))
    return Decided(Compilation.EAGER, Reason(
        "compilation", Compilation.EAGER, Source.DEFAULT,
        "eager: the profile's compiled-mode figures are for a text model; no compile at the first start"))


# Whether the decoder's self-attention calls vLLM's attention ops the lean way (the text plan's lever,
# engine.LEAN_ATTENTION_TEXT; docs/speech.md "The lean path into vLLM's attention ops").
LEAN_ATTENTION_SPEECH = (
    "on: the decoder's self-attention calls vLLM's same two C++ ops with the same arguments, with less Python "
    "(cross-attention and the encoder keep vLLM's methods): whisper-base's 30 s clip at RTF 0.032 [0.031-0.033] "
    "against 0.038 [0.035-0.043] through vLLM's methods, four clips at once 49.8 [47.2-51.6] against 44.8 "
    "[42.2-44.9] audio-s/s (both arms quiet); in a run an hour before, vLLM's arm noisy, 0.037 against 0.033 "
    "and 46.1 against 51.6 with the ranges overlapping; in a third, three hours after, vLLM's arm noisy and "
    "ahead by the medians (0.038 against 0.043, 43.0 against 38.4); the same transcripts of all 24 clips in all "
    "three (x86_64-avx512-bf16, 3 interleaved passes each): the runs do not separate the arms on that class, and "
    "it stays on because it computes the same with less Python; `edgectl bench --arms "
    "planned,planned-vllm-attention-calls` measures it")


def _memory_levers(asked: BenchLevers, facts: HostFacts, topology: Topology) -> Decided[MemoryLevers]:
    """The text planner's memory levers, but the tokenizer as vLLM keeps it: a Whisper model has a
    processor (the feature extractor) beside its tokenizer, which the lean lever does not handle."""
    levers = choose_memory_levers(asked, facts, topology, decode_attention=(False, DECODE_ATTENTION_NOT_MEASURED),
                                  lean_attention=(True, LEAN_ATTENTION_SPEECH))
    kept = tuple(r for r in levers.reasons if r.decision not in ("tokenizer", "python_optimize"))
    optimize = 0 if asked.python_optimize is None else asked.python_optimize
    value = replace(levers.value, tokenizer=TokenizerLever.VLLM, python_optimize=optimize)
    return Decided(value, *kept, Reason("tokenizer", TokenizerLever.VLLM, Source.DEFAULT,
                                        "as vLLM holds it: a speech model has a processor beside its tokenizer"),
                   Reason("python_optimize", optimize, Source.FLAG if asked.python_optimize is not None else Source.DEFAULT,
                          "asked" if asked.python_optimize is not None else
                          "no python -OO: transformers builds Whisper's classes from their docstrings and fails "
                          "without them (\"No `Args` or `Parameters` section is found in the docstring of "
                          "`Seq2SeqModelOutput`\", transformers/utils/auto_docstring.py)"))


def _concurrency(seqs: int, request: Request) -> Decided[int]:
    return Decided(seqs, Reason(
        "max_num_seqs", seqs, Source.FLAG if seqs != 1 else Source.DEFAULT,
        f"{seqs} transcription(s) decoded at once; each holds its own KV (a longer upload is cut into 30 s "
        "windows that queue as separate requests)"))


def _audio_limits(max_audio_s: int, max_upload: int, speech: SpeechFacts) -> Decided[int]:
    return Decided(max_audio_s, Reason(
        "max_audio_s", max_audio_s, Source.DEFAULT,
        f"uploads up to {max_audio_s} s ({math.ceil(max_audio_s / speech.window_s)} windows of {speech.window_s} s) "
        f"and {max_upload / 1e6:.0f} MB, vLLM's own defaults: a longer one is refused with the limit named; "
        f"its decoded samples take {max_audio_s * speech.sample_rate * SAMPLE_BYTES / MiB:.0f} MiB"))


@dataclass(frozen=True)
class _RuntimeCost:
    """What the worker holds beyond weights, KV and the encoder's work, and the start's peak ratio."""

    bytes: int
    peak_ratio: float
    source: Source
    detail: str


def _runtime_cost(profile: Profile, seqs: int) -> _RuntimeCost:
    """From the profile's speech figures where measured on this class, else the stated fallbacks."""
    figures = profile.speech
    if figures is None:
        return _RuntimeCost(FALLBACK_SPEECH_PROCESS_BYTES, FALLBACK_SPEECH_PEAK_RATIO, Source.FALLBACK,
                            f"runtime {FALLBACK_SPEECH_PROCESS_BYTES / MiB:.0f} MiB and load peak "
                            f"{FALLBACK_SPEECH_PEAK_RATIO} (fallbacks: no speech figures on {profile.name})")
    per = figures.per_transcription_bytes
    runtime = int(figures.process_bytes.median + (per.median if per is not None else 0) * (seqs - 1))
    peak = figures.load_peak_ratio.median if figures.load_peak_ratio is not None else FALLBACK_SPEECH_PEAK_RATIO
    detail = (f"runtime {runtime / MiB:.0f} MiB: {_in_mib(figures.process_bytes)} serving one transcription"
              + (f", {_in_mib(per)} more for each further one" if per is not None else "")
              + (f"; load peak {figures.load_peak_ratio.describe('× steady')}" if figures.load_peak_ratio is not None
                 else f"; load peak {FALLBACK_SPEECH_PEAK_RATIO} (fallback)")
              + f" (measured on {profile.name})")
    return _RuntimeCost(runtime, peak, profile.reason_source, detail)


def _weights_bytes(model: ModelFacts, fmt: WeightFormat, dtype: str) -> tuple[int, str]:
    params = model.num_params if model.num_params is not None else model.param_bytes.total // 2
    if fmt in (WeightFormat.W4A8, WeightFormat.W8A8):
        bits = 4 if fmt is WeightFormat.W4A8 else 8
        layers = model.linear_layers
        packed = sum(block_packed_bytes(layer.out_features, layer.in_features, bits) for layer in layers)
        rest = params - sum(layer.out_features * layer.in_features for layer in layers)
        return (packed + rest * DTYPE_BYTES[dtype],
                f"{params / 1e6:.1f} M parameters, the linear layers in edgectl's int{bits} blocks, the rest in {dtype}")
    return params * DTYPE_BYTES[dtype], f"{params / 1e6:.1f} M parameters in {dtype}"


def _in_mib(fig: Figure) -> str:
    spread = f", range {fig.min / MiB:.0f}–{fig.max / MiB:.0f}" if fig.min is not None and fig.max is not None else ""
    passes = f", {fig.passes} passes" if fig.passes else ""
    return f"{fig.median / MiB:.1f} MiB (median{passes}{spread}; {fig.source.key})"


def _memory(model: ModelFacts, fmt: WeightFormat, head: str, pack: EmbeddingPack, sizes: SpeechSizes, seqs: int,
            dtype: str, max_audio_s: int, budget: int | None, profile: Profile) -> Decided[Memory]:
    speech = model.speech
    assert speech is not None
    weights, weights_what = _weights_bytes(model, fmt, dtype)
    if head == "w8-scan":
        scan = block_packed_bytes(model.vocab_size, speech.d_model, 8)
        weights += scan
        weights_what += f", and the head's int8 copy {scan / MiB:.0f} MiB"
    blocks = sizes.blocks_per_seq * seqs + 1  # vLLM keeps one null block
    kv = blocks * sizes.kv_bytes_per_block
    cost = _runtime_cost(profile, seqs)
    if pack is EmbeddingPack.NONE:
        # the runtime was measured with vLLM's packed copy of the head (oneDNN's, the table's bytes in the dtype)
        packed = model.vocab_size * speech.d_model * DTYPE_BYTES[dtype]
        cost = replace(cost, bytes=cost.bytes - packed,
                       detail=f"runtime {(cost.bytes - packed) / MiB:.0f} MiB, the measured one less vLLM's packed "
                              f"copy of the head it held then ({packed / MiB:.0f} MiB; the int8 scan replaces it): "
                              f"{cost.detail}")
    # The decoded samples of the longest uploads, one per transcription at once: held only while
    # such uploads run, so they are room under the limits, not part of the steady total.
    audio = seqs * max_audio_s * speech.sample_rate * SAMPLE_BYTES
    workspace = sizes.encoder_work_bytes
    total = weights + kv + cost.bytes + workspace
    limit = ledger.round_mib((total * cost.peak_ratio + audio) * ledger.MAX_HEADROOM)
    high = ledger.round_mib((total * cost.peak_ratio + audio) * ledger.HIGH_HEADROOM)
    memory = Memory(weights_bytes=weights, kv_cache_bytes=kv, rope_bytes=0, runtime_bytes=cost.bytes,
                    workspace_bytes=workspace, total_bytes=total, high_bytes=high, limit_bytes=limit)
    if budget is not None and limit > budget:
        raise EdgectlError(
            f"{model.name} needs {limit / MiB:.0f} MiB with {seqs} transcription(s) at once, this host can give "
            f"{budget / MiB:.0f} MiB: ask for fewer with --max-num-seqs")
    detail = (f"weights {weights / MiB:.0f} MiB ({weights_what}); KV {kv / MiB:.0f} MiB "
              f"({blocks} blocks of {sizes.kv_bytes_per_block / MiB:.2f} MiB: {sizes.blocks_per_seq} per transcription "
              f"for {sizes.decoder_tokens} decoder tokens and {sizes.encoder_positions} cross-attention rows, plus vLLM's "
              f"null block); encoder work {sizes.encoder_work_bytes / MiB:.0f} MiB for one window; {cost.detail}; "
              f"MemoryMax = (total × load peak {cost.peak_ratio:.2f} + {audio / MiB:.0f} MiB of decoded audio for the "
              f"longest uploads) × {ledger.MAX_HEADROOM}")
    return Decided(memory, Reason("memory", total, cost.source, detail))


def _timeouts(request: Request) -> Decided[Timeouts]:
    step = watchdog_for_step(UNMEASURED_SPEECH_STEP_S)
    watchdog = request.watchdog_s or step
    start = start_for_ready(UNMEASURED_READY_S)
    return Decided(Timeouts(start_s=start, watchdog_s=watchdog, stop_s=STOP_S), Reason(
        "timeouts", {"start_s": start, "watchdog_s": watchdog, "stop_s": STOP_S},
        Source.FLAG if request.watchdog_s else Source.FALLBACK,
        f"start within {start} s, the watchdog at {watchdog} s: the speech service's start and longest step "
        "are not measured on this class yet"))
