"""What vLLM's two CPU attention ops cost a decode step above their C++: the KV write
(``cpu_attn_reshape_and_cache``) and the attention (``cpu_attention_with_kv_cache``) called as vLLM's
C++ ops alone ("raw"), through vLLM's Python wrappers with the cache's views made as its forward makes
them ("py"), and through a Python custom op of the same schema as vLLM's ``unified_kv_cache_update`` /
``unified_attention_with_output`` ("op", the dispatcher's Python kernel on top; vLLM's forward-context
look-ups are not in it, so the real ops cost more). One token, SmolLM2-135M's attention shape (9 query
heads, 3 KV heads of 64), 600 tokens of context; microseconds a call, the median of 5 timings of 3000
calls. docs/kernels.md "On x86_64-amx the C++ wrapper pays". ISA=amx (default, needs AMX) or vec.

    OMP_NUM_THREADS=2 /opt/edgectl/venv/bin/python scripts/study/attention_op_cost.py
"""
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
import torch

torch.cpu._init_amx()  # vLLM's AMX kernel needs the tile permission (vllm_plugin/__init__.py request_amx)
import vllm._custom_ops as ops  # noqa  (loads _C)
torch.manual_seed(0)
H, KVH, D, BS, NB, L = 9, 3, 64, 128, 40, 600
isa = os.environ.get("ISA", "amx")
kv = torch.zeros(NB, KVH, BS, 2 * D, dtype=torch.bfloat16)
q = torch.randn(1, H, D, dtype=torch.bfloat16); k = torch.randn(1, KVH, D, dtype=torch.bfloat16); v = torch.randn(1, KVH, D, dtype=torch.bfloat16)
out = torch.empty(1, H, D, dtype=torch.bfloat16)
qsl = torch.tensor([0, 1], dtype=torch.int32); seq = torch.tensor([L], dtype=torch.int32)
bt = torch.arange(8, dtype=torch.int32).view(1, 8); slot = torch.tensor([L - 1], dtype=torch.int64)
sm = ops.cpu_attn_get_scheduler_metadata(num_reqs=1, num_heads=H, num_kv_heads=KVH, head_dim=D, seq_lens=seq,
        dtype=torch.bfloat16, query_start_loc=qsl, causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=False, dynamic_causal=None, kv_cache_dtype="auto")
def halves():
    nb, kvh, bs, _ = kv.size(); c = kv.view((nb, kvh, bs * 2, -1)); return c.chunk(2, dim=2)
kc, vc = halves()
def raw_update(): torch.ops._C.cpu_attn_reshape_and_cache(k, v, kc, vc, slot, isa, 1.0, 1.0, "auto")
def raw_attn(): torch.ops._C.cpu_attention_with_kv_cache(q, kc, vc, out, qsl, seq, 0.125, True, None, -1, bt, 0.0, sm, None, None, 1.0, 1.0, "auto")
def py_update():
    a, b = halves(); ops.cpu_attn_reshape_and_cache(k[:1], v[:1], a, b, slot, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
def py_attn():
    a, b = halves(); ops.cpu_attention_with_kv_cache(query=q[:1], key_cache=a, value_cache=b, output=out[:1], query_start_loc=qsl, seq_lens=seq, scale=0.125, causal=True, alibi_slopes=None, sliding_window=-1, block_table=bt, softcap=0.0, scheduler_metadata=sm, s_aux=None, dynamic_causal=None, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
lib = torch.library.Library("mbtest", "FRAGMENT")
lib.define("upd(Tensor k, Tensor v, str name) -> Tensor")
lib.define("att(Tensor q, Tensor k, Tensor v, Tensor(a!) out, str name, Tensor? s=None, Tensor? t=None, Tensor? dep=None) -> ()")
def upd_impl(kk, vv, name): py_update(); return torch.empty(0)
def att_impl(qq, kk, vv, o, name, s=None, t=None, dep=None): py_attn()
lib.impl("upd", upd_impl, "CPU"); lib.impl("att", att_impl, "CPU")
def op_update(): return torch.ops.mbtest.upd.default(k, v, "model.layers.0.self_attn.attn")
def op_attn(): torch.ops.mbtest.att.default(q, k, v, out, "model.layers.0.self_attn.attn", None, None, None)
def empty_op(): pass
def t(f, n=3000):
    for _ in range(200): f()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): f()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(best)[2]
for name, f in [("raw update", raw_update), ("raw attn", raw_attn), ("py update", py_update), ("py attn", py_attn),
                ("op update", op_update), ("op attn", op_attn)]:
    print(f"{name:12s} {t(f):7.2f} us")
