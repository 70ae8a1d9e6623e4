"""edgectl's decode attention (``torch.ops.edgectl.decode_attention``, csrc ``decode_attention``) against
its plain-PyTorch reference (ops/reference.py), at every ISA level this CPU can run, on vLLM's
CPU_ATTN cache layout: one cache tensor ``[blocks, kv_heads, block_size, 2 * dim]`` viewed as
its key and value halves, exactly as vllm/v1/attention/backends/cpu_attn.py hands them over.
No timing here (scripts/study/decode_attention.py measures it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from isa_helpers import TIER  # noqa: E402

from edgectl_runtime.kernels import ops  # noqa: E402
from edgectl_runtime.kernels.ops import reference  # noqa: E402

pytestmark = pytest.mark.isa_avx2  # the AVX2 tier runs the scalar and AVX2 levels again, held to AVX2 (~2 s)


@pytest.fixture(scope="module", autouse=True)
def library():
    ok, why = ops.available()
    assert ok, why


@pytest.fixture(params=ops.LEVELS)
def level(request):
    if request.param not in ops.supported_levels():
        pytest.skip(f"this CPU cannot run the {request.param} kernels (it runs {ops.supported_levels()})")
    if TIER == "avx2" and request.param == "avx512vnni":
        pytest.skip("the AVX2 tier runs nothing above AVX2")
    with ops.use_level(request.param):
        assert ops.active_level() == request.param
        yield request.param


def _case(seq_lens, heads, kv_heads, dim, block_size, seed=0, spread=1.0):
    """A query per sequence, a shuffled block table and vLLM's cache view; the cache holds random
    values everywhere (past a sequence's length too, which must not be read)."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    total = sum(per_seq) + 3
    cache = (torch.randn(total, kv_heads, 2 * block_size, dim, generator=gen) * spread).to(torch.bfloat16)
    cache = cache.view(total, kv_heads, block_size * 2, dim)
    key_cache, value_cache = cache.chunk(2, dim=2)
    order = torch.randperm(total, generator=gen)
    table = torch.zeros(len(seq_lens), max(per_seq + [1]) + 2, dtype=torch.int32)
    used = 0
    for s, blocks in enumerate(per_seq):
        table[s, :blocks] = order[used:used + blocks].to(torch.int32)
        used += blocks
    query = (torch.randn(len(seq_lens), heads, dim, generator=gen) * spread).to(torch.bfloat16)
    return query, key_cache, value_cache, torch.tensor(seq_lens, dtype=torch.int32), table


def _run(query, key_cache, value_cache, seq_lens, table, scale):
    out = torch.full_like(query, float("nan"))
    torch.ops.edgectl.decode_attention(query, key_cache, value_cache, out, seq_lens, table, scale)
    return out


# (seq_lens, heads, kv_heads, dim, block_size): SmolLM2's 9/3 heads of 64 (the vision shape
# model's language model) over vLLM's default block of 128, a long context split over many blocks,
# a partial last block, one token, several sequences of different lengths, MHA and GQA groups of
# 1..8, every head-size family (a multiple of 32; 80 and 112 only of 16), blocks of 16 and 32.
CASES = (
    ((1150,), 9, 3, 64, 128),
    ((1,), 9, 3, 64, 128),
    ((127, 128, 129, 5), 9, 3, 64, 128),
    ((300, 17), 8, 8, 128, 32),
    ((64, 1000), 8, 1, 128, 128),
    ((40,), 6, 2, 80, 16),
    ((77,), 4, 2, 112, 32),
    ((200,), 4, 4, 32, 32),
    ((90,), 2, 1, 256, 32),
)


@pytest.mark.parametrize("seq_lens,heads,kv_heads,dim,block_size", CASES)
def test_decode_attention_matches_the_reference(level, seq_lens, heads, kv_heads, dim, block_size):
    query, key_cache, value_cache, lens, table = _case(seq_lens, heads, kv_heads, dim, block_size)
    scale = dim ** -0.5
    got = _run(query, key_cache, value_cache, lens, table, scale)
    want = reference.decode_attention(query, key_cache, value_cache, lens, table, scale)
    # bf16 out: one rounding is 2^-8 relative; averages of many random values are small (~0.1),
    # so the absolute bound is what catches a wrong scale (0.125 for 0.13 moves them by ~1e-2)
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=2e-3)


def test_peaked_scores_and_an_empty_sequence(level):
    """Scores far apart (the softmax is nearly one-hot, the exponential's clamp is met) and a
    sequence of no tokens (zeros, as the reference)."""
    query, key_cache, value_cache, lens, table = _case((500, 0, 33), 9, 3, 64, 128, seed=3, spread=6.0)
    got = _run(query, key_cache, value_cache, lens, table, 1.0)
    want = reference.decode_attention(query, key_cache, value_cache, lens, table, 1.0)
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=2e-3)
    assert torch.equal(got[1], torch.zeros_like(got[1]))


def test_every_level_gives_the_same_answer():
    """The levels differ only in rounding (the exponential, the order of sums)."""
    query, key_cache, value_cache, lens, table = _case((700, 3), 9, 3, 64, 128, seed=5)
    outs = {}
    for lv in [lv for lv in ops.supported_levels() if not (TIER == "avx2" and lv == "avx512vnni")]:
        with ops.use_level(lv):
            outs[lv] = _run(query, key_cache, value_cache, lens, table, 0.125).float()
    base = outs["scalar"]
    for lv, out in outs.items():
        torch.testing.assert_close(out, base, rtol=8e-3, atol=2e-3, msg=f"{lv} against scalar")


@pytest.mark.parametrize("change,message", [
    (lambda q, k, v, o, l, t: (q.float(), k, v, o, l, t), "must be bfloat16"),
    (lambda q, k, v, o, l, t: (q[:, :7], k, v, o[:, :7], l, t), "multiple"),
    (lambda q, k, v, o, l, t: (q, k, v, o, l.long(), t), "seq_lens must be int32"),
    (lambda q, k, v, o, l, t: (q, k, v, o, l + 10_000, t), "block table of"),
    (lambda q, k, v, o, l, t: (q, k, v[:, :, :5], o, l, t), "same strides"),
])
def test_bad_input_is_a_clear_error(change, message):
    args = _case((50,), 9, 3, 64, 32)
    query, key_cache, value_cache, lens, table = args
    out = torch.empty_like(query)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.edgectl.decode_attention(*change(query, key_cache, value_cache, out, lens, table)[:4],
                                           *change(query, key_cache, value_cache, out, lens, table)[4:], 0.125)
