"""The memory ledger: what the service's processes hold, steady state, as PSS.

    runtime    fixed cost of each process that imports Python + torch + vLLM (+ the HTTP
               server), measured per device class, times the processes of the topology
    weights    the resident weights in the chosen format (int4 layers: packed uint8 N×K/2
               plus bf16 scales and zeros; embeddings, norms and an unquantized head: bf16)
    kv_cache   exactly the planned KV bytes (vLLM zero-fills it: committed up front,
               ``vllm/v1/worker/utils.py:596``)
    rope       the cos/sin table: rows × rotary_dim × 2 bytes (capped to the context)
    workspace  activations of the largest batch (``max_num_batched_tokens``) kept by the
               allocator after the warm-up pass

MemoryHigh and MemoryMax are the total times the measured load peak (PSS from launch to
ready over steady PSS), with 5% and 25% of headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgectl.contract import int4_layout
from edgectl.contract.plan import (
    Compilation,
    KvCacheDtype,
    Memory,
    Reason,
    Source,
    Topology,
    WeightFormat,
)
from edgectl.models.facts import ParamBytes
from edgectl.output import MiB, mib
from edgectl.planner.decided import Decided

if TYPE_CHECKING:
    from edgectl.contract.plan import Request
    from edgectl.models.facts import ModelFacts
    from edgectl.profiles import Profile

BLOCK_SIZE_TOKENS = 128  # vLLM's CPU default KV block (vllm/platforms/cpu.py: block_size = 128)
DTYPE_BYTES = 2  # bf16 activations, KV cache, scales and the RoPE table
# Prefill runs in chunks of at most this many tokens (the reason: planner/engine.py).
MAX_BATCHED_TOKENS = 512

# Without a measured figure (fallback profile): one process importing Python, torch and vLLM
# held ~0.5 GB (docs/facts.md, "Memory per process"); the single-process server adds the HTTP
# stack on top.
FALLBACK_PROCESS_BYTES = 640 * MiB
FALLBACK_LOAD_PEAK_RATIO = 1.3
# Compiled mode's first start compiles inside the service's cgroup: on x86_64-amx its peak PSS was
# 1.25× the steady one (the worker plus cc1plus compiling inductor's C++, docs/memory.md
# "Compiled mode's first start"). Without that figure in the profile, this ratio stands in.
FALLBACK_COMPILE_PEAK_RATIO = 1.3
# A conservative activation estimate per batched token when the profile has none: hidden
# states and residuals (8 × hidden) and the MLP's gate/up/act buffers (4 × intermediate), fp32.
FALLBACK_WORKSPACE_FACTOR = 4
HIGH_HEADROOM = 1.05
MAX_HEADROOM = 1.25


# -- the pieces, each a function of the model and the settings --------------------------------------


def batched_tokens(max_model_len: int) -> int:
    """Tokens of the largest engine step: one prefill chunk, or the whole context if shorter."""
    return min(max_model_len, MAX_BATCHED_TOKENS)


def kv_bytes_per_token_per_layer(model: ModelFacts, kv_dtype: KvCacheDtype = KvCacheDtype.AUTO) -> int:
    """K and V of every KV head of one layer, for one token (bf16: 2 bytes a value; fp8: 1)."""
    return 2 * model.num_kv_heads * model.head_dim * kv_dtype.bytes_per_value


def kv_bytes_per_token(model: ModelFacts, kv_dtype: KvCacheDtype = KvCacheDtype.AUTO) -> int:
    """KV bytes one token occupies in a full-attention layer stack."""
    return kv_bytes_per_token_per_layer(model, kv_dtype) * model.num_layers


def kv_scales_bytes(model: ModelFacts, kv_cache_bytes: int, kv_dtype: KvCacheDtype = KvCacheDtype.AUTO) -> int:
    """An int8 KV's scales beside vLLM's KV tensors of ``kv_cache_bytes``: a float32 per token, KV head
    and half for every ``head_dim`` one-byte values (csrc/kernels.h), so 4 / head_dim of the KV."""
    return kv_cache_bytes * 4 // model.head_dim if kv_dtype is KvCacheDtype.INT8 else 0


def kv_cache_bytes_for(model: ModelFacts, max_model_len: int, max_num_seqs: int,
                       block_size: int = BLOCK_SIZE_TOKENS, max_num_batched_tokens: int | None = None,
                       kv_dtype: KvCacheDtype = KvCacheDtype.AUTO) -> int:
    """Bytes that hold ``max_num_seqs`` sequences of ``max_model_len`` tokens, in whole blocks.

    vLLM's block pool keeps one block aside (the null block, ``v1/core/block_pool.py``), so a
    pool of exactly ``ceil(len / block) × seqs`` blocks is refused at start-up: plan one more.
    A sliding-window layer holds, per sequence, what vLLM's admission check reserves
    (``SlidingWindowSpec.max_admission_blocks_per_request``, ``v1/kv_cache_interface.py``):
    ``ceil(min(window − 1 + tokens in flight, max_model_len) / block) + 1`` blocks — the window
    plus one engine step's batch (the CPU backend runs one batch at a time: async scheduling
    is off, ``platforms/cpu.py:331``), plus one because the window need not start on a block
    boundary. Below the window that is one block *more* than a full-attention layer.
    """
    per_layer_token = kv_bytes_per_token_per_layer(model, kv_dtype)
    full_blocks = math.ceil(max_model_len / block_size)
    in_flight = max_num_batched_tokens if max_num_batched_tokens is not None else batched_tokens(max_model_len)
    total = 0
    layer_types = list(model.layer_types or ["full_attention"] * model.num_layers)
    for kind in layer_types:
        blocks = full_blocks
        if kind == "sliding_attention" and model.sliding_window:
            held = min(model.sliding_window - 1 + in_flight, max_model_len)
            blocks = math.ceil(held / block_size) + 1
        total += (blocks * max_num_seqs + 1) * block_size * per_layer_token
    return total


def rope_rows_uncapped(model: ModelFacts) -> int | None:
    """Rows vLLM 0.32 builds for the cos/sin table without edgectl's cap.

    ``rotary_embedding/base.py:94-103`` uses ``max_position_embeddings``; YaRN uses
    ``original_max_position_embeddings × factor`` (``yarn_scaling_rope.py:76-85``).
    """
    scaling = model.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "yarn" and scaling.get("original_max_position_embeddings") and scaling.get("factor"):
        return int(scaling["original_max_position_embeddings"] * scaling["factor"])
    return int(model.max_position_embeddings or 0) or None  # None: config.json gives no maximum


def rope_rows(model: ModelFacts, max_model_len: int, capped: bool) -> int:
    """Rows of the cos/sin table: the context when capped, else vLLM's own count."""
    return max_model_len if capped else (rope_rows_uncapped(model) or max_model_len)


def rope_bytes_for(model: ModelFacts, rows: int) -> int:
    return rows * model.head_dim * DTYPE_BYTES  # cos and sin halves: rotary_dim values per row


def _served_param_bytes(model: ModelFacts) -> ParamBytes:
    """The checkpoint's bytes as vLLM holds them before quantizing: a safetensors checkpoint's own;
    a GGUF served as it is (``param_source == "gguf"``: its bytes are its file's blocks) is
    dequantized to the model dtype at load, 2 bytes per value, before the plan's format applies."""
    pb = model.param_bytes
    if model.param_source != "gguf":
        return pb
    linear = sum(layer.out_features * layer.in_features for layer in model.linear_layers)
    table = model.vocab_size * model.hidden_size
    heads = table if pb.lm_head else 0
    other = max(0, (model.num_params or 0) - linear - table - heads)
    return ParamBytes(linear=linear * DTYPE_BYTES, embedding=table * DTYPE_BYTES, lm_head=heads * DTYPE_BYTES,
                      other=other * DTYPE_BYTES)


def _head_bytes(model: ModelFacts, pb: ParamBytes) -> int:
    """What a quantized head replaces: the output head, or the tied table it reads. A vision-language
    model's embedding bytes hold its tower's patch and position embeddings too, so its table is counted
    from its shape, in bf16 (its checkpoint's dtype: planner/vision.py serves bf16 or float32 ones dense)."""
    if pb.lm_head or model.vision is None:
        return pb.lm_head or pb.embedding
    return model.vocab_size * model.hidden_size * DTYPE_BYTES


def weights_bytes_for(model: ModelFacts, weight_format: WeightFormat | str, group_size: int,
                      quantize_lm_head: bool) -> tuple[int, int, int]:
    """(resident weight bytes, quantized linear layers, linear layers left in bf16)."""
    pb = _served_param_bytes(model)
    rest = pb.embedding + pb.lm_head + pb.other
    if weight_format == WeightFormat.BF16:
        return pb.total, 0, len(model.linear_layers)
    if weight_format in (WeightFormat.W4A8, WeightFormat.W8A8):
        # edgectl's blocks hold every linear layer (any N and K) of the language model; the head as
        # int8 blocks. A GGUF served as it is keeps its Q5_0 layers in 5-bit blocks and its other
        # 5-8-bit layers in 8-bit blocks (LinearLayer.gguf_bits). A vision-language model's tower and connector stay bf16.
        packed = model.language_model_layers
        dense = [layer for layer in model.linear_layers if layer not in packed]
        bits = 8 if weight_format is WeightFormat.W8A8 else 4
        total = rest + sum(int4_layout.block_packed_bytes(layer.out_features, layer.in_features,
                                                          layer.gguf_bits or bits)
                           for layer in packed)
        total += sum(layer.out_features * layer.in_features * DTYPE_BYTES for layer in dense)
        if quantize_lm_head:
            total += int4_layout.block_packed_bytes(model.vocab_size, model.hidden_size, 8) - _head_bytes(model, pb)
        return total, len(packed), len(dense)
    total = rest
    quantized = kept = 0
    for layer in model.linear_layers:
        n, k = layer.out_features, layer.in_features
        ok, _ = int4_layout.quantizable(n, k, group_size)
        if ok:
            g = int4_layout.choose_group_size(k, group_size)
            assert g is not None  # quantizable: a group fits
            total += int4_layout.packed_bytes(n, k, g)
            quantized += 1
        else:
            total += n * k * DTYPE_BYTES
            kept += 1
    if quantize_lm_head:
        # The (tied) embedding/LM head becomes int4 too; it is one [vocab, hidden] matrix.
        n, k = model.vocab_size, model.hidden_size
        g = int4_layout.choose_group_size(k, group_size)
        head = pb.lm_head or pb.embedding
        if g is not None and n % 16 == 0:
            total += int4_layout.packed_bytes(n, k, g) - head
    return total, quantized, kept


# -- the fixed costs: what does not depend on the weights or the context ----------------------------


@dataclass(frozen=True)
class Costs:
    runtime_bytes: int  # per process × processes
    peak_ratio: float  # load peak PSS / steady PSS (in compiled mode, the compiling start's if higher)
    peak_source: Source
    workspace_bytes_per_token: float
    peak_what: str = "load peak"
    # held only while some work runs (a vision tower on one image): room under the limits, not steady memory
    transient_bytes: int = 0
    transient_what: str = ""


def tokenizer_delta(model: ModelFacts, profile: Profile) -> tuple[int, str]:
    """What this model's tokenizer costs the worker beyond the one the profile's per-process figure
    was measured with (both measured by ``edgectl_runtime/introspect/tokenizer_cost.py``), and the reason's words.
    A model with a smaller tokenizer gets a negative term."""
    if model.tokenizer_bytes is None:
        return 0, "; the tokenizer's own memory is not counted (not measured: `edgectl models pull` measures it)"
    if profile.tokenizer_bytes is None:
        return 0, (f"; the tokenizer's {model.tokenizer_bytes / MiB:.0f} MiB is not counted beyond the per-process "
                   "figure (the profile does not say what its own model's tokenizer held)")
    base = int(profile.tokenizer_bytes.median)
    delta = model.tokenizer_bytes - base
    return delta, (f"; {delta / MiB:+.0f} MiB for the tokenizer: {model.tokenizer_bytes / MiB:.0f} MiB measured at "
                   f"pull, {base / MiB:.0f} MiB in the per-process figure ({profile.tokenizer_bytes.source.key})")


def fixed_costs(model: ModelFacts, profile: Profile, topology: Topology,
                compilation: Compilation = Compilation.EAGER) -> Decided[Costs]:
    """The runtime's memory per process, the processes of the topology, the load peak, the workspace;
    in compiled mode, plus what the profile measured it to add over eager (the compiled graph)."""
    processes = profile.processes.get(topology, 1 if topology is Topology.SINGLE_PROCESS else 4)
    if profile.process_bytes is not None:
        per_process = int(profile.process_bytes.median)
        source, detail = profile.reason_source, f"{profile.process_bytes.describe('bytes')} per process"
    else:
        per_process = FALLBACK_PROCESS_BYTES
        source, detail = Source.FALLBACK, f"{FALLBACK_PROCESS_BYTES // MiB} MiB per process (not measured here)"
    runtime_bytes = per_process * processes
    detail = f"{processes} process(es) × {detail}"
    extra = profile.compiled.extra_bytes if profile.compiled else None
    if compilation is Compilation.DEFAULT and extra is not None and extra.median > 0:
        runtime_bytes += int(extra.median)
        detail += f" + {extra.describe('bytes')} measured over eager in compiled mode"
    elif compilation is Compilation.DEFAULT:
        detail += " (compiled mode's own memory is not measured here)"
    tokenizer, why = tokenizer_delta(model, profile)
    runtime_bytes += tokenizer
    detail += why
    if profile.load_peak_ratio is not None:
        peak_ratio, peak_source = profile.load_peak_ratio.median, profile.reason_source
    else:
        peak_ratio, peak_source = FALLBACK_LOAD_PEAK_RATIO, Source.FALLBACK
    peak_what = "load peak"
    if compilation is Compilation.DEFAULT:
        # the first start compiles (and a start after a settings change): MemoryMax must hold it
        cold = profile.compiled.cold_peak_ratio if profile.compiled else None
        cold_ratio, cold_source = ((cold.median, profile.reason_source) if cold is not None
                                   else (FALLBACK_COMPILE_PEAK_RATIO, Source.FALLBACK))
        if cold_ratio > peak_ratio:
            peak_ratio, peak_source = cold_ratio, cold_source
            peak_what = ("the compiling first start's peak" if cold is not None
                         else "compiled mode's first start (it compiles; not measured here), peak")
    if profile.workspace_bytes_per_token is not None:
        per_token = profile.workspace_bytes_per_token.median
    else:
        intermediate = model.intermediate_size or 4 * model.hidden_size
        per_token = FALLBACK_WORKSPACE_FACTOR * (8 * model.hidden_size + 4 * intermediate)
    costs = Costs(runtime_bytes, peak_ratio, peak_source, per_token, peak_what)
    return Decided(costs, Reason("runtime_bytes", runtime_bytes, source, detail))


# -- the ledger of one weight format, at any context ------------------------------------------------


@dataclass(frozen=True)
class Ledger:
    """The memory of a plan with these weights, as a function of the context length."""

    model: ModelFacts
    request: Request
    costs: Costs
    weights_bytes: int
    rope_capped: bool
    kv_dtype: KvCacheDtype = KvCacheDtype.AUTO

    def at(self, max_len: int) -> Memory:
        batched = batched_tokens(max_len)
        kv = (self.request.bench.kv_cache_bytes if self.request.bench.kv_cache_bytes
              else kv_cache_bytes_for(self.model, max_len, self.request.max_num_seqs, max_num_batched_tokens=batched,
                                      kv_dtype=self.kv_dtype))
        rope = rope_bytes_for(self.model, rope_rows(self.model, max_len, self.rope_capped))
        workspace = int(self.costs.workspace_bytes_per_token * batched)
        scales = kv_scales_bytes(self.model, kv, self.kv_dtype)
        total = self.costs.runtime_bytes + self.weights_bytes + kv + scales + rope + workspace
        peak = total * self.costs.peak_ratio + self.costs.transient_bytes
        high = round_mib(peak * HIGH_HEADROOM)
        limit = round_mib(peak * MAX_HEADROOM)
        return Memory(self.weights_bytes, kv, rope, self.costs.runtime_bytes, workspace, total, high, limit,
                      kv_scales_bytes=scales)

    def largest_fitting(self, budget: int, low: int, cap: int) -> int | None:
        """The largest context ≤ cap (a multiple of 256 from ``low`` up, or cap itself) whose limit fits."""
        if self.at(cap).limit_bytes <= budget:
            return cap
        lo, hi = low, cap
        if lo > hi or self.at(lo).limit_bytes > budget:
            return None
        while hi - lo > 256:
            mid = (lo + hi) // 2 // 256 * 256
            if mid <= lo:
                break
            if self.at(mid).limit_bytes <= budget:
                lo = mid
            else:
                hi = mid
        return lo


def kv_cache(model: ModelFacts, request: Request, memory: Memory, max_model_len: int,
             kv_dtype: KvCacheDtype = KvCacheDtype.AUTO) -> Decided[int]:
    """The KV bytes in the ledger: every sequence at full context, in whole blocks (or as asked)."""
    kv = memory.kv_cache_bytes
    if request.bench.kv_cache_bytes:
        return Decided(kv, Reason("kv_cache_bytes", kv, Source.FLAG, "asked (exact bytes)"))
    detail = (f"{request.max_num_seqs} × {max_model_len} tokens in {BLOCK_SIZE_TOKENS}-token blocks, "
              f"{kv_bytes_per_token_per_layer(model, kv_dtype)} B per token per layer"
              + (f" ({kv_dtype}: one byte per value)" if kv_dtype is not KvCacheDtype.AUTO else "")
              + (f", and {mib(memory.kv_scales_bytes)} of int8 scales beside it (a float32 per token, KV head "
                 "and half)" if memory.kv_scales_bytes else "")
              + (f", sliding-window layers hold their window ({model.sliding_window}) plus one batch"
                 if "sliding_attention" in (model.layer_types or []) else ""))
    return Decided(kv, Reason("kv_cache_bytes", kv, Source.MODEL_CONFIG, detail))


def rope(model: ModelFacts, max_model_len: int, capped: bool) -> Decided[int]:
    """The rows of the RoPE table (the RoPE cap lever's reason)."""
    rows = rope_rows(model, max_model_len, capped)
    detail = (f"capped to max_model_len (vLLM would build {rope_rows_uncapped(model) or max_model_len} rows)"
              if capped else "uncapped: the model's max_position_embeddings, as stock vLLM does")
    return Decided(rows, Reason("rope_rows", rows, Source.MODEL_CONFIG, detail))


def memory_limit(memory: Memory, costs: Costs) -> Decided[int]:
    """MemoryMax (and MemoryHigh): the steady total times the load peak, and any transient work, with headroom."""
    peak = f"total × {costs.peak_what} {costs.peak_ratio:.2f}"
    if costs.transient_bytes:
        peak = f"({peak} + {costs.transient_what} {costs.transient_bytes / MiB:.0f} MiB)"
    return Decided(memory.limit_bytes, Reason(
        "memory_limit", memory.limit_bytes, costs.peak_source,
        f"MemoryMax = {peak} × {MAX_HEADROOM}; MemoryHigh = × {HIGH_HEADROOM}"))


def round_mib(n: float) -> int:
    return int(math.ceil(n / MiB) * MiB)
