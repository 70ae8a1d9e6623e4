"""The lean path into vLLM's CPU attention (runtime/edgectl_runtime/vllm_plugin/lean_attention.py) against
vLLM's own methods, on real tensors and vLLM's real C++ ops: the same KV cache written bit for bit and the
same attention output bit for bit, for decode steps, a prefill beside a decode, a padded step, in every KV
layout vLLM picks on this CPU ("vec", and "amx" where the CPU has AMX); calls the lean path does not take
(an encoder layer's, a layer with attention sinks, a warm-up call without metadata) go to vLLM's methods.

vLLM's attention layer module is stood in for by the three attributes the methods read (``isa`` and the
two KV scales): building a real one needs a whole engine config. No timing here (the bench's
``vllm-attention-calls`` arm measures it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
cpu_attn = pytest.importorskip("vllm.v1.attention.backends.cpu_attn")

from vllm import _custom_ops as vllm_ops  # noqa: E402
from vllm import envs as vllm_envs  # noqa: E402
from vllm.v1.attention.backend import AttentionType  # noqa: E402

from edgectl_runtime.vllm_plugin import lean_attention  # noqa: E402

pytestmark = pytest.mark.isa_avx2  # the AVX2 tier runs it held to AVX2 (< 1 s)

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 32  # SmolLM2's heads; vLLM's "vec" and "amx" take blocks of 32
ISAS = ["vec"] + (["amx"] if torch.cpu._is_amx_tile_supported() and torch.cpu._init_amx() else [])
CLS = cpu_attn.CPUAttentionBackendImpl


@pytest.fixture
def methods(monkeypatch):
    """vLLM's two methods, then the lean ones installed on the class; the class restored afterwards."""
    vllm_forward, vllm_update = CLS.forward, CLS.do_kv_cache_update
    # the impl asks the current engine config for the model's dtype (its encoder path); none exists here
    monkeypatch.setattr(cpu_attn, "get_current_vllm_config",
                        lambda: SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16)))
    assert lean_attention.install({"EDGECTL_LEAN_ATTENTION": "1"})
    try:
        yield SimpleNamespace(vllm_forward=vllm_forward, vllm_update=vllm_update)
    finally:
        CLS.forward, CLS.do_kv_cache_update = vllm_forward, vllm_update
        lean_attention._ORIGINAL.clear()
        lean_attention._DECODER.clear()


def impl(attn_type=AttentionType.DECODER, sinks=None):
    return CLS(HEADS, DIM, DIM ** -0.5, KV_HEADS, None, None, "auto", attn_type=attn_type, sinks=sinks)


class Step:
    """One engine step over sequences whose contexts are ``seq_lens``, the last ``new`` tokens of each new in
    this step (1: a decode step); ``pad`` rows of garbage after the step's tokens, as a padded batch has."""

    def __init__(self, seq_lens, new, isa, pad=0, seed=0):
        gen = torch.Generator().manual_seed(seed)
        per_seq = [-(-n // BLOCK) for n in seq_lens]
        order = torch.randperm(sum(per_seq) + 2, generator=gen)
        self.cache = torch.zeros(len(order), KV_HEADS, BLOCK, 2 * DIM, dtype=torch.bfloat16)
        self.table = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int32)
        used, slots, context_slots = 0, [], []
        for s, (n, blocks) in enumerate(zip(seq_lens, per_seq)):
            self.table[s, :blocks] = order[used:used + blocks].to(torch.int32)
            used += blocks
            t = torch.arange(n)
            seq_slots = self.table[s, t // BLOCK].long() * BLOCK + t % BLOCK
            context_slots.append(seq_slots[:n - new[s]])
            slots.append(seq_slots[n - new[s]:])
        self.slots, self.context_slots = torch.cat(slots), torch.cat(context_slots)
        tokens = len(self.slots)

        def rows(n):
            return torch.randn(n, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)

        self.context_key, self.context_value = rows(len(self.context_slots)), rows(len(self.context_slots))
        self.key, self.value = rows(tokens + pad), rows(tokens + pad)
        self.query = torch.randn(tokens + pad, HEADS, DIM, generator=gen).to(torch.bfloat16)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        starts = torch.tensor([0, *torch.cumsum(torch.tensor(new), 0).tolist()], dtype=torch.int32)
        split = bool(vllm_envs.VLLM_CPU_ATTN_SPLIT_KV)  # as vLLM's metadata builder asks
        scheduler = vllm_ops.cpu_attn_get_scheduler_metadata(
            len(seq_lens), HEADS, KV_HEADS, DIM, lens, torch.bfloat16, starts, True, -1, isa, split, None, "auto")
        self.meta = cpu_attn.CPUAttentionMetadata(
            num_actual_tokens=tokens, max_query_len=max(new), query_start_loc=starts, max_seq_len=max(seq_lens),
            seq_lens=lens, block_table=self.table, slot_mapping=self.slots, scheduler_metadata=scheduler)
        self.layer = SimpleNamespace(isa=isa, _k_scale_float=1.0, _v_scale_float=1.0)

    def run(self, forward, update, attention):
        """The KV cache and output after the context was written by vLLM and this step by ``update`` and
        ``forward`` (the output starts as 7s: rows the step does not own must stay so)."""
        cache = self.cache.clone()
        self.write(cache)
        tokens = self.meta.num_actual_tokens
        update(attention, self.layer, self.key[:tokens], self.value[:tokens], cache, self.slots)
        output = torch.full_like(self.query, 7.0)
        returned = forward(attention, self.layer, self.query, self.key, self.value, cache, self.meta, output)
        assert returned is output
        return cache, output

    def write(self, cache):
        key_cache, value_cache = cache.view(cache.size(0), KV_HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)
        vllm_ops.cpu_attn_reshape_and_cache(self.context_key, self.context_value, key_cache, value_cache,
                                            self.context_slots, self.layer.isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("seq_lens", "new", "pad"), [
    ((5, 130, 40), (1, 1, 1), 0),  # a decode step of three sequences
    ((1,), (1,), 0),  # the first token
    ((70, 129), (1, 1), 3),  # a padded decode step
    ((37, 60), (37, 1), 0),  # a whole prompt beside a decode
    ((100,), (36,), 2),  # a prompt's last chunk over its first, padded
])
def test_the_lean_path_writes_and_attends_as_vllms_methods_do(methods, isa, seq_lens, new, pad):
    step, attention = Step(seq_lens, new, isa, pad), impl()
    before = lean_attention.counts()["calls"]["lean"]
    want_cache, want = step.run(methods.vllm_forward, methods.vllm_update, attention)
    got_cache, got = step.run(CLS.forward, CLS.do_kv_cache_update, attention)
    assert torch.equal(got_cache, want_cache)
    assert torch.equal(got, want)
    assert not torch.equal(want_cache, step.cache) and torch.all(want[step.meta.num_actual_tokens:] == 7.0)
    assert lean_attention.counts() == {"path": "lean", "calls": {"lean": before + 1,
                                                                 "vllm": lean_attention.counts()["calls"]["vllm"]}}


def test_calls_the_lean_path_does_not_take_go_to_vllms_methods(methods):
    step = Step((40,), (1,), "vec")
    taken = []
    # vLLM's methods as the lean path calls them, counted (the fixture clears them afterwards)
    lean_attention._ORIGINAL.update(forward=lambda *a, **k: taken.append("forward") or methods.vllm_forward(*a, **k),
                                    update=lambda *a, **k: taken.append("update") or methods.vllm_update(*a, **k))
    calls = dict(lean_attention.counts()["calls"])
    step.run(CLS.forward, CLS.do_kv_cache_update, impl(sinks=torch.zeros(HEADS)))  # attention sinks
    assert taken == ["forward"]  # its KV write is a decoder's, the same as without sinks
    taken.clear()
    encoder = impl(attn_type=AttentionType.ENCODER_ONLY)
    CLS.do_kv_cache_update(encoder, step.layer, step.key, step.value, step.cache.clone(), step.slots)
    assert taken == ["update"]
    out = torch.zeros_like(step.query)
    assert CLS.forward(impl(), step.layer, step.query, step.key, step.value, step.cache, None, out) is out  # warm-up
    assert lean_attention.counts()["calls"] == {"lean": calls["lean"], "vllm": calls["vllm"] + 1}


def test_off_unless_asked():
    assert lean_attention.install({}) is False and lean_attention.install({"EDGECTL_LEAN_ATTENTION": "0"}) is False
    assert lean_attention.counts()["path"] == "vllm"
