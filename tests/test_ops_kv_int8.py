"""edgectl's int8 KV (csrc/kernels.h): ``torch.ops.edgectl.kv_write_int8`` writes a step's keys and
values into the int8 halves of a cache tensor laid out as vLLM's "vec" one and a float32 scale per
token, KV head and half; ``torch.ops.edgectl.decode_attention_int8`` attends over it at every ISA
level this CPU can run. Checked against

- the plain-PyTorch reference (ops/reference.py): the write bit for bit, the attention within
  bf16's rounding;
- the keys and values before they were written: a round trip within half a step of each row's
  scale, and attention within what int8 rounding moves it (so a wrong layout or scale fails).

No timing here (docs/vision.md measures it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_levels import runnable_levels  # noqa: E402

from edgectl_runtime.kernels import ops  # noqa: E402
from edgectl_runtime.kernels.ops import reference  # noqa: E402

pytestmark = pytest.mark.isa_avx2  # the AVX2 tier runs the scalar and AVX2 levels again, held to AVX2 (~1 s)


@pytest.fixture(scope="module", autouse=True)
def library():
    ok, why = ops.available()  # loads the library: a missing or stale build is a failure, not a skip
    assert ok, why


def _halves(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value halves of a cache tensor [blocks, kv_heads, block_size, 2 * dim] (vLLM's shape,
    here int8), as the plugin views them."""
    blocks, kv_heads, block_size, _ = cache.shape
    return cache.view(blocks, kv_heads, 2 * block_size, -1).chunk(2, dim=2)


class Case:
    """Keys, values and a query per sequence, written by edgectl's op into one int8 cache tensor
    through a shuffled block table, a step at a time (a prompt, then single tokens, as the engine
    writes them); slots no sequence uses hold garbage that must not be read."""

    def __init__(self, seq_lens, heads, kv_heads, dim, block_size, seed=0, spread=1.0, step=64):
        gen = torch.Generator().manual_seed(seed)
        per_seq = [-(-n // block_size) for n in seq_lens]
        total = sum(per_seq) + 3
        self.cache = torch.randint(-128, 128, (total, kv_heads, block_size, 2 * dim), generator=gen, dtype=torch.int8)
        self.key_cache, self.value_cache = _halves(self.cache)
        self.scales = torch.rand(total, kv_heads, 2, block_size, generator=gen) * 1e3
        order = torch.randperm(total, generator=gen)
        self.table = torch.zeros(len(seq_lens), max(per_seq + [1]) + 2, dtype=torch.int32)
        self.keys, self.values, self.slots = [], [], []
        used = 0
        for s, (n, blocks) in enumerate(zip(seq_lens, per_seq)):
            self.table[s, :blocks] = order[used:used + blocks].to(torch.int32)
            used += blocks
            key = (torch.randn(n, kv_heads, dim, generator=gen) * spread).to(torch.bfloat16)
            value = torch.randn(n, kv_heads, dim, generator=gen).to(torch.bfloat16)
            t = torch.arange(n)
            slots = self.table[s, t // block_size].long() * block_size + t % block_size
            for first in range(0, n, step):
                torch.ops.edgectl.kv_write_int8(key[first:first + step], value[first:first + step], self.key_cache,
                                                self.value_cache, self.scales, slots[first:first + step].contiguous())
            self.keys.append(key)
            self.values.append(value)
            self.slots.append(slots)
        self.query = (torch.randn(len(seq_lens), heads, dim, generator=gen) * spread).to(torch.bfloat16)
        self.lens = torch.tensor(seq_lens, dtype=torch.int32)
        self.heads, self.kv_heads, self.dim, self.block_size = heads, kv_heads, dim, block_size

    def edgectl(self, scale):
        out = torch.full_like(self.query, float("nan"))
        torch.ops.edgectl.decode_attention_int8(self.query, self.key_cache, self.value_cache, self.scales, out,
                                                self.lens, self.table, scale)
        return out

    def reference(self, scale):
        return reference.decode_attention_int8(self.query, self.key_cache, self.value_cache, self.scales, self.lens,
                                               self.table, scale)

    def from_inputs(self, scale):
        """Attention of the keys and values before they were written (float64, no rounding)."""
        out = torch.zeros_like(self.query)
        group = self.heads // self.kv_heads
        for s, (key, value) in enumerate(zip(self.keys, self.values)):
            if len(key) == 0:
                continue
            q = self.query[s].double().reshape(self.kv_heads, group, self.dim)
            p = torch.softmax(torch.einsum("hgd,nhd->hgn", q, key.double()) * scale, dim=-1)
            out[s] = torch.einsum("hgn,nhd->hgd", p, value.double()).reshape(self.heads, self.dim).to(out.dtype)
        return out


def _close(got, want):
    # as tests/test_ops_decode_attention.py: bf16 out, averages of random values ~0.1
    torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=2e-3)


def test_the_write_is_the_references_bit_for_bit():
    """The op's bytes and scales are the reference's: keys in groups of four dimensions within a block,
    values in groups of four tokens, an all-zero row and a row too small to scale (max|x| under 1e-30, where
    127 / max|x| would overflow float32) stored as zeros with scale 0, padding slots (-1) left alone."""
    gen = torch.Generator().manual_seed(1)
    blocks, kv_heads, block_size, dim = 6, 3, 32, 64
    cache = torch.zeros(blocks, kv_heads, block_size, 2 * dim, dtype=torch.int8)
    scales = torch.full((blocks, kv_heads, 2, block_size), -1.0)
    key = (torch.randn(40, kv_heads, dim, generator=gen) * 3).to(torch.bfloat16)
    value = torch.randn(40, kv_heads, dim, generator=gen).to(torch.bfloat16)
    key[5, 1] = 0  # an all-zero row
    value[7] = 0
    key[6, 0] = torch.full((dim,), 1e-37).to(torch.bfloat16)  # a normal number, but 127 / 1e-37 overflows float32
    slots = torch.randperm(blocks * block_size, generator=gen)[:40]
    slots[3] = -1
    got_cache = cache.clone()
    got_scales = scales.clone()
    torch.ops.edgectl.kv_write_int8(key, value, *_halves(got_cache), got_scales, slots)
    want_cache = cache.clone()
    want_scales = scales.clone()
    reference.kv_write_int8(key, value, *_halves(want_cache), want_scales, slots)
    assert torch.equal(got_cache, want_cache)
    assert torch.equal(got_scales, want_scales)
    assert (got_scales == -1).sum() == (blocks * block_size - 39) * kv_heads * 2  # only the 39 slots written
    # the round trip: within half a step of the row's scale
    k, v = reference.dequantize_kv_int8(*_halves(got_cache), got_scales, torch.arange(blocks), blocks * block_size)
    for i in range(40):
        if slots[i] < 0:
            continue
        kk, vv = k[:, slots[i]], v[:, slots[i]]  # [kv_heads, dim]
        ks, vs = got_scales.permute(1, 2, 0, 3).reshape(kv_heads, 2, -1)[:, :, slots[i]].unbind(1)
        assert ((kk - key[i].float()).abs() <= ks[:, None] / 2 + 1e-6).all()
        assert ((vv - value[i].float()).abs() <= vs[:, None] / 2 + 1e-6).all()
    assert torch.equal(k[1, slots[5]], torch.zeros(dim)) and got_scales.flatten()[0] != 0
    assert torch.equal(k[0, slots[6]], torch.zeros(dim)) and torch.isfinite(got_scales[got_scales != -1]).all()


# (seq_lens, heads, kv_heads, dim, block_size): as tests/test_ops_decode_attention.py, over vLLM's
# block of 128 and the 16-token blocks both vector levels take; head sizes 32..256; groups 1..8.
CASES = (
    ((1150,), 9, 3, 64, 128),
    ((1,), 9, 3, 64, 128),
    ((127, 128, 129, 5), 9, 3, 64, 128),
    ((300, 17), 8, 8, 128, 32),
    ((64, 1000), 8, 1, 128, 128),
    ((77,), 4, 2, 96, 16),
    ((200,), 4, 4, 32, 32),
    ((90,), 2, 1, 256, 32),
    ((50,), 4, 2, 64, 20),  # a block no vector level takes (not a multiple of 32): the scalar block
)


@pytest.mark.parametrize("seq_lens,heads,kv_heads,dim,block_size", CASES)
def test_decode_attention_int8_against_the_reference(kernel_level, seq_lens, heads, kv_heads, dim, block_size):
    case = Case(seq_lens, heads, kv_heads, dim, block_size)
    scale = dim ** -0.5
    got = case.edgectl(scale)
    _close(got, case.reference(scale))
    # int8 rounding of keys and values (a step of max|x| / 127 per row) moves attention little
    torch.testing.assert_close(got.float(), case.from_inputs(scale).float(), rtol=0.05, atol=0.02)


def test_peaked_scores_and_an_empty_sequence(kernel_level):
    case = Case((500, 0, 33), 9, 3, 64, 128, seed=3, spread=6.0)
    got = case.edgectl(1.0)
    _close(got, case.reference(1.0))
    assert torch.equal(got[1], torch.zeros_like(got[1]))


def test_a_wrong_scale_is_caught():
    """The comparison with the inputs can fail: the cache read with its value scales doubled is off."""
    case = Case((300,), 9, 3, 64, 128, seed=7)
    case.scales[:, :, 1] *= 2
    with pytest.raises(AssertionError):
        torch.testing.assert_close(case.edgectl(0.125).float(), case.from_inputs(0.125).float(), rtol=0.05, atol=0.02)


def test_every_level_gives_the_same_answer():
    case = Case((700, 3), 9, 3, 64, 128, seed=5)
    outs = {}
    for lv in runnable_levels():
        with ops.use_level(lv):
            outs[lv] = case.edgectl(0.125).float()
    for lv, out in outs.items():
        torch.testing.assert_close(out, outs["scalar"], rtol=8e-3, atol=2e-3, msg=f"{lv} against scalar")


def test_bad_input_is_a_clear_error():
    case = Case((50,), 9, 3, 64, 32)
    out = torch.empty_like(case.query)
    with pytest.raises(RuntimeError, match="caches must be Char"):
        torch.ops.edgectl.decode_attention_int8(case.query, case.key_cache.float(), case.value_cache.float(),
                                                case.scales, out, case.lens, case.table, 0.125)
    with pytest.raises(RuntimeError, match="scales must be contiguous float32"):
        torch.ops.edgectl.decode_attention_int8(case.query, case.key_cache, case.value_cache, case.scales[:, :, :1],
                                                out, case.lens, case.table, 0.125)
    key = torch.zeros(2, 3, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="past the cache"):
        torch.ops.edgectl.kv_write_int8(key, key, case.key_cache, case.value_cache, case.scales,
                                        torch.tensor([0, 10_000]))
    with pytest.raises(RuntimeError, match="slot_mapping must be int64"):
        torch.ops.edgectl.kv_write_int8(key, key, case.key_cache, case.value_cache, case.scales,
                                        torch.tensor([0, 1], dtype=torch.int32))
    # values are in groups of four tokens: a block size that is not a multiple of 4 is refused by both ops
    odd = torch.zeros(2, 3, 2 * 18, 64, dtype=torch.int8).chunk(2, dim=2)
    odd_scales = torch.zeros(2, 3, 2, 18)
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.ops.edgectl.kv_write_int8(key, key, odd[0], odd[1], odd_scales, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.ops.edgectl.decode_attention_int8(case.query, odd[0], odd[1], odd_scales, out, case.lens,
                                                torch.zeros(1, 4, dtype=torch.int32), 0.125)
