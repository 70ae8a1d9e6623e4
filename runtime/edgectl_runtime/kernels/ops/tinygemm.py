"""PyTorch's CPU int4 kernel (``aten._weight_int4pack_mm_for_cpu``, the ``w4a16`` format):
packing for it, calling it, and the layout it packs into on this ISA.

The packed layout depends on the ISA (``BLOCK_N`` 64 on AVX-512, 32 on AVX2 and scalar; measured,
tests/test_int4_kernel.py), so weights are packed on the target at load time, never stored.
The layout is *learned* by probing the pack op (:class:`PackedLayout`) so a tied embedding can
look up rows in the packed copy; every use is verified at load.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# Rows packed per call of the pack op. Packing in row blocks is byte-identical to packing the
# whole matrix when the block is a multiple of the kernel's BLOCK_N (32 on AVX2, 64 on
# AVX-512; measured on both, tests/test_int4_kernel.py), and it bounds the int32 transient
# the pack op needs to BLOCK x K x 4 bytes.
PACK_BLOCK_ROWS = 256


def kernel_pack(q: torch.Tensor, block_rows: int = PACK_BLOCK_ROWS) -> torch.Tensor:
    """torch's packed ``uint8 [N, K/2]`` of ``q`` (``uint8``/int ``[N, K]``, values 0..15)."""
    n, k = q.shape
    if block_rows % 64:
        raise ValueError("block_rows must be a multiple of 64 (the AVX-512 kernel's BLOCK_N)")
    out = torch.empty((n, k // 2), dtype=torch.uint8)
    for r0 in range(0, n, block_rows):
        r1 = min(n, r0 + block_rows)
        out[r0:r1] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q[r0:r1].to(torch.int32).contiguous(), 1)
    return out


def scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[N, K/g]`` scales and zeros -> the kernel's ``[K/g, N, 2]`` in the activation dtype."""
    return torch.stack([scales.t().to(dtype), zeros.t().to(dtype)], dim=-1).contiguous()


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int, sz: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ W^T`` with W packed for this ISA; the output has x's dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, packed, group_size, sz)
    return out.reshape(*x.shape[:-1], out.shape[-1])


class LayoutUnknown(RuntimeError):
    """The pack op's layout on this machine does not follow the structure gather_rows assumes."""


def _nibble_slots(packed: torch.Tensor) -> torch.Tensor:
    flat = packed.reshape(-1)
    return torch.stack([flat & 0x0F, flat >> 4], dim=1).reshape(-1).to(torch.int64)


def _observed_map(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) held by every nibble slot of the packed ``[n, k]`` matrix, by probing the
    pack op with the base-16 digits of the row and column indices."""
    rows = torch.arange(n).unsqueeze(1).expand(n, k)
    cols = torch.arange(k).unsqueeze(0).expand(n, k)
    row_of = torch.zeros(n * k, dtype=torch.int64)
    col_of = torch.zeros(n * k, dtype=torch.int64)
    for digit in range(3):  # rows < 4096, columns < 4096
        scale = 16 ** digit
        row_of += scale * _nibble_slots(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            ((rows // scale) % 16).to(torch.int32).contiguous(), 1))
        col_of += scale * _nibble_slots(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            ((cols // scale) % 16).to(torch.int32).contiguous(), 1))
    return row_of, col_of


@dataclass(frozen=True)
class PackedLayout:
    """Where torch's pack op puts nibble (row, column) on this machine.

    Observed structure (AVX2: 32, AVX-512: 64, scalar: 32): rows in blocks of ``block_rows``
    stored one after the other; inside a block of ``nb`` rows, column k occupies nibble slots
    ``[k*nb, (k+1)*nb)`` and row j of the block sits at slot ``perm[nb][j]`` of that range. The
    structure is *learned* by probing the op (:meth:`discover`), and every use is verified
    against known values at load time, so a different torch or ISA fails loudly instead of
    returning wrong rows.
    """

    block_rows: int
    perm_table: torch.Tensor  # int64 [block_rows // 16 + 1, block_rows]: row j -> slot, by nb // 16

    def slot_map(self, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (row, column) of every slot predicted for a packed ``[n, k]`` matrix."""
        rows = torch.arange(n)
        slots = self.row_slots(rows, n, k)  # [n, k]
        row_of = torch.empty(n * k, dtype=torch.int64)
        col_of = torch.empty(n * k, dtype=torch.int64)
        row_of[slots.reshape(-1)] = rows.unsqueeze(1).expand(n, k).reshape(-1)
        col_of[slots.reshape(-1)] = torch.arange(k).unsqueeze(0).expand(n, k).reshape(-1)
        return row_of, col_of

    def row_slots(self, rows: torch.Tensor, n: int, k: int) -> torch.Tensor:
        bn = self.block_rows
        block = rows // bn
        j = rows - block * bn
        full = n // bn
        nb = torch.where(block < full, torch.full_like(rows, bn), torch.full_like(rows, n - full * bn))
        pos = self.perm_table[nb // 16, j]
        base = block * (bn * k) + pos
        return base.unsqueeze(1) + torch.arange(k).unsqueeze(0) * nb.unsqueeze(1)

    def gather_rows(self, packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` of the int4 matrix packed in ``packed`` (``uint8 [N, K/2]``), as
        ``uint8 [len(rows), K]`` values 0..15. Reads only the bytes of those rows."""
        return gather_packed_rows(packed, rows, self.block_rows, self.perm_table)

    @classmethod
    def discover(cls) -> "PackedLayout":
        k = 4
        for bn in (16, 32, 64, 128, 256):
            row_of, col_of = _observed_map(2 * bn, k)
            # Block 0, column 0 occupies slots [0, bn) if the structure holds.
            first = row_of[:bn]
            if sorted(first.tolist()) != list(range(bn)) or bool((col_of[:bn] != 0).any()):
                continue
            perm = torch.empty(bn, dtype=torch.int64)
            perm[first] = torch.arange(bn)
            table = torch.zeros(bn // 16 + 1, bn, dtype=torch.int64)
            table[bn // 16] = perm
            candidate = cls(bn, table)
            if not _matches(candidate, 2 * bn, k):
                continue
            # Tail blocks (N % block_rows = 16, 32, ...) have their own arrangement.
            for tail in range(16, bn, 16):
                n = bn + tail
                row_of, col_of = _observed_map(n, k)
                seg = row_of[bn * k: bn * k + tail] - bn
                if sorted(seg.tolist()) != list(range(tail)):
                    raise LayoutUnknown(f"tail block of {tail} rows does not follow the block structure")
                tperm = torch.empty(tail, dtype=torch.int64)
                tperm[seg] = torch.arange(tail)
                table[tail // 16, :tail] = tperm
            layout = cls(bn, table)
            for n, kk in ((bn + 16, 6), (3 * bn + 16, 10), (bn, 2)):
                if not _matches(layout, n, kk):
                    raise LayoutUnknown(f"layout model for block {bn} does not predict a [{n}, {kk}] pack")
            return layout
        raise LayoutUnknown("the int4 pack op's output is not blocked by rows as expected")


def gather_packed_rows(packed: torch.Tensor, rows: torch.Tensor, block_rows: int,
                       perm_table: torch.Tensor) -> torch.Tensor:
    """See :meth:`PackedLayout.gather_rows` (a plain function so torch.compile traces it)."""
    n, half = packed.shape
    k = half * 2
    block = rows // block_rows
    j = rows - block * block_rows
    full = n // block_rows
    nb = torch.where(block < full, torch.full_like(rows, block_rows), torch.full_like(rows, n - full * block_rows))
    pos = perm_table[nb // 16, j]
    byte0 = block * (block_rows * half) + pos // 2
    idx = byte0.unsqueeze(1) + torch.arange(k, device=rows.device).unsqueeze(0) * (nb // 2).unsqueeze(1)
    vals = packed.reshape(-1)[idx]
    high = (pos % 2 == 1).unsqueeze(1)
    return torch.where(high, vals >> 4, vals & 0x0F)


def _matches(layout: PackedLayout, n: int, k: int) -> bool:
    row_of, col_of = _observed_map(n, k)
    prow, pcol = layout.slot_map(n, k)
    return bool(torch.equal(row_of, prow) and torch.equal(col_of, pcol))


@functools.cache
def packed_layout() -> PackedLayout:
    """This process's packed layout (learned once; a few tiny pack calls)."""
    return PackedLayout.discover()
