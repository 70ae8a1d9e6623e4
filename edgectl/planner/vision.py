"""The planner for a vision-language model (Idefics3 / SmolVLM: images and text in, text out), in the order decided.

A vision-language model is planned as its language model, with the text planner's own decisions (the
profile, the topology, the CPUs and threads, the KV dtype, the context and the memory ledger that sizes
it), plus what the images cost:

    format            dense bf16, the text planner's dense format: the tower and the language model; asked
                      (--format w4a8 / w8a8), the language model in edgectl's blocks, the tower dense
    compilation       eager for a dense language model, vLLM's torch.compile mode for a quantized one
    image limits      the guard's limits (edgectl/contract/vision.py), vLLM's own limits set the same
    image tokens      per image, from the processor's tiling of the largest image allowed
                      (edgectl/models/vision_inspect.py, ``idefics3_tiles``): the context must hold a
                      prompt with the images a request may carry
    encoder           held: the image processor's libraries and vLLM's encoder cache (the image tokens'
                      embeddings), in the steady total; transient: the vision tower's work on one image's
                      tiles, room under the limits only (as the decoded audio of a speech plan)
    tower batches     the tiles the tower encodes at once (2, measured; vLLM's own: all of an image's),
                      runtime/edgectl_runtime/vllm_plugin/tower_tiles.py
    memory            the text ledger with the encoder's held memory in it and its work under the limits:
                      the context is fitted with both

The figures not measured on the profile's device class are stated fallbacks (``Source.FALLBACK``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from edgectl.contract import int4_layout
from edgectl.contract.plan import (
    BenchLevers,
    Compilation,
    KvCacheDtype,
    ModelRef,
    Plan,
    Predicted,
    ProfileRef,
    Reason,
    Request,
    Serve,
    Source,
    Timeouts,
    TokenizerLever,
    Topology,
    WeightFormat,
)
from edgectl.contract.vision import ImageLimits, VisionServe
from edgectl.errors import EdgectlError
from edgectl.models.vision_inspect import idefics3_tiles
from edgectl.output import mib
from edgectl.planner import ledger
from edgectl.planner.cpus import choose_cpus
from edgectl.planner.decided import Decided, Reasons
from edgectl.planner.engine import (
    LEAN_ATTENTION_VISION,
    MemoryLevers,
    choose_batched_tokens,
    choose_levers,
    choose_memory_levers,
    choose_topology,
    vision_decode_attention,
)
from edgectl.planner.fit import DEFAULT_CONTEXT_CAP, fit_weights_and_context
from edgectl.planner.formats import checkpoint_format, host_runs, kernels_run
from edgectl.planner.kv_dtype import decode_attention_for, kv_dtype_candidates
from edgectl.planner.profile import choose_profile
from edgectl.planner.request import check_request
from edgectl.planner.service import (
    STOP_S,
    UNMEASURED_READY_S,
    UNMEASURED_STEP_S,
    start_for_ready,
    watchdog_for_step,
    worker_environment,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgectl.models.facts import ModelFacts, VisionFacts
    from edgectl.probe.facts import HostFacts
    from edgectl.profiles import Profile

MiB = 1 << 20
DTYPE = "bfloat16"
DTYPE_BYTES = 2
PIXEL_BYTES = 4  # the processor's pixel values: float32, 3 channels (Idefics3ImageProcessor rescales to float)
# Text a prompt holds beside its images: the chat template's turn markers and a question. Below this a
# context that holds the images leaves no room for what is asked about them.
MIN_TEXT_TOKENS = 128


@dataclass(frozen=True)
class ImageSizes:
    """What one image of the largest size allowed costs the prompt and the encoder."""

    tiles: int  # the tiles the processor cuts it into, the global view included
    image_tokens: int  # tiles × tokens per tile: the tower's output, one embedding each
    prompt_tokens: int  # the image's whole placeholder in the prompt (image tokens and the tile markers)
    encoder_work_bytes: int  # the tower's activations for all its tiles, and the pixel values
    encoder_cache_bytes: int  # vLLM's encoder cache: the image tokens' embeddings, in the model dtype


def image_sizes(vision: VisionFacts, limits: ImageLimits, text_hidden: int, batched: int) -> ImageSizes:
    """One image's tiles and tokens, and what encoding it holds.

    The largest image allowed (``max_pixels``, as a square) is resized by the processor to a longest
    edge of ``resize_longest_edge`` and cut into tiles; a square makes the most tiles
    (``idefics3_tiles``, the count ``VisionFacts.tiles_max`` gives too). vLLM's prompt replacement
    (``Idefics3ProcessingInfo.get_image_repl``, vllm/model_executor/models/idefics3.py) writes, per tile,
    ``<fake_token_around_image><row_i_col_j>`` and the tile's image tokens, a newline after each row, then
    ``\\n<fake_token_around_image><global-img>``, the global view's image tokens and a closing
    ``<fake_token_around_image>``: at most 3 tokens per tile and one more beside the image tokens.

    The encoder's work (a stated fallback, nobody measured it): vLLM runs the tower on an image's tiles in
    one batch, one layer at a time (edgectl's plan now two tiles at a time: this stays the upper bound),
    so what it holds at once is one layer's activations over every patch of every tile, the larger of the attention's (the input, its norm, q, k, v and the output: 6 × hidden)
    and the MLP's (the input, the residual, fc1's output and its activation: 2 × hidden + 2 × MLP), in
    bf16; the attention scores are not held whole (torch's CPU SDPA works in blocks), and the processor's
    float32 pixel values, 3 × tile² per tile. vLLM's encoder cache holds max(max_num_batched_tokens, one
    image's tokens) embeddings of the language model's width (``compute_mm_encoder_budget``,
    vllm/v1/core/encoder_cache_manager.py).
    """
    side = math.isqrt(limits.max_pixels)
    tiles = idefics3_tiles(side, side, vision.resize_longest_edge, vision.tile_longest_edge, vision.image_splitting)
    image_tokens = tiles * vision.tokens_per_tile
    patches = (vision.tile_size // vision.patch_size) ** 2
    h, mlp = vision.tower_hidden_size, vision.tower_intermediate_size
    per_patch = max(6 * h, 2 * h + 2 * mlp) * DTYPE_BYTES
    work = tiles * patches * per_patch + tiles * 3 * vision.tile_size ** 2 * PIXEL_BYTES
    cache = max(batched, image_tokens) * text_hidden * DTYPE_BYTES
    return ImageSizes(tiles, image_tokens, image_tokens + 3 * tiles + 1, work, cache)


def plan_vision(facts: HostFacts, model: ModelFacts, profiles: Sequence[Profile], request: Request) -> Plan:
    """Decide how a vision-language model is served here, and what it costs."""
    vision = model.vision
    if vision is None:
        raise EdgectlError(f"{model.name} is not a vision-language model")
    if facts.memory.budget_bytes is None:
        raise EdgectlError("the probe could not tell how much memory this host has (see `edgectl probe`): "
                           "cannot plan without a memory budget")
    why = Reasons()
    profile = why.take(choose_profile(profiles, facts))
    fmt_reason = _weight_format(facts, model, request)
    fmt = WeightFormat(fmt_reason.value)
    quantized = fmt is not WeightFormat.BF16  # the language model's head in int8 blocks beside its layers
    check_request(replace(request, weight_format=None))  # the rest as for a text model
    topology = why.take(choose_topology(request.bench))
    compilation = why.take(_compilation(request, fmt))
    cpus = why.take(choose_cpus(facts, request, profile, topology))
    limits = why.take(_image_limits(ImageLimits()))
    sizes = image_sizes(vision, limits, model.hidden_size, ledger.MAX_BATCHED_TOKENS)
    prompt_min = limits.max_images_per_request * sizes.prompt_tokens + MIN_TEXT_TOKENS
    why.take(_image_tokens(model, vision, limits, sizes, prompt_min))
    _check_context(model, request, limits, prompt_min)
    why.take(_tower(vision))
    tower_tiles = why.take(_tower_tiles(request))
    text_costs = why.take(ledger.fixed_costs(model, profile, topology, compilation))
    held = why.take(_encoder_held(sizes))
    # the encoder's held memory beside the text model's in the steady total, its work only under the limits
    costs = replace(text_costs, runtime_bytes=text_costs.runtime_bytes + held,
                    transient_bytes=why.take(_encoder_work(vision, sizes, tower_tiles)),
                    transient_what="the tower's work on one image")
    levers = choose_levers(request.bench).value
    fit = why.take(fit_weights_and_context(
        facts.memory.budget_bytes, model, profile, request, [(fmt, fmt_reason)], 0,
        quantized, levers.rope_cap, costs, kv_dtype_candidates(facts, model, request)))
    _check_fits(model, request, fit.max_model_len, facts.memory.budget_bytes, limits, prompt_min)
    # after the fit: an int8 KV, asked or planned, is read by edgectl's decode attention only
    memory_levers = why.take(_memory_levers(request.bench, facts, model, topology, request, fit.kv_dtype))
    memory = replace(fit.memory, runtime_bytes=text_costs.runtime_bytes,
                     workspace_bytes=fit.memory.workspace_bytes + held)
    batched = why.take(choose_batched_tokens(fit.max_model_len))
    why.take(ledger.kv_cache(model, request, memory, fit.max_model_len, fit.kv_dtype))
    rope_rows = why.take(ledger.rope(model, fit.max_model_len, levers.rope_cap))
    why.take(ledger.memory_limit(memory, costs))
    timeouts = why.take(_timeouts(request))
    plan_levers = memory_levers.levers(rope_cap=levers.rope_cap, layerwise_repack=False, topology=topology,
                                       reserve_frontend_core=cpus.reserve_frontend_core, thread_wait=cpus.thread_wait)
    env = worker_environment(cpus, plan_levers)
    env["VLLM_MAX_IMAGE_PIXELS"] = str(limits.max_pixels)  # vLLM's loader holds the guard's limit too
    return Plan(
        model=ModelRef(model.name, model.path, model.architecture, checkpoint_format(model)),
        device_class=facts.device_class,
        profile=ProfileRef(profile.name, profile.file, profile.kind),
        weight_format=fmt,
        group_size=int4_layout.BLOCK if quantized else 0,
        quantize_lm_head=quantized,
        max_model_len=fit.max_model_len,
        max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=batched,
        kv_bytes_per_token=ledger.kv_bytes_per_token(model, fit.kv_dtype),
        kv_cache_dtype=fit.kv_dtype,
        block_size=ledger.BLOCK_SIZE_TOKENS,
        rope_rows=rope_rows,
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
        vision=VisionServe(images=limits, tower_tiles=tower_tiles),
    )


def _check_fits(model: ModelFacts, request: Request, fits_len: int, budget: int, limits: ImageLimits,
                prompt_min: int) -> None:
    """Refuse, with one line, a budget whose context holds no prompt with the images a request may carry."""
    if fits_len < prompt_min:
        raise EdgectlError(
            f"{model.name} fits a context of {fits_len} tokens in the budget {mib(budget)}, and a prompt with "
            f"{limits.max_images_per_request} image(s) needs {prompt_min}: free memory, raise the cgroup limit"
            + (" or ask for fewer with --max-num-seqs" if request.max_num_seqs > 1 else ""))


def _weight_format(facts: HostFacts, model: ModelFacts, request: Request) -> Reason:
    """The language model's linear layers in edgectl's 8-bit blocks (w8a8) with its output head in int8 blocks,
    the tower and the connector dense, where edgectl's kernels run; dense bf16 elsewhere or when asked; w4a8
    when asked. Anything else is refused with one line."""
    checkpoint = checkpoint_format(model)
    if checkpoint != "bf16":
        raise EdgectlError(f"{model.name}'s checkpoint is {checkpoint} (config.json's quantization_config): edgectl "
                           "serves a vision-language model from its bf16 or float32 weights")
    asked = request.weight_format
    if asked not in (None, WeightFormat.BF16, WeightFormat.W4A8, WeightFormat.W8A8):
        raise EdgectlError(f"--format {asked}: a vision-language model is served bf16, or its language model as w4a8 "
                           "or w8a8 (edgectl's kernels)")
    runs, why = kernels_run(facts)  # w8a8: the same library, its 8-bit blocks
    on_edgectl_kernels = asked in (WeightFormat.W4A8, WeightFormat.W8A8)
    if on_edgectl_kernels and not runs:
        raise EdgectlError(f"--format {asked} runs edgectl's kernels: {why}; serve {model.name} dense (no --format)")
    if on_edgectl_kernels or (asked is None and runs):
        fmt = WeightFormat(asked or WeightFormat.W8A8)
        bits = 8 if fmt is WeightFormat.W8A8 else 4
        return Reason("weight_format", fmt, Source.FLAG if asked else Source.DEFAULT,
                      f"{'asked' if asked else W8A8_DEFAULT}: the language model's linear layers in edgectl's "
                      f"{bits}-bit blocks of 32 with int8 activations and its output head (the tied embedding) in "
                      f"8-bit blocks; the vision tower and the connector stay bf16, as checked against the reference "
                      f"({why})")
    _, dense = host_runs(WeightFormat.BF16, facts)
    return Reason("weight_format", WeightFormat.BF16, Source.FLAG if asked else Source.DEFAULT,
                  f"dense bf16, the vision tower and the language model alike ({dense})"
                  + ("" if asked else f"; edgectl's kernels, which the default w8a8 runs on, do not run here: {why}"))


# Why the language model runs on edgectl's 8-bit blocks by default (docs/vision.md "The language model on
# edgectl's kernels").
W8A8_DEFAULT = (
    "w8a8, the fastest measured that answers as bf16 does: decode with an image in context 111.7 tok/s "
    "[106.5-116.9] and 109.7 [103.2-111.9] in two quiet runs against 53.7 and 61.5 for dense bf16 eager (1.06x "
    "llama.cpp's with --mmproj on the same bf16 weights, not its fastest format), its warm-up answers bf16's in "
    "every pass, 50-70 MB less; w4a8 decoded 2-9% faster but answered differently in 1 pass of 6; a start from "
    "the compile cache after kill -9 under systemd READY in 42.5-45.4 s (x86_64-avx512-bf16, 3 interleaved "
    "passes a run, 4 kills)")


def _compilation(request: Request, fmt: WeightFormat) -> Decided[Compilation]:
    """vLLM's torch.compile mode for a language model on edgectl's kernels, eager for a dense one, unless asked.
    vLLM compiles the language model, not the vision tower (``compile_mm_encoder`` is off)."""
    if request.compilation:
        mode = Compilation(request.compilation)
        return Decided(mode, Reason("compilation", mode, Source.FLAG, "asked with --compilation"))
    if fmt is not WeightFormat.BF16:
        return Decided(Compilation.DEFAULT, Reason(
            "compilation", Compilation.DEFAULT, Source.DEFAULT,
            "vLLM's torch.compile mode for the language model (the tower stays eager): the quantized language "
            "model was measured compiled (docs/vision.md \"The language model on edgectl's kernels\"); the first "
            "start compiles, ready in 113-152 s against 41-50 s eager on x86_64-avx512-bf16; --compilation eager "
            "starts sooner"))
    return Decided(Compilation.EAGER, Reason(
        "compilation", Compilation.EAGER, Source.DEFAULT,
        "eager: the dense language model was measured eager, and vLLM compiles no vision tower; no compile at the "
        "first start"))


def _memory_levers(asked: BenchLevers, facts: HostFacts, model: ModelFacts, topology: Topology, request: Request,
                   kv_dtype: KvCacheDtype) -> Decided[MemoryLevers]:
    """The text planner's memory levers, but the tokenizer as vLLM keeps it (a vision model has a processor
    beside its tokenizer, which the lean lever does not handle) and no python -OO (not tried with it)."""
    levers = choose_memory_levers(asked, facts, topology, lean_attention=(True, LEAN_ATTENTION_VISION),
                                  decode_attention=decode_attention_for(request, kv_dtype, vision_decode_attention(facts, model)))
    kept = tuple(r for r in levers.reasons if r.decision not in ("tokenizer", "python_optimize"))
    optimize = 0 if asked.python_optimize is None else asked.python_optimize
    value = replace(levers.value, tokenizer=TokenizerLever.VLLM, python_optimize=optimize)
    return Decided(value, *kept, Reason("tokenizer", TokenizerLever.VLLM, Source.DEFAULT,
                                        "as vLLM holds it: a vision-language model has a processor beside its "
                                        "tokenizer, which the lean lever does not handle"),
                   Reason("python_optimize", optimize, Source.FLAG if asked.python_optimize is not None else Source.DEFAULT,
                          "asked" if asked.python_optimize is not None else
                          "no python -OO: not tried with a vision-language model's processor, and transformers builds "
                          "some classes from their docstrings (a Whisper worker fails without them, docs/speech.md)"))


def _image_limits(limits: ImageLimits) -> Decided[ImageLimits]:
    return Decided(limits, Reason(
        "image_limits", {"max_pixels": limits.max_pixels, "max_images_per_request": limits.max_images_per_request,
                         "max_request_bytes": limits.max_request_bytes, "allow_remote_urls": limits.allow_remote_urls},
        Source.DEFAULT,
        f"the image guard's defaults (docs/vision-guard.md): up to {limits.max_pixels:,} pixels an image (a "
        f"12-megapixel camera frame and a 4K frame pass; below Pillow's bomb threshold), vLLM's loader told the same "
        f"(VLLM_MAX_IMAGE_PIXELS); {limits.max_images_per_request} image(s) a request, one question about one frame, "
        f"vLLM told the same (--limit-mm-per-prompt) so it sizes its encoder budget for it, not 999; requests up to "
        f"{mib(limits.max_request_bytes)}; no remote image URLs (no network is assumed), and no local files "
        "(--allowed-local-media-path is never set)"))


def _image_tokens(model: ModelFacts, vision: VisionFacts, limits: ImageLimits, sizes: ImageSizes,
                  prompt_min: int) -> Decided[int]:
    side = math.isqrt(limits.max_pixels)
    return Decided(sizes.prompt_tokens, Reason(
        "image_tokens", sizes.prompt_tokens, Source.MODEL_CONFIG,
        f"the largest image ({side}x{side}) is resized to a longest edge of {vision.resize_longest_edge} and cut into "
        f"{sizes.tiles} tile(s) of {vision.tile_longest_edge}x{vision.tile_longest_edge}"
        + (" (the global view included)" if sizes.tiles > 1 else "")
        + f" of {vision.tokens_per_tile} tokens: {sizes.image_tokens} image tokens, {sizes.prompt_tokens} with the "
        f"tile markers; a prompt with {limits.max_images_per_request} image(s) and {MIN_TEXT_TOKENS} tokens of text "
        f"needs {prompt_min} tokens of context ({model.name}'s processor settings)"))


def _check_context(model: ModelFacts, request: Request, limits: ImageLimits, prompt_min: int) -> None:
    """Refuse a context that cannot hold a prompt with the images a request may carry."""
    images = f"{limits.max_images_per_request} image(s)"
    if request.max_model_len is not None and request.max_model_len < prompt_min:
        raise EdgectlError(f"--max-model-len {request.max_model_len} cannot hold a prompt with {images} of "
                           f"{model.name}: it needs {prompt_min} tokens; use --max-model-len {prompt_min} or more")
    model_max = model.max_position_embeddings
    if model_max and model_max < prompt_min:
        raise EdgectlError(f"{model.name} takes {model_max} tokens (max_position_embeddings), and a prompt with "
                           f"{images} needs {prompt_min}: it cannot be served with {images}")
    if request.max_model_len is None and prompt_min > DEFAULT_CONTEXT_CAP:
        raise EdgectlError(f"a prompt with {images} of {model.name} needs {prompt_min} tokens, more than the default "
                           f"context ({DEFAULT_CONTEXT_CAP}): pass --max-model-len {prompt_min} or more")


def _tower(vision: VisionFacts) -> Decided[int]:
    params = vision.tower_params or 0
    tower = params * DTYPE_BYTES
    return Decided(tower, Reason(
        "vision_tower", tower, Source.MODEL_CONFIG,
        f"{vision.tower_model_type}: {vision.tower_layers} layers of {vision.tower_attention_heads} heads, hidden "
        f"{vision.tower_hidden_size} (MLP {vision.tower_intermediate_size}), and the {vision.connector} connector: "
        f"{params / 1e6:.1f} M parameters, {mib(tower)} in bf16 (stored: {mib(vision.tower_bytes or 0)}), "
        "counted in the weights"))


# Measured under the real systemd (docs/vision.md "Memory, measured"; synth-smolvlm-256m, x86_64-amx,
# 2026-12-03): the worker held 206 MiB more than a text model's ledger before its first image (the image
# processor and the libraries it loads), and answering one largest image (17 tiles) added 660 MiB at its
# peak where the activations modelled below come to 306 MiB: the tower holds about 2.2 times the one
# layer's activations counted (float32 intermediates, the processor's resized copies of the image). The
# 660 MiB goes once the image is encoded: the vision bench's steady PSS after its images came back to the
# held figure (docs/vision.md "Memory, measured").
VISION_RUNTIME_EXTRA_BYTES = 206 * MiB
ENCODER_WORK_MEASURED_RATIO = 660 / 306
ENCODER_EVIDENCE = ("measured: 206 MiB held before the first image beyond a text model's ledger, and 660 MiB added "
                    "by one 17-tile image against 306 MiB of modelled activations (synth-smolvlm-256m under the real "
                    "systemd, x86_64-amx, 2026-12-03; docs/vision.md \"Memory, measured\")")


def _encoder_held(sizes: ImageSizes) -> Decided[int]:
    held = VISION_RUNTIME_EXTRA_BYTES + sizes.encoder_cache_bytes
    return Decided(held, Reason(
        "encoder_bytes", held, Source.DEFAULT,
        f"held beside the language model: the image processor and its libraries {mib(VISION_RUNTIME_EXTRA_BYTES)}; "
        f"vLLM's encoder cache, {mib(sizes.encoder_cache_bytes)}: max({ledger.MAX_BATCHED_TOKENS}, "
        f"{sizes.image_tokens}) image-token embeddings in bf16 (counted in the workspace); {ENCODER_EVIDENCE}"))


def _encoder_work(vision: VisionFacts, sizes: ImageSizes, tower_tiles: int) -> Decided[int]:
    work = math.ceil(sizes.encoder_work_bytes * ENCODER_WORK_MEASURED_RATIO)
    patches = (vision.tile_size // vision.patch_size) ** 2
    h, mlp = vision.tower_hidden_size, vision.tower_intermediate_size
    batches = ("" if not tower_tiles or tower_tiles >= sizes.tiles else
               f"; sized for all tiles in one batch, as measured, though the tower encodes {tower_tiles} at a time "
               f"(tower_tiles), which measured lower: an upper bound ({TOWER_TILES_MEMORY})")
    return Decided(work, Reason(
        "encoder_work_bytes", work, Source.DEFAULT,
        f"held only while an image is encoded, so room under the limits, not steady memory: the vision tower's work "
        f"on one image, {ENCODER_WORK_MEASURED_RATIO:.2f} × ({sizes.tiles} tile(s) × {patches} patches × max(6 × {h}, "
        f"2 × {h} + 2 × {mlp}) values in bf16, one layer's activations at a time, + {sizes.tiles} × 3 × "
        f"{vision.tile_size}² float32 pixel values); one image's: vLLM encodes no more image tokens in a step than "
        f"its encoder budget, max({ledger.MAX_BATCHED_TOKENS}, {sizes.image_tokens}), the largest image's; "
        f"{ENCODER_EVIDENCE}{batches}"))


# Measured (docs/vision.md "The tower, a few tiles at a time"; the vision bench's tower-whole arm is the control).
TOWER_TILES_DEFAULT = 2
TOWER_TILES_MEMORY = ("one 512x512 image's peak PSS 2.35 GB two tiles at a time against 2.95 GB all at once, "
                      "x86_64-amx, 3 interleaved passes, docs/vision.md")
TOWER_TILES_EVIDENCE = ("2: the tower encodes an image's tiles two at a time, the same embeddings from tensors 2 / "
                        "17 of the size that the heap reuses (all at once, each layer's were fresh mappings: 1.0 M "
                        "page faults an image): one 512x512 image's TTFT 3.83 and 3.65 s against 4.64 and 4.63 s all "
                        "at once, four images at once 16.4 and 17.0 against 13.4 and 14.0 tok/s, peak PSS 2.35 and "
                        "2.33 against 2.95 and 2.89 GB; four at a time as fast within the spread with a 0.17 GB "
                        "higher peak (x86_64-amx, two runs on two occasions, 3 interleaved passes each, the bench's "
                        "tower-whole and tower-4 arms, docs/vision.md \"The tower, a few tiles at a time\")")


def _tower_tiles(request: Request) -> Decided[int]:
    """How many of an image's tiles the tower encodes at once (runtime/edgectl_runtime/vllm_plugin/tower_tiles.py)."""
    asked = request.bench.tower_tiles
    if asked is not None:
        return Decided(asked, Reason("tower_tiles", asked, Source.FLAG, "asked"))
    return Decided(TOWER_TILES_DEFAULT, Reason("tower_tiles", TOWER_TILES_DEFAULT, Source.DEFAULT, TOWER_TILES_EVIDENCE))


def _timeouts(request: Request) -> Decided[Timeouts]:
    step = watchdog_for_step(UNMEASURED_STEP_S)
    watchdog = request.watchdog_s or step
    start = start_for_ready(UNMEASURED_READY_S)
    return Decided(Timeouts(start_s=start, watchdog_s=watchdog, stop_s=STOP_S), Reason(
        "timeouts", {"start_s": start, "watchdog_s": watchdog, "stop_s": STOP_S},
        Source.FLAG if request.watchdog_s else Source.FALLBACK,
        f"start within {start} s, the watchdog at {watchdog} s: a vision model's start and its longest step (the "
        f"tower on one image's tiles, then a prefill chunk) are not measured on this class yet (taken as "
        f"{UNMEASURED_READY_S} s and {UNMEASURED_STEP_S:.0f} s)"))
