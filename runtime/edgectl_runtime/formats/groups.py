"""Group-wise asymmetric int4: ``w = (q - 8) * scale + zero`` per row and group of columns.

The arithmetic of PyTorch's CPU int4 kernel (``aten._weight_int4pack_mm_for_cpu``, the ``w4a16``
format) and of the portable ``cpu_int4`` checkpoint (``edgectl_runtime.tools.quantize``). Scale and
zero are rounded to their storage dtype *before* q is computed, because the kernel reads them
in that dtype: q is chosen against the values actually used. Round half to even.
"""

from __future__ import annotations

import torch

# Rows quantized at a time: bounds the fp32 transient to ROWS x K x 4 bytes.
QUANT_BLOCK_ROWS = 256


def quantize_int4(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype,
                  block_rows: int = QUANT_BLOCK_ROWS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric int4 of ``weight [N, K]`` in groups of ``group_size`` columns.

    Returns ``q`` uint8 ``[N, K]`` (0..15), ``scales`` and ``zeros`` ``[N, K/g]`` in
    ``scale_dtype``, such that ``w ~ (q - 8) * scale + zero``. With min/max ranges a group of 32
    reproduces Q4_1-derived weights (``d * q + m``) up to the rounding of d and m to
    ``scale_dtype`` (:mod:`.blocks` keeps Q4_1's own fp16 d and m, and is exact).
    """
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if group_size <= 0 or k % group_size != 0:
        raise ValueError(f"group size {group_size} does not divide in_features {k}")
    groups = k // group_size
    q = torch.empty((n, k), dtype=torch.uint8)
    scales = torch.empty((n, groups), dtype=scale_dtype)
    zeros = torch.empty((n, groups), dtype=scale_dtype)
    for r0 in range(0, n, block_rows):
        r1 = min(n, r0 + block_rows)
        w = weight[r0:r1].to(torch.float32).reshape(r1 - r0, groups, group_size)
        lo = w.amin(dim=-1)
        hi = w.amax(dim=-1)
        s = ((hi - lo) / 15.0).to(scale_dtype).to(torch.float32)
        z = (lo + 8.0 * s).to(scale_dtype).to(torch.float32)
        positive = s > 0
        s_safe = torch.where(positive, s, torch.ones_like(s))
        v = (w - z.unsqueeze(-1)) / s_safe.unsqueeze(-1)  # a fresh tensor: edited in place below
        v.masked_fill_(~positive.unsqueeze(-1), 0.0)
        qb = v.add_(8.0).round_().clamp_(0, 15).to(torch.uint8)
        q[r0:r1] = qb.reshape(r1 - r0, k)
        scales[r0:r1] = s.to(scale_dtype)
        zeros[r0:r1] = z.to(scale_dtype)
    return q, scales, zeros


def dequantize_int4(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """The fp32 weight ``(q - 8) * scale + zero`` of ``q [N, K]`` with ``[N, K/g]`` scales/zeros."""
    n, k = q.shape
    groups = scales.shape[1]
    g = k // groups
    w = (q.to(torch.float32).reshape(n, groups, g) - 8.0) * scales.to(torch.float32).unsqueeze(-1)
    w = w + zeros.to(torch.float32).unsqueeze(-1)
    return w.reshape(n, k)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """Portable packing: ``uint8 [N, K]`` (0..15) -> ``uint8 [N, K/2]``, even column low."""
    if q.shape[-1] % 2:
        raise ValueError("in_features must be even to pack two int4 values per byte")
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`."""
    n, half = packed.shape
    out = torch.empty((n, half * 2), dtype=torch.uint8)
    out[:, 0::2] = packed & 0x0F
    out[:, 1::2] = packed >> 4
    return out
