"""GPTQ / AWQ 4-bit checkpoints converted to the group-wise form of :mod:`.groups` at load time
(exact: their groups are split into the kernel's, their zero points become float zeros)."""

from __future__ import annotations

import torch

# AWQ packs eight output columns per int32 in this order: nibble i holds column _AWQ_ORDER[i].
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_int32(packed: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Eight 4-bit values per int32 along ``dim`` (0 or 1), nibble i first unless ``order`` says
    which position nibble i holds. Returns uint8 values 0..15."""
    vals = (packed.to(torch.int32).unsqueeze(-1) >> _SHIFTS) & 0x0F  # [..., 8] by nibble
    if order is not None:
        inverse = [order.index(j) for j in range(8)]
        vals = vals[..., inverse]
    if dim == 1:
        return vals.reshape(packed.shape[0], packed.shape[1] * 8).to(torch.uint8)
    return vals.permute(0, 2, 1).reshape(packed.shape[0] * 8, packed.shape[1]).to(torch.uint8)


def pack_int32(q: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Inverse of :func:`unpack_int32` (writes GPTQ/AWQ-style tensors, e.g. for tests)."""
    q = q.to(torch.int32)
    if dim == 0:
        q = q.t()
    groups = q.reshape(q.shape[0], q.shape[1] // 8, 8)
    if order is not None:
        groups = groups[..., list(order)]
    packed = (groups << _SHIFTS).sum(-1, dtype=torch.int64)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.t().contiguous() if dim == 0 else packed.contiguous()


def from_zero_points(q_in_k: torch.Tensor, zero_points: torch.Tensor, scales: torch.Tensor,
                     group_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ/AWQ ``w = (q - zp) * s`` (q ``[K, N]``, zp and s ``[K/gc, N]``) as this module's
    ``w = (q - 8) * s + z``: returns q ``[N, K]``, scales and zeros ``[N, K/g]`` for a kernel group
    ``g`` that divides the checkpoint's group (the checkpoint's scales repeat, so the conversion
    is exact up to rounding z = (8 - zp) * s to ``dtype``)."""
    k, n = q_in_k.shape
    ckpt_groups = scales.shape[0]
    repeat = (k // group_size) // ckpt_groups
    s = scales.to(torch.float32)
    z = (8.0 - zero_points.to(torch.float32)) * s
    s = s.repeat_interleave(repeat, dim=0)
    z = z.repeat_interleave(repeat, dim=0)
    return q_in_k.t().contiguous(), s.t().to(dtype).contiguous(), z.t().to(dtype).contiguous()


def gptq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor | None, scales: torch.Tensor, *, sym: bool,
                 zero_offset: int, group_size: int, dtype: torch.dtype):
    """GPTQ (``qweight`` int32 ``[K/8, N]`` packed along K, ``qzeros`` ``[K/gc, N/8]``) -> q, s, z.
    Symmetric GPTQ has zp = 8 (vLLM's ``uint4b8``); asymmetric v1 checkpoints store zp - 1
    (``zero_offset`` 1), ``gptq_v2`` stores zp (0)."""
    q = unpack_int32(qweight, dim=0)
    if sym or qzeros is None:
        zp = torch.full(scales.shape, 8.0)
    else:
        # v1 stores zp - 1 in four bits, so zp = 0 was written as 15 (AutoGPTQ's off-by-one):
        # adding the offset back is modulo 16.
        zp = ((unpack_int32(qzeros, dim=1).to(torch.int32) + zero_offset) % 16).to(torch.float32)
    return from_zero_points(q, zp, scales, group_size, dtype)


def awq_to_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, group_size: int,
                dtype: torch.dtype):
    """AWQ GEMM (``qweight`` int32 ``[K, N/8]`` and ``qzeros`` ``[K/gc, N/8]``, both packed along N in
    AWQ's column order) -> q, s, z."""
    q = unpack_int32(qweight, dim=1, order=_AWQ_ORDER)
    zp = unpack_int32(qzeros, dim=1, order=_AWQ_ORDER).to(torch.float32)
    return from_zero_points(q, zp, scales, group_size, dtype)
