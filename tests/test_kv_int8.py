"""edgectl's int8 KV (``--kv-cache-dtype int8``): what the planner makes of it (pure) and the plugin's
attention over it for calls that are not decode steps (a prompt, a chunk after cached tokens, a
batch mixing both), against attention computed from the keys and values before they were written.
The kernels themselves: tests/test_ops_kv_int8.py; the engine: tests/test_vision_engine.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from plan_helpers import (
    MISTRAL_7B,
    SMOLLM2,
    host_facts,
    make_plan,
    reasons_by_decision,
    shape,
)

from edgectl.contract import environment
from edgectl.contract.effective import mismatches
from edgectl.contract.plan import KvCacheDtype, Plan
from edgectl.contract.vllm_args import server_args
from edgectl.errors import EdgectlError

AMX = "xeon-spr-amx-2s"
AVX2 = "kvm-epyc-avx2-2c"


@pytest.mark.parametrize("host", [AMX, AVX2])
def test_an_int8_plan_allocates_one_byte_a_value_plans_its_scales_and_turns_the_kernel_on(host):
    bf16 = make_plan(host_facts(host), shape(SMOLLM2))
    int8 = make_plan(host_facts(host), shape(SMOLLM2), kv_cache_dtype="int8")  # AVX2 too: edgectl's kernels
    assert int8.kv_cache_dtype is KvCacheDtype.INT8 and int8.max_model_len == bf16.max_model_len
    assert int8.kv_cache_bytes * 2 == bf16.kv_cache_bytes
    # a float32 per token, KV head and half beside 64 one-byte values: 1/16 of vLLM's bytes, in the total
    assert int8.memory.kv_scales_bytes * 16 == int8.kv_cache_bytes
    assert bf16.memory.total_bytes - int8.memory.total_bytes == int8.kv_cache_bytes - int8.memory.kv_scales_bytes
    args = server_args(int8)
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"  # vLLM's one-byte allocation
    env = environment.runtime_levers(int8)
    assert (env["EDGECTL_KV_INT8"], env["EDGECTL_DECODE_ATTENTION"]) == ("1", "1")
    assert environment.runtime_levers(bf16)["EDGECTL_KV_INT8"] == "0"
    (why,) = reasons_by_decision(int8)["decode_attention"]
    assert why["value"] is True and "int8" in why["detail"]
    (kv,) = reasons_by_decision(int8)["kv_cache_bytes"]
    assert "int8 scales" in kv["detail"]
    # the plan's JSON carries the scales (and a plan without them reads as it did before)
    assert Plan.from_dict(int8.to_dict()) == int8 and Plan.from_dict(bf16.to_dict()) == bf16
    assert "kv_scales_bytes" in int8.to_dict()["memory"] and "kv_scales_bytes" not in bf16.to_dict()["memory"]


def test_int8_is_refused_where_its_kernel_cannot_read_every_layer():
    # Mistral-7B v0.1 windows every layer
    with pytest.raises(EdgectlError, match="^--kv-cache-dtype int8 cannot run here: .*sliding.*; use --kv-cache-dtype auto$"):
        make_plan(host_facts(AMX), shape(MISTRAL_7B), kv_cache_dtype="int8")
    # the decode attention asked off
    with pytest.raises(EdgectlError, match="decode attention only, which this request turns off"):
        make_plan(host_facts(AMX), shape(SMOLLM2), kv_cache_dtype="int8", decode_attention=False)
    # a host edgectl's kernels do not run on (no vector build for arm64 yet): refused, not planned and left unread
    with pytest.raises(EdgectlError, match="^--kv-cache-dtype int8 cannot run here: edgectl's int8 KV is written and "
                                           "read by its kernels: .*aarch64"):
        make_plan(host_facts("arm64-board"), shape(SMOLLM2), kv_cache_dtype="int8")


def test_the_read_back_must_say_int8():
    p = make_plan(host_facts(AMX), shape(SMOLLM2), kv_cache_dtype="int8")
    good = {"kv_cache_dtype": ["int8"], "kv_tensor_dtypes": ["uint8"], "kv_cache_bytes": p.kv_cache_bytes}
    assert not [m for m in mismatches(p, good) if "KV" in m]
    # vLLM's own fp8 (the plugin's int8 not installed) is a different KV, said so
    bad = {**good, "kv_cache_dtype": ["fp8_e4m3"]}
    assert any("the plan says int8" in m for m in mismatches(p, bad))


# -- the plugin's attention for calls that are not pure decode steps ---------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def ops():
    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    assert ok, why
    ops.load({})
    return ops


def _layer(heads, kv_heads, dim, blocks, block_size):
    """A decoder attention impl as far as kv_int8 reads it, and its uint8 cache (vLLM's fp8 allocation)."""
    impl = SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_size=dim, scale=dim ** -0.5)
    cache = torch.full((blocks, kv_heads, block_size, 2 * dim), 0x7F, dtype=torch.uint8)
    return impl, cache


def test_a_batch_of_a_prompt_a_chunk_and_a_decode_step_attends_as_the_inputs_say(ops):
    from edgectl_runtime.vllm_plugin import kv_int8

    heads, kv_heads, dim, block_size = 9, 3, 64, 32
    impl, cache = _layer(heads, kv_heads, dim, 16, block_size)
    gen = torch.Generator().manual_seed(0)
    # sequence 0: a fresh prompt of 40; 1: 50 cached, then a chunk of 30; 2: 70 cached, then one token
    cached, new = [0, 50, 70], [40, 30, 1]
    tables = torch.tensor([[3, 9, 0, 0], [1, 4, 12, 0], [7, 2, 5, 0]], dtype=torch.int32)
    keys = [torch.randn(c + n, kv_heads, dim, generator=gen).to(torch.bfloat16) for c, n in zip(cached, new)]
    values = [torch.randn(c + n, kv_heads, dim, generator=gen).to(torch.bfloat16) for c, n in zip(cached, new)]
    views = kv_int8._views(impl, cache)

    def slots(s, positions):
        t = torch.as_tensor(positions)
        return tables[s, t // block_size].long() * block_size + t % block_size

    for s in range(3):  # the cached tokens, written by earlier steps
        if cached[s]:
            torch.ops.edgectl.kv_write_int8(keys[s][:cached[s]], values[s][:cached[s]], *views,
                                            slots(s, range(cached[s])))
    # this step: every sequence's new tokens written, then one attention call for the batch
    step_keys = torch.cat([k[c:] for k, c in zip(keys, cached)])
    step_values = torch.cat([v[c:] for v, c in zip(values, cached)])
    step_slots = torch.cat([slots(s, range(cached[s], cached[s] + new[s])) for s in range(3)])
    torch.ops.edgectl.kv_write_int8(step_keys, step_values, *views, step_slots)
    query = torch.randn(sum(new), heads, dim, generator=gen).to(torch.bfloat16)
    starts = torch.tensor([0, 40, 70, 71], dtype=torch.int32)
    meta = SimpleNamespace(num_actual_tokens=sum(new), max_query_len=40, query_start_loc=starts,
                           seq_lens=torch.tensor([c + n for c, n in zip(cached, new)], dtype=torch.int32),
                           block_table=tables)
    output = torch.full_like(query, float("nan"))
    kv_int8.forward(impl, query, cache, meta, output)

    group = heads // kv_heads
    for s in range(3):
        q = query[starts[s]:starts[s + 1]].double().reshape(-1, kv_heads, group, dim)
        scores = torch.einsum("qhgd,nhd->qhgn", q, keys[s].double()) * impl.scale
        position = torch.arange(cached[s], cached[s] + new[s])  # of each query: it sees keys up to itself
        later = torch.arange(len(keys[s]))[None, :] > position[:, None]
        p = torch.softmax(scores.masked_fill(later[:, None, None, :], float("-inf")), dim=-1)
        want = torch.einsum("qhgn,nhd->qhgd", p, values[s].double()).reshape(new[s], heads, dim)
        got = output[starts[s]:starts[s + 1]].double()
        # int8 keys and values (a step of max|x| / 127 per row), bf16 arithmetic in the prompt's attention
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.03, msg=f"sequence {s}")
