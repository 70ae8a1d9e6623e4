"""Decode attention alone, vLLM's CPU op against edgectl's (``torch.ops.edgectl.decode_attention``),
for one query token over a context of 20, 1150 and 2300 tokens: 30 layers of SmolLM2-135M's shape
(9 query heads, 3 KV heads of 64), each layer its own KV in vLLM's cache layout (one tensor
``[blocks, kv_heads, 2 * block_size, 64]`` viewed as its key and value halves), a 256 MB buffer
touched between tokens to stand for the weights a decode step streams between layers (every
FLUSH_EVERY tokens; 1, the default, is what the engine sees: the KV comes from memory each step).
The two ops take turns token by token (interleaved), on the same caches. Prints the median and
min ms per token (30 layers) over 36 timed tokens of each. docs/vision.md "Where the image costs
decode time". Environment: SPLIT=0 turns vLLM's KV split across threads off; KVD=fp8_e4m3 for
vLLM with fp8 KV (edgectl's bf16 op not run then); edgectl's int8 KV (``decode_attention_int8``, its
own caches written by ``kv_write_int8``) runs in every case; BS the KV block size (vLLM's CPU
default, 128, unless set); OMP_NUM_THREADS (2 unless set); EDGECTL_KERNEL_ISA as for the engine.

    /opt/edgectl/venv/bin/python scripts/study/decode_attention.py
"""
import os
import statistics
import time

import torch
from vllm import _custom_ops as ops

from edgectl_runtime.kernels import ops as edgectl_ops

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
SPLIT = os.environ.get("SPLIT", "1") == "1"
KVD = os.environ.get("KVD", "auto")
FLUSH_EVERY = int(os.environ.get("FLUSH_EVERY", "1"))
LAYERS, HQ, HKV, D, BS = 30, 9, 3, 64, int(os.environ.get("BS", "128"))
FLUSH = torch.empty(256 << 20, dtype=torch.uint8)
LEVEL = edgectl_ops.load()


def per_token_ms(seq: int) -> dict[str, tuple[float, float]]:
    blocks = (seq + BS - 1) // BS
    cache_dtype = torch.bfloat16 if KVD == "auto" else torch.uint8
    caches = [torch.zeros(blocks, HKV, 2 * BS, D, dtype=cache_dtype) for _ in range(LAYERS)]
    for c in caches:
        c.normal_() if cache_dtype == torch.bfloat16 else c.random_(0, 100)
    halves = [c.chunk(2, dim=2) for c in caches]
    q = torch.randn(1, HQ, D, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    lens = torch.tensor([seq], dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32).unsqueeze(0)
    meta = ops.cpu_attn_get_scheduler_metadata(1, HQ, HKV, D, lens, torch.bfloat16, starts, True, -1, "vec",
                                               SPLIT, None, KVD)

    def vllm_op():
        for k, v in halves:
            ops.cpu_attention_with_kv_cache(q, k, v, out, starts, lens, D ** -0.5, True, None, -1, table, 0.0,
                                            meta, None, None, 1.0, 1.0, KVD)

    def edgectl_op():
        for k, v in halves:
            torch.ops.edgectl.decode_attention(q, k, v, out, lens, table, D ** -0.5)

    # edgectl's int8 KV: the same shape, written by its own op from random keys and values (real scales)
    int8 = [torch.zeros(blocks, HKV, 2 * BS, D, dtype=torch.int8).chunk(2, dim=2) for _ in range(LAYERS)]
    scales = [torch.zeros(blocks, HKV, 2, BS) for _ in range(LAYERS)]
    slots = torch.arange(seq, dtype=torch.int64)
    for (k8, v8), sc in zip(int8, scales):
        kv = torch.randn(2, seq, HKV, D, dtype=torch.bfloat16)
        torch.ops.edgectl.kv_write_int8(kv[0], kv[1], k8, v8, sc, slots)

    def edgectl_int8_op():
        for (k8, v8), sc in zip(int8, scales):
            torch.ops.edgectl.decode_attention_int8(q, k8, v8, sc, out, lens, table, D ** -0.5)

    arms = {"vllm": vllm_op} if KVD != "auto" else {"vllm": vllm_op, f"edgectl-{LEVEL}": edgectl_op}
    arms[f"edgectl-int8-{LEVEL}"] = edgectl_int8_op
    times: dict[str, list[float]] = {name: [] for name in arms}
    for token in range(40):
        for name, run in arms.items():
            if token % FLUSH_EVERY == 0:
                FLUSH.add_(1)
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(t[4:]) * 1e3, min(t[4:]) * 1e3) for name, t in times.items()}


for seq in (20, 1150, 2300):
    for name, (med, low) in per_token_ms(seq).items():
        print(f"{name:18s} split={int(SPLIT)} kv={KVD} block={BS} seq {seq}: {med:.3f} ms per token (30 layers), "
              f"min {low:.3f}", flush=True)
