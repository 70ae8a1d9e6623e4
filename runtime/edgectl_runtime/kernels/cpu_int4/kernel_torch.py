"""The ``torch`` kernel [w4a16]: PyTorch's ``_weight_int4pack_mm_for_cpu``, groups of 32-256,
activations in the model dtype (``ops/tinygemm.py``). Its packed layout is learned
(``tinygemm.packed_layout``), so a tied embedding's row lookup is verified at load and the
embedding stays dense where it does not match."""

from __future__ import annotations

import logging

import torch

from edgectl_runtime.formats.groups import dequantize_int4, quantize_int4
from edgectl_runtime.kernels.cpu_int4.kernel import Int4Kernel, dense_weight
from edgectl_runtime.kernels.cpu_int4.names import LAYOUT_ATTR, NAME, SZ_ATTR, W_ATTR
from edgectl_runtime.kernels.ops.tinygemm import (
    PACK_BLOCK_ROWS,
    LayoutUnknown,
    gather_packed_rows,
    int4_matmul,
    kernel_pack,
    packed_layout,
    scales_and_zeros,
)

logger = logging.getLogger("edgectl.cpu_int4")


class TorchInt4Kernel(Int4Kernel):
    """See the module docstring."""

    name = "torch"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.block_rows = 0  # a tied embedding's PackedLayout.block_rows

    @classmethod
    def format_name(cls, bits: int, group: int) -> str:
        return f"{NAME}/g{group}"

    def process_weights(self, module: torch.nn.Module, dtype: torch.dtype) -> bool:
        group = self.layer.group_size
        stored = self.checkpoint.take_values(module, dtype, group)
        if stored is not None:
            q, scales, zeros = stored
            del stored
            packed = kernel_pack(q)
            del q
            sz = scales_and_zeros(scales, zeros, dtype)
        else:
            weight = dense_weight(module, self.layer.prefix)
            dtype = weight.dtype
            packed, sz = _quantize_and_pack(weight, group, dtype)
            if self.layer.role == "embedding" and not _verify_rows(packed, weight, group, dtype):
                return False
            delattr(module, "weight")
            del weight
        self._install_packed(module, packed, sz)
        return True

    def pack_arriving(self, module: torch.nn.Module, loaded: torch.Tensor, dtype: torch.dtype) -> bool:
        n, k, group = self.layer.n, self.layer.k, self.layer.group_size
        packed, sz = _quantize_and_pack(loaded, group, dtype, n_total=n)
        if self.layer.role == "embedding" and not _verify_rows(packed, loaded, group, dtype):
            # Keep the model correct: the embedding stays dense (vLLM's own method).
            dense = torch.zeros((n, k), dtype=dtype)
            dense[: loaded.shape[0]] = loaded
            module.register_parameter("weight", torch.nn.Parameter(dense, requires_grad=False))
            return False
        del module._parameters["weight"]
        self._install_packed(module, packed, sz)
        return True

    def _install_packed(self, module: torch.nn.Module, packed: torch.Tensor, sz: torch.Tensor) -> None:
        module.register_parameter(W_ATTR, torch.nn.Parameter(packed, requires_grad=False))
        module.register_parameter(SZ_ATTR, torch.nn.Parameter(sz, requires_grad=False))
        if self.layer.role == "embedding":
            # The lookup's slot table, as a (tiny) buffer so torch.compile sees a module tensor.
            layout = packed_layout()
            self.block_rows = layout.block_rows
            module.register_buffer(LAYOUT_ATTR, layout.perm_table.clone(), persistent=False)
        module._already_called_process_weights_after_loading = True

    def apply(self, holder: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return int4_matmul(x, getattr(holder, W_ATTR), self.layer.group_size, getattr(holder, SZ_ATTR))

    def embedding(self, module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        packed, sz = getattr(module, W_ATTR), getattr(module, SZ_ATTR)
        shape = ids.shape
        rows = ids.reshape(-1)
        q = gather_packed_rows(packed, rows, self.block_rows, getattr(module, LAYOUT_ATTR))  # [M, K]
        out = dequantize_int4(q, sz[:, rows, 0].t(), sz[:, rows, 1].t())
        return out.to(sz.dtype).reshape(*shape, -1)

    def unpack(self, module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed = getattr(module, W_ATTR)
        q = packed_layout().gather_rows(packed, torch.arange(packed.shape[0]))
        sz = getattr(module, SZ_ATTR)
        return q, sz[:, :, 0].t(), sz[:, :, 1].t()


def _quantize_and_pack(weight: torch.Tensor, group_size: int, dtype: torch.dtype,
                       n_total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize and pack ``weight`` in blocks of rows: (packed ``uint8 [N, K/2]``, scales and
    zeros ``[K/g, N, 2]``). Rows past ``weight``'s own up to ``n_total`` (vLLM's vocabulary
    padding) are zeros. The transient is one block of fp32 rows."""
    real, k = weight.shape
    n = n_total if n_total is not None else real
    packed = torch.empty((n, k // 2), dtype=torch.uint8)
    sz = torch.empty((k // group_size, n, 2), dtype=dtype)
    for r0 in range(0, n, PACK_BLOCK_ROWS):
        r1 = min(n, r0 + PACK_BLOCK_ROWS)
        block = weight[r0:min(r1, real)]
        if block.shape[0] < r1 - r0:
            # Padding in the checkpoint's own dtype, like every other block (and like _verify_rows).
            block = torch.cat([block, block.new_zeros((r1 - r0 - block.shape[0], k))])
        qb, s, z = quantize_int4(block, group_size, dtype)
        packed[r0:r1] = kernel_pack(qb)
        sz[:, r0:r1] = scales_and_zeros(s, z, dtype)
    return packed, sz


def _verify_rows(packed: torch.Tensor, weight: torch.Tensor, group_size: int, dtype: torch.dtype,
                 samples: int = 97) -> bool:
    """Whether packed-row lookup (PyTorch's layout, learned) returns exactly the quantized rows of
    ``weight`` (a spread sample, the first and the last rows, which include any tail block)."""
    real = weight.shape[0]
    rows = torch.unique(torch.cat([torch.linspace(0, real - 1, samples, dtype=torch.float64).long(),
                                   torch.arange(max(0, real - 64), real)]))
    expected, _, _ = quantize_int4(weight[rows], group_size, dtype)
    try:
        return bool(torch.equal(packed_layout().gather_rows(packed, rows), expected))
    except LayoutUnknown as exc:
        logger.warning("cpu_int4: %s", exc)
        return False
