"""The 4-bit tensors a checkpoint stores: a GPTQ (desc_act=false) or AWQ GEMM checkpoint, or a
portable one written by ``edgectl quantize``. Their parameters as vLLM's loaders fill them, and
their values read back as group-wise int4 (``formats.gptq_awq``, ``formats.groups``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from edgectl_runtime.formats.gptq_awq import awq_to_int4, gptq_to_int4
from edgectl_runtime.formats.groups import unpack_nibbles

# (name, shape, dtype, weight attributes other than the loader) of one parameter
ParamSpec = tuple[str, tuple[int, int], torch.dtype, dict[str, Any]]

_ROWS_OUT = {"input_dim": 1, "output_dim": 0}  # [N, ...]: a portable checkpoint's tensors
_COLUMNS_OUT = {"input_dim": 0, "output_dim": 1}  # [..., N]: GPTQ's and AWQ's
_PACKED8 = {"packed_factor": 8, "pack_factor": 8}  # eight 4-bit values per int32


@dataclass(frozen=True)
class Int4Checkpoint:
    """What a layer's checkpoint stores: ``source`` ("dense", "portable", "gptq", "awq") and, for
    GPTQ, its symmetry and zero-point offset (``CpuInt4Config.ckpt_sym``, ``ckpt_zero_offset``)."""

    source: str
    sym: bool = True
    zero_offset: int = 1

    def prequantized_params(self, n: int, k: int, groups: int) -> tuple[ParamSpec, ...]:
        """Parameters shaped like a GPTQ/AWQ checkpoint's tensors (vLLM's loaders place the q/k/v
        and gate/up shards). The checkpoint's fp16 scales are held in fp32 until packed (a bf16
        parameter would round them)."""
        along_k = {**_COLUMNS_OUT, "packed_dim": 0, **_PACKED8}
        along_n = {**_COLUMNS_OUT, "packed_dim": 1, **_PACKED8}
        qweight = ("qweight", (k // 8, n), torch.int32, along_k) if self.source == "gptq" else \
            ("qweight", (k, n // 8), torch.int32, along_n)
        return (qweight,
                ("qzeros", (groups, n // 8), torch.int32, along_n),
                ("scales", (groups, n), torch.float32, dict(_COLUMNS_OUT)))

    @staticmethod
    def portable_params(n: int, k: int, groups: int, dtype: torch.dtype) -> tuple[ParamSpec, ...]:
        """Parameters of a portable checkpoint's layer: nibbles, scales and zeros per group."""
        return (("qweight", (n, k // 2), torch.uint8, dict(_ROWS_OUT)),
                ("scales", (n, groups), dtype, dict(_ROWS_OUT)),
                ("zeros", (n, groups), dtype, dict(_ROWS_OUT)))

    def take_values(self, layer: torch.nn.Module, dtype: torch.dtype, group: int):
        """``(q, scales, zeros)`` of a checkpoint stored in 4 bits (GPTQ/AWQ with groups of
        ``group``, or edgectl's portable format), its tensors removed from the layer; None for a
        dense checkpoint."""
        if "qzeros" in layer._parameters:  # GPTQ / AWQ
            return self._prequantized_values(layer, dtype, group)
        if "qweight" in layer._parameters:
            q = unpack_nibbles(layer.qweight.data)
            scales, zeros = layer.scales.data, layer.zeros.data
            for name in ("qweight", "scales", "zeros"):
                delattr(layer, name)
            return q, scales, zeros
        return None

    def _prequantized_values(self, layer: torch.nn.Module, dtype: torch.dtype, group: int):
        qweight, qzeros, scales = layer.qweight.data, layer.qzeros.data, layer.scales.data
        for name in ("qweight", "qzeros", "scales"):
            delattr(layer, name)
        if self.source == "gptq":
            return gptq_to_int4(qweight, qzeros, scales, sym=self.sym, zero_offset=self.zero_offset,
                                group_size=group, dtype=dtype)
        return awq_to_int4(qweight, qzeros, scales, group_size=group, dtype=dtype)
