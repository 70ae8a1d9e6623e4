"""GGUF's tensor types, read block by block in plain PyTorch: the reference semantics of a
served GGUF file, and the conversion of its blocks into edgectl's W4 / W8 (``blocks.py``).

Every function takes a tensor's raw bytes as uint8 ``[rows, row_bytes]`` (one GGUF row =
``k / block`` blocks, ggml's row-major layout) and ``k``, the row's length in values.

Block layouts (ggml ``src/ggml-common.h``, the ``block_*`` structs; values ``w``, fp16 ``d``/``m``):

- ``Q4_0`` 18 bytes / 32: d, 16 bytes of nibbles; ``w = d (q - 8)``. Value ``j`` of the block is
  the low nibble of byte ``j``, value ``j + 16`` its high nibble (``dequantize_row_q4_0``).
- ``Q4_1`` 20 bytes / 32: d, m, nibbles as Q4_0; ``w = d q + m``.
- ``Q5_0`` 22 bytes / 32: d, 4 bytes of fifth bits (uint32 ``qh``, bit ``j`` for value ``j``),
  nibbles as Q4_0; ``w = d (q - 16)``. ``Q5_1`` 24 bytes: d, m, qh, nibbles; ``w = d q + m``.
- ``Q8_0`` 34 bytes / 32: d, 32 int8; ``w = d q``.
- ``Q4_K`` 144 bytes / 256: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32
  (``get_scale_min_k4``), 128 bytes of nibbles: in each 64 values, the low nibbles of 32 bytes
  are sub-block ``2c``, their high nibbles ``2c + 1``; ``w = d sc q - dmin mn``.
- ``Q5_K`` 176 bytes / 256: d, dmin, scales as Q4_K, 32 bytes of fifth bits (bit ``2c`` / ``2c+1``
  of byte ``l`` for value ``l`` of sub-blocks ``2c`` / ``2c+1``), 128 bytes of nibbles as Q4_K.
- ``Q6_K`` 210 bytes / 256: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (one per
  16 values), d; ``w = d sc (q - 32)`` (``dequantize_row_q6_K``).

Into edgectl's blocks (``to_w4`` / ``to_w5`` / ``to_w8``): Q4_0 and Q4_1 are W4 as they are (Q4_0's
``m = -8 d`` is exact in fp16), Q5_0 is W5 as it is (and Q4_0, its ``q + 8``), Q8_0 and Q5_0 are
W8 as they are (``q - 16`` fits int8); Q4_K's
sub-blocks become W4 blocks with ``d = fp16(d sc)`` and ``m = fp16(-dmin mn)`` (the only loss: those
two products rounded to fp16's 11 bits); anything else is dequantized here and quantized again
(``blocks.quantize_w4`` / ``quantize_w8``), which loses what a re-quantization loses.
"""

from __future__ import annotations

import torch

# The types, their block sizes and the bits each becomes are the contract's (read by the control
# plane too). layer_bits is also read here by cpu_int4/method.py.
from edgectl.contract.gguf_types import (  # noqa: F401
    BLOCK_SIZES,
    FLOAT_TYPES,
    NATIVE_BITS,
    SUPER_BLOCK,
    W5_TYPES,
    layer_bits,
)
from edgectl_runtime.formats import blocks

# The types whose blocks are edgectl's W4 / W5 / W8 blocks as they are, with those bits.
EXACT = {("Q4_0", 4), ("Q4_1", 4), ("Q8_0", 8), ("Q5_0", 8), ("Q5_0", 5), ("Q4_0", 5)}


def row_bytes(type_name: str, k: int) -> int:
    per, nbytes = BLOCK_SIZES[type_name]
    if k % per:
        raise ValueError(f"a {type_name} row holds a multiple of {per} values, not {k}")
    return k // per * nbytes


def _check(raw: torch.Tensor, type_name: str, k: int) -> torch.Tensor:
    if type_name not in BLOCK_SIZES:
        raise ValueError(f"GGUF tensor type {type_name} is not one edgectl reads")
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] != row_bytes(type_name, k):
        raise ValueError(f"expected uint8 [rows, {row_bytes(type_name, k)}] for {k} {type_name} values, "
                         f"got {raw.dtype} {tuple(raw.shape)}")
    per, nbytes = BLOCK_SIZES[type_name]
    return raw.reshape(raw.shape[0], k // per, nbytes)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """fp16 from its 2 little-endian bytes (the last dim), as fp32."""
    return b.contiguous().view(torch.float16).squeeze(-1).to(torch.float32)


def _nibbles32(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes per block -> 32 values: low nibbles first, then high (Q4_0 / Q4_1 / Q5_x order)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0 / Q5_1's 4 bytes -> bit j (0..31) of the little-endian uint32, as uint8 [.., 32]."""
    bits = torch.arange(8, dtype=torch.uint8)
    return ((qh.unsqueeze(-1) >> bits) & 1).reshape(*qh.shape[:-1], 32)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (``get_scale_min_k4``)."""
    s = s.to(torch.int32)
    lo_sc, lo_mn = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    hi_mn = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat([lo_sc, hi_sc], -1).to(torch.float32), torch.cat([lo_mn, hi_mn], -1).to(torch.float32)


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K's 128 bytes -> 8 sub-blocks of 32 values: per 64, the low nibbles of 32 bytes,
    then their high nibbles. Returns [.., 8, 32]."""
    q = qs.reshape(*qs.shape[:-1], 4, 32)
    return torch.stack([q & 0x0F, q >> 4], dim=-2).reshape(*qs.shape[:-1], 8, 32)


# --- the blocks' integer fields, per type: (q, d, m) with w = d * q + m per 32 values


def _q4_0(b):
    d = _f16(b[..., 0:2])
    return _nibbles32(b[..., 2:18]).to(torch.int32) - 8, d, torch.zeros_like(d)


def _q4_1(b):
    return _nibbles32(b[..., 4:20]).to(torch.int32), _f16(b[..., 0:2]), _f16(b[..., 2:4])


def _q5_0(b):
    q = _nibbles32(b[..., 6:22]).to(torch.int32) | (_fifth_bits(b[..., 2:6]).to(torch.int32) << 4)
    d = _f16(b[..., 0:2])
    return q - 16, d, torch.zeros_like(d)


def _q5_1(b):
    q = _nibbles32(b[..., 8:24]).to(torch.int32) | (_fifth_bits(b[..., 4:8]).to(torch.int32) << 4)
    return q, _f16(b[..., 0:2]), _f16(b[..., 2:4])


def _q8_0(b):
    d = _f16(b[..., 0:2])
    return b[..., 2:34].contiguous().view(torch.int8).to(torch.int32), d, torch.zeros_like(d)


def _split32(q, d, m):
    """Super-block fields [.., 8, 32] with per-sub-block d, m [.., 8] -> per-32 blocks."""
    rows, sb = q.shape[0], q.shape[1]
    return q.reshape(rows, sb * 8, 32), d.reshape(rows, sb * 8), m.reshape(rows, sb * 8)


def _q4_k(b):
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    q = _k_nibbles(b[..., 16:144]).to(torch.int32)
    return _split32(q, d.unsqueeze(-1) * sc, -dmin.unsqueeze(-1) * mn)


def _q5_k(b):
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    q = _k_nibbles(b[..., 48:176]).to(torch.int32)
    qh = b[..., 16:48].to(torch.int32).unsqueeze(-2)  # [.., 1, 32]: bit i of byte l -> sub-block i
    high = (qh >> torch.arange(8, dtype=torch.int32).view(8, 1)) & 1
    return _split32(q | (high << 4), d.unsqueeze(-1) * sc, -dmin.unsqueeze(-1) * mn)


def _q6_k_values(b) -> torch.Tensor:
    """fp32 [rows, superblocks, 256]: Q6_K has a scale per 16 values, so it is not a W block."""
    ql, qh = b[..., 0:128].to(torch.int32), b[..., 128:192].to(torch.int32)
    sc = b[..., 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[..., 208:210])
    halves = []
    for h in range(2):
        lo, hi = ql[..., 64 * h: 64 * h + 64], qh[..., 32 * h: 32 * h + 32]
        parts = [(lo[..., 0:32] & 0xF) | (((hi >> 0) & 3) << 4),
                 (lo[..., 32:64] & 0xF) | (((hi >> 2) & 3) << 4),
                 (lo[..., 0:32] >> 4) | (((hi >> 4) & 3) << 4),
                 (lo[..., 32:64] >> 4) | (((hi >> 6) & 3) << 4)]
        halves.append(torch.cat(parts, -1) - 32)  # [.., 128]
    q = torch.cat(halves, -1).to(torch.float32).reshape(*b.shape[:-1], 16, 16)
    return (q * (d.unsqueeze(-1) * sc).unsqueeze(-1)).reshape(*b.shape[:-1], SUPER_BLOCK)


_FIELDS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
           "Q4_K": _q4_k, "Q5_K": _q5_k}


def dequantize(raw: torch.Tensor, type_name: str, k: int) -> torch.Tensor:
    """fp32 ``[rows, k]``: the values llama.cpp computes with (its ``dequantize_row_*``)."""
    b = _check(raw, type_name, k)
    rows = b.shape[0]
    if type_name == "F32":
        return b.contiguous().view(torch.float32).reshape(rows, k).clone()
    if type_name in ("F16", "BF16"):
        dtype = torch.float16 if type_name == "F16" else torch.bfloat16
        return b.contiguous().view(dtype).reshape(rows, k).to(torch.float32)
    if type_name == "Q6_K":
        return _q6_k_values(b).reshape(rows, k)
    q, d, m = _FIELDS[type_name](b)
    return (q.to(torch.float32) * d.unsqueeze(-1) + m.unsqueeze(-1)).reshape(rows, k)


def to_w4(raw: torch.Tensor, type_name: str, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """edgectl's W4 fields ``(q uint8 [rows, kb*32], d fp16 [rows, kb], m fp16 [rows, kb])``
    (``blocks.quantize_w4``'s output, so ``blocks.pack_w4`` takes it)."""
    if type_name in ("Q4_0", "Q4_1", "Q4_K"):
        b = _check(raw, type_name, k)
        q, d, m = _FIELDS[type_name](b)
        if type_name == "Q4_0":  # w = d (q - 8) = d q + (-8 d)
            q, m = q + 8, -8.0 * d
        rows = raw.shape[0]
        return (q.to(torch.uint8).reshape(rows, -1), d.to(torch.float16).reshape(rows, -1),
                m.to(torch.float16).reshape(rows, -1))
    return blocks.quantize_w4(dequantize(raw, type_name, k))


def to_w5(raw: torch.Tensor, type_name: str, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """edgectl's W5 fields ``(q uint8 [rows, kb*32] in 0..31, d fp16 [rows, kb])`` of a Q5_0 or Q4_0
    tensor, as they are (``blocks.pack_w5`` takes them); any other type is refused (a W5 block has no
    minimum: ``layer_bits`` gives such a layer 8 bits)."""
    if (type_name, 5) not in EXACT:
        raise ValueError(f"a {type_name} tensor is not W5 blocks as it is (only {', '.join(sorted(W5_TYPES))})")
    b = _check(raw, type_name, k)
    q, d, _ = _FIELDS[type_name](b)  # q - 16 (Q5_0) or q - 8 (Q4_0), both w / d
    rows = raw.shape[0]
    return (q + blocks.W5_ZERO).to(torch.uint8).reshape(rows, -1), d.to(torch.float16).reshape(rows, -1)


def to_w8(raw: torch.Tensor, type_name: str, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """edgectl's W8 fields ``(q int8 [rows, kb*32], d fp16 [rows, kb])``."""
    if (type_name, 8) in EXACT:
        b = _check(raw, type_name, k)
        q, d, _ = _FIELDS[type_name](b)
        rows = raw.shape[0]
        return q.to(torch.int8).reshape(rows, -1), d.to(torch.float16).reshape(rows, -1)
    return blocks.quantize_w8(dequantize(raw, type_name, k))


def conversion(type_name: str, bits: int) -> str:
    """How a ``type_name`` tensor becomes a W``bits`` block: for the read-back and the logs."""
    if type_name in FLOAT_TYPES:
        return f"{type_name} quantized to W{bits}"
    if (type_name, bits) in EXACT:
        return f"{type_name} as W{bits} (exact)"
    if type_name == "Q4_K" and bits == 4:
        return "Q4_K as W4 (sub-block scales rounded to fp16)"
    return f"{type_name} re-quantized to W{bits}"
