"""The numbers the planner tests expect, worked out by hand (no planner code is called here).

The model numbers come from the shapes' config.json (tests/model_shapes/*), the host numbers from
the probe of each fixture tree (tests/fixtures/hosts/*, derived by hand in test_probe_fixtures.py),
the profile numbers from the FROZEN profiles, tests/profiles_frozen/*.yaml (copies of what shipped
when this table was worked out: adding or re-recording a shipped profile does not move it). The
rules the arithmetic follows, with their sources:

- KV per token and layer: 2 (K and V) × KV heads × head_dim × 2 bytes (bf16). vLLM's CPU block is
  128 tokens; a sequence of L tokens takes ceil(L / 128) blocks in a full-attention layer, and the
  pool keeps one null block aside (v1/core/block_pool.py): pool = (ceil(L/128) × seqs + 1) blocks.
- int4 weights (PyTorch's _weight_int4pack_mm_for_cpu, docs/facts.md): a linear layer
  N × K becomes uint8 [N, K/2] plus bf16 scales and zeros [K/g, N, 2], where g is 128 if it divides
  K, else the largest of 64/32 that does (contract/int4_layout.py); every N here is a multiple of 16.
  Embeddings, LM head, norms and biases stay bf16.
- RoPE table: max_model_len rows × head_dim values × 2 bytes (cos and sin halves of rotary_dim).
- Workspace without a measured figure: 4 × (8 × hidden + 4 × intermediate) bytes per batched token,
  batched = min(max_model_len, MAX_BATCHED_TOKENS) (planner/ledger.py: prefill chunks of at most 512 tokens).
- Sliding-window layers (vLLM's SlidingWindowSpec): ceil(min(window − 1 + batched, max_model_len) / 128)
  + 1 blocks per sequence instead of ceil(max_model_len / 128).
- Runtime: one process (single-process topology) × the profile's process_bytes (generic: 640 MiB,
  x86_64-avx2: 700 MiB) or the planner's fallback 640 MiB (the SPR profile has none).
- total = runtime + weights + KV + RoPE + workspace; MemoryHigh = ceil_MiB(total × 1.3 × 1.05),
  MemoryMax = ceil_MiB(total × 1.3 × 1.25) (load peak 1.3: generic's figure, and the planner's
  fallback for the profiles without one). A context fits when MemoryMax ≤ the probe's budget.
- Context: the largest multiple of 256 that fits, capped at 4096 (the default) and at the model's
  max_position_embeddings; below 512 the request is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plan_helpers import (
    LLAMA31_8B,
    MIB,
    MISTRAL_7B,
    QWEN3_8B,
    QWEN3_17B,
    QWEN25_05B,
    SMOLLM2,
    ceil_mib,
)

from edgectl.planner.ledger import MAX_BATCHED_TOKENS

BLOCK = 128


def packed(n: int, k: int, g: int) -> int:
    """int4 bytes of an N × K linear layer with groups of g: N·K/2 packed + K/g · N · 2 (scale, zero) · 2 B."""
    return n * k // 2 + (k // g) * n * 2 * 2


def dense(n: int, k: int) -> int:
    return n * k * 2  # bf16


@dataclass(frozen=True)
class ShapeByHand:
    kv_per_token: int  # all layers, K and V, bf16
    kv_per_token_layer: int
    layers: int
    head_dim: int
    w4a16_bytes: int
    bf16_bytes: int
    workspace_per_token: int
    max_position: int
    sliding_window: int | None = None


# SmolLM2-135M: hidden 576, intermediate 1536, 30 layers, 9 heads × 64, 3 KV heads, vocab 49152, tied.
# K = 576 = 9 × 64 is not a multiple of 128: q/k/v/gate/up use groups of 64; down (K = 1536) uses 128.
_SMOL_LAYER_INT4 = (packed(576, 576, 64) * 2      # q, o: 165888 + 20736 = 186624 each
                    + packed(192, 576, 64) * 2    # k, v: 55296 + 6912 = 62208 each
                    + packed(1536, 576, 64) * 2   # gate, up: 442368 + 55296 = 497664 each
                    + packed(576, 1536, 128))     # down: 442368 + 27648 = 470016   → 1963008 per layer
_SMOL_LAYER_BF16 = (dense(576, 576) * 2 + dense(192, 576) * 2 + dense(1536, 576) * 2
                    + dense(576, 1536))           # 7077888 per layer
_SMOL_REST = 49152 * 576 * 2 + 30 * 2 * 576 * 2 + 576 * 2  # tied embedding 56623104 + norms 70272
SMOL = ShapeByHand(
    kv_per_token=30 * 2 * 3 * 64 * 2,  # 23040
    kv_per_token_layer=2 * 3 * 64 * 2,  # 768
    layers=30, head_dim=64,
    w4a16_bytes=30 * _SMOL_LAYER_INT4 + _SMOL_REST,  # 58890240 + 56693376 = 115583616
    bf16_bytes=30 * _SMOL_LAYER_BF16 + _SMOL_REST,  # 212336640 + 56693376 = 269030016
    workspace_per_token=4 * (8 * 576 + 4 * 1536),  # 43008
    max_position=8192,
)

# Qwen2.5-0.5B: hidden 896, intermediate 4864, 24 layers, 14 heads × 64, 2 KV heads, vocab 151936,
# tied, q/k/v biases. K = 896 = 7 × 128 and K = 4864 = 38 × 128: groups of 128 everywhere.
_Q05_LAYER_INT4 = (packed(896, 896, 128) * 2 + packed(128, 896, 128) * 2 + packed(4864, 896, 128) * 2
                   + packed(896, 4864, 128))  # 426496·2 + 60928·2 + 2315264·3 = 7920640
_Q05_LAYER_BF16 = dense(896, 896) * 2 + dense(128, 896) * 2 + dense(4864, 896) * 2 + dense(896, 4864)
_Q05_REST = (151936 * 896 * 2                    # tied embedding 272269312
             + 24 * ((896 + 128 + 128) * 2 + 2 * 896 * 2)  # q/k/v biases 2304 + norms 3584 per layer
             + 896 * 2)                          # final norm → rest 272412416
QWEN05 = ShapeByHand(
    kv_per_token=24 * 2 * 2 * 64 * 2,  # 12288
    kv_per_token_layer=2 * 2 * 64 * 2,
    layers=24, head_dim=64,
    w4a16_bytes=24 * _Q05_LAYER_INT4 + _Q05_REST,  # 190095360 + 272412416 = 462507776
    bf16_bytes=24 * _Q05_LAYER_BF16 + _Q05_REST,  # 715653120 + 272412416 = 988065536
    workspace_per_token=4 * (8 * 896 + 4 * 4864),  # 106496
    max_position=32768,
)

# Qwen3-1.7B: hidden 2048, intermediate 6144, 28 layers, 16 heads × 128, 8 KV heads, vocab 151936,
# tied, per-head q/k RMSNorm (128 each). K = 2048 and 6144 are multiples of 128.
_Q17_LAYER_INT4 = (packed(2048, 2048, 128) * 2 + packed(1024, 2048, 128) * 2 + packed(6144, 2048, 128) * 2
                   + packed(2048, 6144, 128))  # 2228224·2 + 1114112·2 + 6684672·3 = 26738688
_Q17_LAYER_BF16 = dense(2048, 2048) * 2 + dense(1024, 2048) * 2 + dense(6144, 2048) * 2 + dense(2048, 6144)
_Q17_REST = 151936 * 2048 * 2 + 28 * (2 * 2048 * 2 + 2 * 128 * 2) + 2048 * 2  # 622329856 + 243712 + 4096
QWEN17 = ShapeByHand(
    kv_per_token=28 * 2 * 8 * 128 * 2,  # 114688
    kv_per_token_layer=2 * 8 * 128 * 2,
    layers=28, head_dim=128,
    w4a16_bytes=28 * _Q17_LAYER_INT4 + _Q17_REST,  # 748683264 + 622577664 = 1371260928
    bf16_bytes=28 * _Q17_LAYER_BF16 + _Q17_REST,  # 2818572288 + 622577664 = 3441149952
    workspace_per_token=4 * (8 * 2048 + 4 * 6144),  # 163840
    max_position=40960,
)

# Llama-3.1-8B: hidden 4096, intermediate 14336 (= 112 × 128), 32 layers, 32 heads × 128, 8 KV heads,
# vocab 128256, separate LM head; llama3 RoPE scaling (factor 8, from 8192 positions).
_L8_LAYER_INT4 = (packed(4096, 4096, 128) * 2 + packed(1024, 4096, 128) * 2 + packed(14336, 4096, 128) * 2
                  + packed(4096, 14336, 128))  # 8912896·2 + 2228224·2 + 31195136·3 = 115867648
_L8_LAYER_BF16 = dense(4096, 4096) * 2 + dense(1024, 4096) * 2 + dense(14336, 4096) * 2 + dense(4096, 14336)
_L8_REST = 2 * 128256 * 4096 * 2 + 32 * 2 * 4096 * 2 + 4096 * 2  # embedding + head 2101346304, norms 532480
LLAMA8 = ShapeByHand(
    kv_per_token=32 * 2 * 8 * 128 * 2,  # 131072
    kv_per_token_layer=2 * 8 * 128 * 2,
    layers=32, head_dim=128,
    w4a16_bytes=32 * _L8_LAYER_INT4 + _L8_REST,  # 3707764736 + 2101878784 = 5809643520
    bf16_bytes=32 * _L8_LAYER_BF16 + _L8_REST,  # 13958643712 + 2101878784 = 16060522496
    workspace_per_token=4 * (8 * 4096 + 4 * 14336),  # 360448
    max_position=131072,
)

# Mistral-7B-v0.1: Llama-8B's layers with vocab 32000, a separate head, sliding_window 4096 in
# every layer (no layer_types: every layer slides).
_M7_REST = 2 * 32000 * 4096 * 2 + 32 * 2 * 4096 * 2 + 4096 * 2  # 524288000 + 532480
MISTRAL = ShapeByHand(
    kv_per_token=32 * 2 * 8 * 128 * 2,  # 131072 (what a full-attention stack would take)
    kv_per_token_layer=2 * 8 * 128 * 2,  # 4096
    layers=32, head_dim=128,
    w4a16_bytes=32 * _L8_LAYER_INT4 + _M7_REST,  # 3707764736 + 524820480 = 4232585216
    bf16_bytes=32 * _L8_LAYER_BF16 + _M7_REST,  # 13958643712 + 524820480 = 14483464192
    workspace_per_token=4 * (8 * 4096 + 4 * 14336),  # 360448
    max_position=32768,
    sliding_window=4096,
)

# Qwen3-8B: hidden 4096, intermediate 12288 (= 96 × 128), 36 layers, 32 heads × 128, 8 KV heads,
# vocab 151936, separate head, q/k norms.
_Q8_LAYER_INT4 = (packed(4096, 4096, 128) * 2 + packed(1024, 4096, 128) * 2 + packed(12288, 4096, 128) * 2
                  + packed(4096, 12288, 128))  # 8912896·2 + 2228224·2 + 26738688·3 = 102498304
_Q8_LAYER_BF16 = dense(4096, 4096) * 2 + dense(1024, 4096) * 2 + dense(12288, 4096) * 2 + dense(4096, 12288)
_Q8_REST = 2 * 151936 * 4096 * 2 + 36 * (2 * 4096 * 2 + 2 * 128 * 2) + 4096 * 2  # 2489319424 + 608256 + 8192
QWEN8 = ShapeByHand(
    kv_per_token=36 * 2 * 8 * 128 * 2,  # 147456
    kv_per_token_layer=2 * 8 * 128 * 2,
    layers=36, head_dim=128,
    w4a16_bytes=36 * _Q8_LAYER_INT4 + _Q8_REST,  # 3689938944 + 2489935872 = 6179874816
    bf16_bytes=36 * _Q8_LAYER_BF16 + _Q8_REST,  # 13891534848 + 2489935872 = 16381470720
    workspace_per_token=4 * (8 * 4096 + 4 * 12288),  # 327680
    max_position=40960,
)

BY_HAND = {SMOLLM2: SMOL, QWEN25_05B: QWEN05, QWEN3_17B: QWEN17, LLAMA31_8B: LLAMA8, MISTRAL_7B: MISTRAL,
           QWEN3_8B: QWEN8}


def kv_blocks_per_seq(s: ShapeByHand, max_len: int) -> int:
    """Blocks one sequence holds in one layer."""
    batched = min(max_len, MAX_BATCHED_TOKENS)
    if s.sliding_window:
        # vLLM's SlidingWindowSpec: ceil(min(window − 1 + tokens in flight, max_model_len) / block) + 1
        return math.ceil(min(s.sliding_window - 1 + batched, max_len) / BLOCK) + 1
    return math.ceil(max_len / BLOCK)


def kv_bytes(s: ShapeByHand, max_len: int, seqs: int = 1, kv: str = "bf16") -> int:
    # fp8 and int8 KV: one byte per value instead of bf16's two, the same blocks
    return s.layers * (kv_blocks_per_seq(s, max_len) * seqs + 1) * BLOCK * s.kv_per_token_layer // (1 if kv == "bf16" else 2)


@dataclass(frozen=True)
class Ledger:
    weights: int
    kv: int
    rope: int
    runtime: int
    workspace: int
    total: int
    high: int
    limit: int
    scales: int = 0  # edgectl's int8 KV: a float32 scale per token, KV head and half (4 / head_dim of the KV's bytes)


def ledger(s: ShapeByHand, fmt: str, max_len: int, runtime: int, seqs: int = 1, kv: str = "bf16") -> Ledger:
    """``kv``: bf16, fp8 (vLLM's fp8_e4m3) or int8 (edgectl's)."""
    weights = s.w4a16_bytes if fmt == "w4a16" else s.bf16_bytes
    kv_cache = kv_bytes(s, max_len, seqs, kv)
    scales = kv_cache * 4 // s.head_dim if kv == "int8" else 0
    rope = max_len * s.head_dim * 2
    workspace = s.workspace_per_token * min(max_len, MAX_BATCHED_TOKENS)
    total = runtime + weights + kv_cache + scales + rope + workspace
    return Ledger(weights, kv_cache, rope, runtime, workspace, total, ceil_mib(total * 1.3 * 1.05),
                  ceil_mib(total * 1.3 * 1.25), scales)


@dataclass(frozen=True)
class HostByHand:
    budget: int
    profile: str
    kind: str
    runtime: int
    cpus: tuple[int, ...]
    threads: int
    bind: str  # VLLM_CPU_OMP_THREADS_BIND


GENERIC_PROCESS = 671088640  # profiles_frozen/generic.yaml runtime.process_bytes (640 MiB)
AVX2_PROCESS = 734003200  # profiles_frozen/x86_64-avx2.yaml runtime.process_bytes (700 MiB)
FALLBACK_PROCESS = 640 * MIB  # planner/ledger.py FALLBACK_PROCESS_BYTES, for a profile without the figure
SPR_NODE0 = tuple(range(0, 56)) + tuple(range(112, 168))  # node0/cpulist "0-55,112-167"

HOSTS = {
    # 4 × Cortex-A76, no SMT, no quota; aarch64-neon has no profile → generic; budget from the probe test
    "arm64-board": HostByHand(6755598336, "generic", "fallback", GENERIC_PROCESS, (0, 1, 2, 3), 4, "0-3"),
    # cpuset 2-3; cpu.max 1.5 → floor = 1 thread (SMT: 2 threads per core also gives 2 // 2 = 1);
    # avx512-bf16 has no profile → generic; budget 4 GiB − (1.2 GiB − 400 MiB) − 512 MiB
    "container-cgroup2": HostByHand(2889036596, "generic", "fallback", GENERIC_PROCESS, (2, 3), 1, "2"),
    # taskset 0-11; cfs quota 4 cores → 4 threads; budget 6 GiB − 1.5 GiB − 10 % of 6 GiB
    "host-cgroup1": HostByHand(4187593114, "generic", "fallback", GENERIC_PROCESS, tuple(range(12)), 4, "0-3"),
    # AVX2 + FMA, no AVX-512 → x86_64-avx2; 2 cores
    "kvm-epyc-avx2-2c": HostByHand(22171216692, "x86_64-avx2", "external", AVX2_PROCESS, (0, 1), 2, "0-1"),
    # AVX-512 without BF16 has no profile → generic
    "kvm-xeon-avx512-2c": HostByHand(22171216692, "generic", "fallback", GENERIC_PROCESS, (0, 1), 2, "0-1"),
    # a pod's container: memory.max 2 GiB, cpu.max 2 CPUs of cpuset 0-3 → 2 threads; AVX2 → x86_64-avx2;
    # budget 2 GiB − (40 MiB − 4 MiB inactive file) − 512 MiB
    "k8s-pod-cgroup2": HostByHand(1572864000, "x86_64-avx2", "external", AVX2_PROCESS, (0, 1, 2, 3), 2, "0-1"),
    # cpuid says AVX-512 but the kernel has not enabled it → x86_64-avx2; 4 cores
    "vm-avx512-disabled": HostByHand(13888433767, "x86_64-avx2", "external", AVX2_PROCESS, (0, 1, 2, 3), 4, "0-3"),
    # two NUMA nodes of 56 cores × 2 threads: node 0's CPUs, one thread per core → 56 on CPUs 0-55
    "xeon-spr-amx-2s": HostByHand(523065032704, "x86_64-amx-spr", "external", FALLBACK_PROCESS, SPR_NODE0, 56,
                                  "0-55"),
}
