"""edgectl's block formats (runtime/edgectl_runtime/formats/blocks.py): the quantizers reproduce
GGUF Q4_1 / Q8_0 weights exactly, padding, and the packed layout byte for byte as
ops/csrc/kernels.h describes it. Pure arithmetic: no kernel is called."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgectl_runtime.formats import blocks  # noqa: E402


def _q4_1_weights(n: int, k: int, seed: int):
    """Weights built the way a Q4_1 GGUF stores them: fp16 d and m per block of 32, q in 0..15
    with 0 and 15 present in every block (llama.cpp's quantizer puts min and max there)."""
    gen = torch.Generator().manual_seed(seed)
    kb = k // 32
    d = (torch.rand(n, kb, generator=gen) * 0.01 + 1e-3).to(torch.float16)
    m = (-torch.rand(n, kb, generator=gen) * 0.1).to(torch.float16)
    q = torch.randint(0, 16, (n, kb, 32), generator=gen, dtype=torch.uint8)
    q[:, :, 0], q[:, :, 1] = 0, 15
    w = d.float().unsqueeze(-1) * q.float() + m.float().unsqueeze(-1)
    return w.reshape(n, k), q.reshape(n, k), d, m


def test_w4_reproduces_q4_1_weights_exactly():
    w, q, d, m = _q4_1_weights(48, 128, seed=0)
    gq, gd, gm = blocks.quantize_w4(w)
    assert torch.equal(gq, q) and torch.equal(gd, d) and torch.equal(gm, m)
    assert torch.equal(blocks.dequantize_w4(gq, gd, gm, 128), w)


def _llama_cpp_q4_1(src: torch.Tensor):
    """llama.cpp's quantize_row_q4_1_ref: d = (max - min) / 15 and min stored as fp16, q from the
    unrounded d and min, q = min(15, int((x - min) / d + 0.5))."""
    n, k = src.shape
    x = src.float().reshape(n, k // 32, 32)
    lo, hi = x.amin(-1), x.amax(-1)
    d = (hi - lo) / 15
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = ((x - lo.unsqueeze(-1)) * inv.unsqueeze(-1) + 0.5).to(torch.int32).clamp(max=15)
    return q.to(torch.uint8).reshape(n, k), d.to(torch.float16), lo.to(torch.float16)


def test_w4_reproduces_a_q4_1_model_dequantized_to_bf16():
    """The catalog's SmolLM2: a bf16 model quantized to Q4_1 by llama.cpp, dequantized back to
    bf16 for vLLM. Quantizing those bf16 weights again gives the GGUF's q and, in the kernel's
    fp32 arithmetic, every bf16 weight back (tests/test_formats_real.py checks the real file)."""
    gen = torch.Generator().manual_seed(1)
    src = (torch.randn(64, 256, generator=gen) * 0.05).to(torch.bfloat16)
    q, d, m = _llama_cpp_q4_1(src)
    wb = (d.float().unsqueeze(-1) * q.float().reshape(64, 8, 32) + m.float().unsqueeze(-1)).reshape(64, 256)
    wb = wb.to(torch.bfloat16)
    gq, gd, gm = blocks.quantize_w4(wb)
    assert torch.equal(gq, q)
    assert torch.equal(blocks.dequantize_w4(gq, gd, gm, 256).to(torch.bfloat16), wb)


def test_w8_reproduces_q8_0_weights_exactly():
    gen = torch.Generator().manual_seed(2)
    d = (torch.rand(32, 4, generator=gen) * 0.01 + 1e-4).to(torch.float16)
    q = torch.randint(-127, 128, (32, 4, 32), generator=gen, dtype=torch.int8)
    q[:, :, 0] = 127  # max |q| = 127 in every block, as Q8_0's quantizer makes it
    w = (d.float().unsqueeze(-1) * q.float()).reshape(32, 128)
    gq, gd = blocks.quantize_w8(w)
    assert torch.equal(gq, q.reshape(32, 128)) and torch.equal(gd, d)
    assert gq.min() >= -127  # never -128: |q| must fit the unsigned side of vpmaddubsw


def test_error_is_at_most_half_a_step():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 96, generator=gen)
    q, d, m = blocks.quantize_w4(w)
    err = (blocks.dequantize_w4(q, d, m, 96) - w).abs().reshape(40, 3, 32)
    assert bool((err <= d.float().unsqueeze(-1) * 0.5 + 1e-3).all())
    q8, d8 = blocks.quantize_w8(w)
    err8 = (blocks.dequantize_w8(q8, d8, 96) - w).abs().reshape(40, 3, 32)
    assert bool((err8 <= d8.float().unsqueeze(-1) * 0.5 + 1e-4).all())


def test_odd_k_is_padded_not_refused():
    """K = 70: the last block holds 6 real columns, quantized over those alone; padding is q = 0."""
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(5, 70, generator=gen)
    q, d, m = blocks.quantize_w4(w)
    assert q.shape == (5, 96) and d.shape == (5, 3)
    assert not q[:, 70:].any()
    tail = w[:, 64:70]
    assert torch.equal(m[:, 2], tail.amin(1).to(torch.float16))
    assert torch.equal(d[:, 2], ((tail.amax(1) - tail.amin(1)) / 15).to(torch.float16))
    q8, d8 = blocks.quantize_w8(w)
    assert not q8[:, 70:].any() and torch.equal(d8[:, 2], (tail.abs().amax(1) / 127).to(torch.float16))


def test_constant_and_zero_blocks():
    w = torch.zeros(16, 64)
    w[:, 32:] = 0.25
    q, d, m = blocks.quantize_w4(w)
    assert torch.equal(blocks.dequantize_w4(q, d, m, 64), w)
    q8, d8 = blocks.quantize_w8(w)  # symmetric: the zero block is exact, a constant one is not
    assert torch.equal(blocks.dequantize_w8(q8, d8, 64)[:, :32], w[:, :32])


@pytest.mark.parametrize("n,k", [(16, 32), (17, 64), (40, 100), (3, 7)])
def test_pack_unpack_round_trip(n, k):
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen)
    q, d, m = blocks.quantize_w4(w)
    packed = blocks.pack_w4(q, d, m)
    assert packed.shape == blocks.packed_shape(n, k, 4) and packed.dtype == torch.uint8
    uq, ud, um = blocks.unpack_w4(packed, n)
    assert torch.equal(uq, q) and torch.equal(ud, d) and torch.equal(um, m)
    q8, d8 = blocks.quantize_w8(w)
    p8 = blocks.pack_w8(q8, d8)
    assert p8.shape == blocks.packed_shape(n, k, 8)
    uq8, ud8 = blocks.unpack_w8(p8, n)
    assert torch.equal(uq8, q8) and torch.equal(ud8, d8)


def test_w5_packed_bytes_are_where_kernels_h_says():
    """W5: W4's nibbles of the low four bits; byte row*4 + j of the fifth-bit plane holds in bit quad that
    of q[row][4 quad + j] and in bit 4 + quad that of q[row][16 + 4 quad + j]; then d[16]."""
    n, k = 20, 64
    gen = torch.Generator().manual_seed(7)
    q = torch.randint(0, 32, (n, k), generator=gen, dtype=torch.uint8)
    d = torch.rand(n, 2, generator=gen).to(torch.float16)
    packed = blocks.pack_w5(q, d)
    assert packed.shape == blocks.packed_shape(n, k, 5) == (2, 2, 352)
    tile, b = 0, 1
    rec = packed[tile, b]
    for row in range(16):
        for j in range(4):
            high = int(rec[256 + row * 4 + j])
            for quad in range(4):
                lo, hi = int(q[row, 32 + 4 * quad + j]), int(q[row, 32 + 16 + 4 * quad + j])
                assert int(rec[quad * 64 + row * 4 + j]) == (lo & 15) | (hi & 15) << 4
                assert (high >> quad) & 1 == lo >> 4 and (high >> (4 + quad)) & 1 == hi >> 4
    assert torch.equal(rec[320:352].clone().view(torch.float16), d[:16, 1])
    uq, ud = blocks.unpack_w5(packed, n)
    assert torch.equal(uq, q) and torch.equal(ud, d)
    with pytest.raises(ValueError, match="not 5"):
        blocks.quantize_and_pack(torch.zeros(16, 32), 5)


def test_packed_bytes_are_where_kernels_h_says():
    """byte (quad, row, j) at quad*64 + row*4 + j: q[row][4 quad + j] low, q[row][16 + 4 quad + j] high;
    then d[16] and m[16] as little-endian fp16 (one 16-row tile, block 1 of 2)."""
    n, k = 20, 64
    gen = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    d = torch.rand(n, 2, generator=gen).to(torch.float16)
    m = torch.rand(n, 2, generator=gen).to(torch.float16)
    packed = blocks.pack_w4(q, d, m)
    tile, b = 1, 1
    rec = packed[tile, b]
    for quad in range(4):
        for row in range(16):
            for j in range(4):
                byte = int(rec[quad * 64 + row * 4 + j])
                r = tile * 16 + row
                want = (int(q[r, b * 32 + 4 * quad + j]) | int(q[r, b * 32 + 16 + 4 * quad + j]) << 4) if r < n else 0
                assert byte == want
    scales = rec[256:288].clone().view(torch.float16)
    assert torch.equal(scales[:4], d[16:20, 1]) and not scales[4:].float().any()  # rows past N: 0
    q8 = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    rec8 = blocks.pack_w8(q8, d)[0, 1]
    assert rec8[7 * 64 + 5 * 4 + 3].view(torch.int8) == q8[5, 32 + 7 * 4 + 3]
    assert torch.equal(rec8[512:544].clone().view(torch.float16), d[:16, 1])


def test_quantize_and_pack_in_row_blocks_equals_whole():
    gen = torch.Generator().manual_seed(6)
    w = torch.randn(100, 96, generator=gen).to(torch.bfloat16)
    whole = blocks.pack_w4(*blocks.quantize_w4(w))
    assert torch.equal(blocks.quantize_and_pack(w, 4, block_rows=32), whole)
    padded = blocks.quantize_and_pack(w, 8, n_total=128, block_rows=48)
    assert padded.shape == blocks.packed_shape(128, 96, 8)
    assert torch.equal(padded[:7], blocks.pack_w8(*blocks.quantize_w8(w[:112])))  # rows 100..111 are zero rows
    with pytest.raises(ValueError):
        blocks.quantize_and_pack(w, 4, block_rows=24)
