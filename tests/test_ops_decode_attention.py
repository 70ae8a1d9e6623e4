"""edgectl's decode attention (``torch.ops.edgectl.decode_attention``, csrc ``decode_attention``) at every
ISA level this CPU can run, on caches **written by vLLM's own CPU op** (``cpu_attn_reshape_and_cache``,
its "vec" layout: keys column-major in a block, values row-major), against

- the plain-PyTorch reference (ops/reference.py) of that layout, and
- attention computed from the keys and values as they were before vLLM wrote them (so a wrong
  reading of vLLM's layout, in the kernel and the reference alike, fails), and
- vLLM's own attention op on the same caches.

No timing here (scripts/study/decode_attention.py measures it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
vllm_ops = pytest.importorskip("vllm._custom_ops")

from kernel_levels import runnable_levels  # noqa: E402

from edgectl_runtime.kernels import ops  # noqa: E402
from edgectl_runtime.kernels.ops import reference  # noqa: E402

pytestmark = pytest.mark.isa_avx2  # the AVX2 tier runs the scalar and AVX2 levels again, held to AVX2 (~2 s)


@pytest.fixture(scope="module", autouse=True)
def library():
    ok, why = ops.available()  # loads the library: a missing or stale build is a failure, not a skip
    assert ok, why


class Case:
    """Keys, values and a query per sequence, written into one vLLM cache tensor
    ``[blocks, kv_heads, 2 * block_size, dim]`` by vLLM's op through a shuffled block table; every
    slot no sequence uses holds garbage (large values), which must not be read."""

    def __init__(self, seq_lens, heads, kv_heads, dim, block_size, seed=0, spread=1.0):
        gen = torch.Generator().manual_seed(seed)
        per_seq = [-(-n // block_size) for n in seq_lens]
        total = sum(per_seq) + 3
        self.cache = (torch.randn(total, kv_heads, 2 * block_size, dim, generator=gen) * 1e3).to(torch.bfloat16)
        self.key_cache, self.value_cache = self.cache.chunk(2, dim=2)
        order = torch.randperm(total, generator=gen)
        self.table = torch.zeros(len(seq_lens), max(per_seq + [1]) + 2, dtype=torch.int32)
        self.keys, self.values = [], []
        used = 0
        for s, (n, blocks) in enumerate(zip(seq_lens, per_seq)):
            self.table[s, :blocks] = order[used:used + blocks].to(torch.int32)
            used += blocks
            key = (torch.randn(n, kv_heads, dim, generator=gen) * spread).to(torch.bfloat16)
            value = torch.randn(n, kv_heads, dim, generator=gen).to(torch.bfloat16)
            t = torch.arange(n)
            slots = (self.table[s, t // block_size].long() * block_size + t % block_size)
            vllm_ops.cpu_attn_reshape_and_cache(key, value, self.key_cache, self.value_cache, slots, "vec",
                                                k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
            self.keys.append(key)
            self.values.append(value)
        self.query = (torch.randn(len(seq_lens), heads, dim, generator=gen) * spread).to(torch.bfloat16)
        self.lens = torch.tensor(seq_lens, dtype=torch.int32)
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim

    def edgectl(self, scale):
        out = torch.full_like(self.query, float("nan"))
        torch.ops.edgectl.decode_attention(self.query, self.key_cache, self.value_cache, out, self.lens, self.table,
                                           scale)
        return out

    def from_inputs(self, scale):
        """Attention from the keys and values before vLLM wrote them (float64)."""
        out = torch.zeros_like(self.query)
        group = self.heads // self.kv_heads
        for s, (key, value) in enumerate(zip(self.keys, self.values)):
            if len(key) == 0:
                continue
            q = self.query[s].double().reshape(self.kv_heads, group, self.dim)
            p = torch.softmax(torch.einsum("hgd,nhd->hgn", q, key.double()) * scale, dim=-1)
            out[s] = torch.einsum("hgn,nhd->hgd", p, value.double()).reshape(self.heads, self.dim).to(out.dtype)
        return out

    def vllm(self, scale):
        out = torch.empty_like(self.query)
        starts = torch.arange(len(self.lens) + 1, dtype=torch.int32)
        meta = vllm_ops.cpu_attn_get_scheduler_metadata(len(self.lens), self.heads, self.kv_heads, self.dim, self.lens,
                                                        torch.bfloat16, starts, True, -1, "vec", True, None, "auto")
        vllm_ops.cpu_attention_with_kv_cache(self.query, self.key_cache, self.value_cache, out, starts, self.lens,
                                             scale, True, None, -1, self.table, 0.0, meta, None, None, 1.0, 1.0, "auto")
        return out


def _close(got, want):
    # bf16 out: one rounding is 2^-8 relative; averages of many random values are small (~0.1), so
    # the absolute bound is what catches a wrong scale (0.125 for 0.13 moves them by ~1e-2)
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=2e-3)


# (seq_lens, heads, kv_heads, dim, block_size): SmolLM2's 9/3 heads of 64 (the vision shape model's
# language model) over vLLM's default block of 128 and a long context; one token; partial last
# blocks and several sequences of different lengths; MHA and GQA groups of 1..8; head sizes 32..256;
# blocks of 32 and 128 (vLLM's "vec" attention takes multiples of 32).
CASES = (
    ((1150,), 9, 3, 64, 128),
    ((1,), 9, 3, 64, 128),
    ((127, 128, 129, 5), 9, 3, 64, 128),
    ((300, 17), 8, 8, 128, 32),
    ((64, 1000), 8, 1, 128, 128),
    ((77,), 4, 2, 96, 32),
    ((200,), 4, 4, 32, 32),
    ((90,), 2, 1, 256, 32),
)


@pytest.mark.parametrize("seq_lens,heads,kv_heads,dim,block_size", CASES)
def test_decode_attention_reads_vllms_cache(kernel_level, seq_lens, heads, kv_heads, dim, block_size):
    case = Case(seq_lens, heads, kv_heads, dim, block_size)
    scale = dim ** -0.5
    got = case.edgectl(scale)
    _close(got, case.from_inputs(scale))
    _close(got, reference.decode_attention(case.query, case.key_cache, case.value_cache, case.lens, case.table, scale))
    _close(got, case.vllm(scale))


def test_peaked_scores_and_an_empty_sequence(kernel_level):
    """Scores far apart (the softmax is nearly one-hot, the exponential's clamp is met) and a
    sequence of no tokens (zeros, as the reference)."""
    case = Case((500, 0, 33), 9, 3, 64, 128, seed=3, spread=6.0)
    got = case.edgectl(1.0)
    _close(got, case.from_inputs(1.0))
    assert torch.equal(got[1], torch.zeros_like(got[1]))


def test_every_level_gives_the_same_answer():
    """The levels differ only in rounding (the exponential, the order of sums)."""
    case = Case((700, 3), 9, 3, 64, 128, seed=5)
    outs = {}
    for lv in runnable_levels():
        with ops.use_level(lv):
            outs[lv] = case.edgectl(0.125).float()
    for lv, out in outs.items():
        torch.testing.assert_close(out, outs["scalar"], rtol=8e-3, atol=2e-3, msg=f"{lv} against scalar")


@pytest.mark.parametrize("change,message", [
    (lambda q, k, v, o, l, t: (q.float(), k, v, o, l, t), "must be bfloat16"),
    (lambda q, k, v, o, l, t: (q[:, :7], k, v, o[:, :7], l, t), "multiple"),
    (lambda q, k, v, o, l, t: (q, k, v, o, l.long(), t), "seq_lens must be int32"),
    (lambda q, k, v, o, l, t: (q, k, v, o, l + 10_000, t), "block table of"),
    (lambda q, k, v, o, l, t: (q, k, v[:, :, :5], o, l, t), "same strides"),
])
def test_bad_input_is_a_clear_error(change, message):
    case = Case((50,), 9, 3, 64, 32)
    args = change(case.query, case.key_cache, case.value_cache, torch.empty_like(case.query), case.lens, case.table)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.edgectl.decode_attention(*args, 0.125)
