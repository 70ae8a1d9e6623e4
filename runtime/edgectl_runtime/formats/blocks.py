"""edgectl's block formats (blocks of 32 along K) and the tiled layout the op library reads.

Arithmetic (GGUF's, so a GGUF-derived checkpoint is represented exactly):

- **W4** (Q4_1): per row and block of 32 columns, ``w = d * q + m`` with ``q`` in 0..15,
  ``d = fp16((max - min) / 15)``, ``m = fp16(min)``, ``q = clamp(round((w - m) / d), 0, 15)``
  computed against the fp16-rounded ``d`` and ``m`` (the values the kernel uses).
- **W8** (Q8_0): ``w = d * q`` with ``q`` in -127..127 (never -128, so ``|q|`` fits the
  unsigned side of the AVX2 dot product), ``d = fp16(max|w| / 127)``, ``q = round(w / d)``.
- **W5** (Q5_0): ``w = d * (q - 16)`` with ``q`` in 0..31. Only a GGUF's Q5_0 or Q4_0 blocks
  become W5, as they are (``ggml.to_w5``); nothing is quantized to it.

Rounding is half to even. A K that is not a multiple of 32 is **padded, not refused**: the
last block is quantized over its real columns only, its padding holds q = 0, and the kernel
pads the activations of those columns with zeros (their products vanish, and the sums of
quantized activations behind the W4 minimum's term only count real columns). N is padded to
the 16-row tile with zero rows (d = m = 0), never written to the output.

Layout (``ops/csrc/kernels.h`` is the authority): uint8 ``[ceil(N/16), ceil(K/32), record]``;
W4 record 320 bytes (nibbles by quad, row, j; then d[16], m[16] as fp16), W5 record 352 bytes
(W4's nibbles of the low four bits, 64 bytes of fifth bits, d[16]), W8 record 544 bytes.
"""

from __future__ import annotations

import torch

from edgectl.contract.int4_layout import BLOCK, BLOCK_RECORD_BYTES, TILE_ROWS

W5_ZERO = 16  # w = d * (q - W5_ZERO)
# Rows quantized and packed at a time: bounds the fp32 transient to ROWS x K x 4 bytes.
PACK_ROWS = 256


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def packed_shape(n: int, k: int, bits: int) -> tuple[int, int, int]:
    """The shape of the packed uint8 tensor of an ``[n, k]`` matrix."""
    return (ceil_div(n, TILE_ROWS), ceil_div(k, BLOCK), BLOCK_RECORD_BYTES[bits])


def packed_bytes(n: int, k: int, bits: int) -> int:
    t, b, r = packed_shape(n, k, bits)
    return t * b * r


def _blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [n, k]`` as fp32 blocks ``[n, kb, 32]`` (padding = NaN, so it is ignored by min/max)
    and the mask of real columns."""
    n, k = w.shape
    kb = ceil_div(k, BLOCK)
    x = torch.full((n, kb * BLOCK), float("nan"), dtype=torch.float32)
    x[:, :k] = w.to(torch.float32)
    real = torch.zeros(kb * BLOCK, dtype=torch.bool)
    real[:k] = True
    return x.reshape(n, kb, BLOCK), real.reshape(kb, BLOCK)


def quantize_w4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [n, k]`` -> ``q`` uint8 ``[n, kb * 32]`` (0..15, padding 0), ``d`` and ``m`` fp16 ``[n, kb]``."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    x, real = _blocks(w)
    lo = torch.where(real, x, float("inf")).amin(-1)
    hi = torch.where(real, x, float("-inf")).amax(-1)
    d = ((hi - lo) / 15.0).to(torch.float16)
    m = lo.to(torch.float16)
    df, mf = d.to(torch.float32), m.to(torch.float32)
    safe = torch.where(df > 0, df, torch.ones_like(df))
    q = ((x - mf.unsqueeze(-1)) / safe.unsqueeze(-1)).round_().clamp_(0, 15)
    q = torch.where((df > 0).unsqueeze(-1) & real, q, torch.zeros_like(q))
    return q.to(torch.uint8).reshape(w.shape[0], -1), d, m


def quantize_w8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [n, k]`` -> ``q`` int8 ``[n, kb * 32]`` (-127..127, padding 0), ``d`` fp16 ``[n, kb]``."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    x, real = _blocks(w)
    amax = torch.where(real, x.abs(), torch.zeros_like(x)).amax(-1)
    d = (amax / 127.0).to(torch.float16)
    df = d.to(torch.float32)
    safe = torch.where(df > 0, df, torch.ones_like(df))
    q = (x / safe.unsqueeze(-1)).round_().clamp_(-127, 127)
    q = torch.where((df > 0).unsqueeze(-1) & real, q, torch.zeros_like(q))
    return q.to(torch.int8).reshape(w.shape[0], -1), d


def dequantize_w4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 ``[n, k]`` of :func:`quantize_w4`'s output (padding dropped)."""
    n = q.shape[0]
    w = q.to(torch.float32).reshape(n, -1, BLOCK) * d.to(torch.float32).unsqueeze(-1) + m.to(torch.float32).unsqueeze(-1)
    return w.reshape(n, -1)[:, :k]


def dequantize_w5(q: torch.Tensor, d: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 ``[n, k]`` of W5 values ``q`` (0..31) and ``d``: ``d * (q - 16)``, one rounding."""
    return dequantize_w8(q.to(torch.int16) - W5_ZERO, d, k)


def dequantize_w8(q: torch.Tensor, d: torch.Tensor, k: int) -> torch.Tensor:
    n = q.shape[0]
    w = q.to(torch.float32).reshape(n, -1, BLOCK) * d.to(torch.float32).unsqueeze(-1)
    return w.reshape(n, -1)[:, :k]


# ---------------------------------------------------------------------------------------------
# The tiled records


def _tiles(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """Rows padded with zeros to ``n_pad``."""
    if t.shape[0] == n_pad:
        return t
    return torch.cat([t, t.new_zeros((n_pad - t.shape[0], *t.shape[1:]))])


def _fp16_bytes(x: torch.Tensor, tiles: int, kb: int) -> torch.Tensor:
    """fp16 ``[tiles * 16, kb]`` -> uint8 ``[tiles, kb, 32]`` (16 rows' values, little-endian)."""
    x = x.to(torch.float16).reshape(tiles, TILE_ROWS, kb).permute(0, 2, 1).contiguous()
    return x.view(torch.uint8).reshape(tiles, kb, 2 * TILE_ROWS)


def pack_w4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """:func:`quantize_w4`'s output -> uint8 ``[tiles, kb, 320]``."""
    n, kp = q.shape
    kb = kp // BLOCK
    tiles = ceil_div(n, TILE_ROWS)
    qq = _tiles(q, tiles * TILE_ROWS).reshape(tiles, TILE_ROWS, kb, 2, 4, 4)  # tile, row, block, half, quad, j
    nib = (qq[:, :, :, 0] | (qq[:, :, :, 1] << 4)).to(torch.uint8)  # tile, row, block, quad, j
    nib = nib.permute(0, 2, 3, 1, 4).reshape(tiles, kb, 256)  # tile, block, quad, row, j
    return torch.cat([nib, _fp16_bytes(_tiles(d, tiles * TILE_ROWS), tiles, kb),
                      _fp16_bytes(_tiles(m, tiles * TILE_ROWS), tiles, kb)], dim=-1).contiguous()


def _fifth_bit_shifts() -> torch.Tensor:
    """[half, quad, 1]: the bit of a W5 record's fifth-bit byte that holds value ``16 half + 4 quad + j``."""
    return torch.arange(2).view(2, 1, 1) * 4 + torch.arange(4).view(1, 4, 1)


def pack_w5(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """W5 values ``q`` uint8 ``[n, kb * 32]`` (0..31) and ``d`` fp16 ``[n, kb]`` -> uint8 ``[tiles, kb, 352]``:
    the low four bits as :func:`pack_w4`'s nibbles, then the fifth bits, byte ``row * 4 + j`` holding in bit
    ``quad`` that of value ``4 quad + j`` and in bit ``4 + quad`` that of value ``16 + 4 quad + j``."""
    n, kp = q.shape
    kb = kp // BLOCK
    tiles = ceil_div(n, TILE_ROWS)
    low = pack_w4(q & 0x0F, d, d)[:, :, :256]
    fifth = (_tiles(q, tiles * TILE_ROWS) >> 4).to(torch.int32).reshape(tiles, TILE_ROWS, kb, 2, 4, 4)
    high = (fifth << _fifth_bit_shifts()).sum(dim=(3, 4))  # tile, row, block, j
    high = high.permute(0, 2, 1, 3).reshape(tiles, kb, 64).to(torch.uint8)
    return torch.cat([low, high, _fp16_bytes(_tiles(d, tiles * TILE_ROWS), tiles, kb)], dim=-1).contiguous()


def pack_w8(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """:func:`quantize_w8`'s output -> uint8 ``[tiles, kb, 544]``."""
    n, kp = q.shape
    kb = kp // BLOCK
    tiles = ceil_div(n, TILE_ROWS)
    qq = _tiles(q, tiles * TILE_ROWS).reshape(tiles, TILE_ROWS, kb, 8, 4)  # tile, row, block, quad, j
    qs = qq.permute(0, 2, 3, 1, 4).reshape(tiles, kb, 512).view(torch.uint8)
    return torch.cat([qs, _fp16_bytes(_tiles(d, tiles * TILE_ROWS), tiles, kb)], dim=-1).contiguous()


def _unfp16(b: torch.Tensor, n: int) -> torch.Tensor:
    tiles, kb, _ = b.shape
    return b.contiguous().view(torch.float16).permute(0, 2, 1).reshape(tiles * TILE_ROWS, kb)[:n]


def unpack_w4(packed: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_w4` for the first ``n`` rows: ``(q [n, kb*32], d [n, kb], m [n, kb])``."""
    tiles, kb, _ = packed.shape
    nib = packed[:, :, :256].reshape(tiles, kb, 4, TILE_ROWS, 4).permute(0, 3, 1, 2, 4)  # tile, row, block, quad, j
    q = torch.stack([nib & 0x0F, nib >> 4], dim=3).reshape(tiles * TILE_ROWS, kb * BLOCK)[:n]
    return q.contiguous(), _unfp16(packed[:, :, 256:288], n), _unfp16(packed[:, :, 288:320], n)


def unpack_w5(packed: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_w5` for the first ``n`` rows: ``(q [n, kb*32] in 0..31, d [n, kb])``."""
    tiles, kb, _ = packed.shape
    low, _, _ = unpack_w4(torch.cat([packed[:, :, :256], packed[:, :, :64]], dim=-1), tiles * TILE_ROWS)
    high = packed[:, :, 256:320].reshape(tiles, kb, TILE_ROWS, 1, 1, 4).to(torch.int32)  # tile, block, row, -, -, j
    fifth = ((high >> _fifth_bit_shifts()) & 1).permute(0, 2, 1, 3, 4, 5)  # tile, row, block, half, quad, j
    q = low.reshape(tiles, TILE_ROWS, kb, 2, 4, 4) | (fifth << 4).to(torch.uint8)
    return q.reshape(tiles * TILE_ROWS, kb * BLOCK)[:n].contiguous(), _unfp16(packed[:, :, 320:352], n)


def unpack_w8(packed: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    tiles, kb, _ = packed.shape
    qs = packed[:, :, :512].contiguous().view(torch.int8).reshape(tiles, kb, 8, TILE_ROWS, 4)
    q = qs.permute(0, 3, 1, 2, 4).reshape(tiles * TILE_ROWS, kb * BLOCK)[:n]
    return q.contiguous(), _unfp16(packed[:, :, 512:544], n)


def quantize_and_pack(w: torch.Tensor, bits: int, n_total: int | None = None,
                      block_rows: int = PACK_ROWS) -> torch.Tensor:
    """Quantize ``w [n, k]`` and pack it, ``block_rows`` rows at a time (the transient is one
    block in fp32). Rows past ``w``'s own up to ``n_total`` (vLLM's vocabulary padding) are zero."""
    if block_rows % TILE_ROWS:
        raise ValueError(f"block_rows must be a multiple of {TILE_ROWS}")
    if bits not in (4, 8):
        raise ValueError(f"weights are quantized to 4 or 8 bits, not {bits} (W5 holds a GGUF's Q5_0 blocks only)")
    real, k = w.shape
    n = real if n_total is None else n_total
    out = torch.empty(packed_shape(n, k, bits), dtype=torch.uint8)
    for r0 in range(0, n, block_rows):
        r1 = min(n, r0 + block_rows)
        block = w[r0:min(r1, real)]
        if block.shape[0] < r1 - r0:
            block = torch.cat([block, block.new_zeros((r1 - r0 - block.shape[0], k))])
        t0, t1 = r0 // TILE_ROWS, ceil_div(r1, TILE_ROWS)
        if bits == 4:
            out[t0:t1] = pack_w4(*quantize_w4(block))
        else:
            out[t0:t1] = pack_w8(*quantize_w8(block))
    return out


def from_groups(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise int4 (:mod:`.groups`, ``w = (q - 8) * s + z``, ``[n, k/g]`` scales and zeros, g a
    multiple of 32: a portable, GPTQ or AWQ checkpoint) as W4 blocks: the same q, ``d = s`` and
    ``m = z - 8 s`` repeated over the g / 32 blocks of each group. Exact up to rounding d and m
    to fp16 (no requantization, so a coarser checkpoint group loses nothing more)."""
    n, k = q.shape
    groups = scales.shape[1]
    if k % groups or (k // groups) % BLOCK:
        raise ValueError(f"group size {k // max(groups, 1)} is not a multiple of {BLOCK}")
    rep = (k // groups) // BLOCK
    s = scales.to(torch.float32).repeat_interleave(rep, dim=1)
    z = zeros.to(torch.float32).repeat_interleave(rep, dim=1)
    return q.to(torch.uint8), s.to(torch.float16), (z - 8.0 * s).to(torch.float16)


def to_groups(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W4 values as group-wise int4 with groups of 32 (fp32 scales and zeros):
    ``(q - 8) * d + (m + 8 d) = d * q + m`` up to one fp32 rounding. ``q`` keeps its padding to
    a multiple of 32 columns (so the groups divide it). For read-back dumps that compare formats."""
    df, mf = d.to(torch.float32), m.to(torch.float32)
    return q.contiguous(), df, mf + 8.0 * df
