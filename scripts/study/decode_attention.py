"""vLLM's CPU decode attention alone, for one query token over a context of 20, 1150 and 2300
tokens: 30 layers of SmolLM2-135M's shape (9 query heads, 3 KV heads of 64), each layer its own KV,
a 256 MB buffer touched every 4 tokens to stand for the weights a step streams between layers.
Prints the median and min ms per token (30 layers) over 36 timed tokens. docs/vision.md "Where the
image costs decode time". Environment: SPLIT=0 turns vLLM's KV split across threads off; KVD=fp8_e4m3
for fp8 KV; BS the KV block size (vLLM's CPU default 128; 32 here unless set); OMP_NUM_THREADS.

    OMP_NUM_THREADS=2 /opt/edgectl/venv/bin/python scripts/study/decode_attention.py
"""
import os
import statistics
import time

import torch
from vllm import _custom_ops as ops

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
SPLIT = os.environ.get("SPLIT", "1") == "1"
KVD = os.environ.get("KVD", "auto")
LAYERS, HQ, HKV, D, BS = 30, 9, 3, 64, int(os.environ.get("BS", "32"))
FLUSH = torch.empty(256 << 20, dtype=torch.uint8)


def per_token_ms(seq: int) -> tuple[float, float]:
    blocks = (seq + BS - 1) // BS
    cache_dtype = torch.bfloat16 if KVD == "auto" else torch.uint8
    caches = [torch.zeros(2, blocks, HKV, BS, D, dtype=cache_dtype) for _ in range(LAYERS)]
    for c in caches:
        c.normal_() if cache_dtype == torch.bfloat16 else c.random_(0, 100)
    q = torch.randn(1, HQ, D, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    lens = torch.tensor([seq], dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32).unsqueeze(0)
    meta = ops.cpu_attn_get_scheduler_metadata(1, HQ, HKV, D, lens, torch.bfloat16, starts, True, -1, "vec",
                                               SPLIT, None, KVD)
    times = []
    for token in range(40):
        if token % 4 == 0:
            FLUSH.add_(1)
        t0 = time.perf_counter()
        for c in caches:
            ops.cpu_attention_with_kv_cache(q, c[0], c[1], out, starts, lens, D ** -0.5, True, None, -1, table, 0.0,
                                            meta, None, None, 1.0, 1.0, KVD)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[4:]) * 1e3, min(times[4:]) * 1e3


for seq in (20, 1150, 2300):
    med, low = per_token_ms(seq)
    print(f"split={int(SPLIT)} kv={KVD} seq {seq}: {med:.3f} ms per token (30 layers), min {low:.3f}", flush=True)
