"""The interface of one kernel of the ``cpu_int4`` method, after vLLM's ``MPLinearKernel``
(``vllm/model_executor/kernels/linear/mixed_precision/MPLinearKernel.py``): a class per kernel
says what it can hold and how it is named (class methods, asked once when a layer is created),
and an instance serves one layer: packs its weight, multiplies by it, looks rows up in it,
reads it back. The layer's lifecycle inside vLLM (create, load layer-wise, fall back to dense,
tie) is the method's (``method.py``), the same for every kernel.

The kernels: ``kernel_torch`` (PyTorch's int4 op), ``kernel_vllm`` (vLLM's ``cpu_gemm_wna16``),
``kernel_edgectl`` (edgectl's own library); ``kernel_choice.py`` names them and chooses.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from edgectl.contract.int4_layout import quantizable_partitions
from edgectl_runtime.formats.groups import dequantize_int4
from edgectl_runtime.kernels.cpu_int4.checkpoint import Int4Checkpoint


@dataclass(frozen=True)
class Int4Layer:
    """What a kernel knows of the layer it serves."""

    prefix: str
    role: str  # "linear", "lm_head" or "embedding"
    bits: int  # 4, or 8 for edgectl's W8
    n: int = 0  # out_features (all partitions)
    k: int = 0  # in_features
    group_size: int = 0  # the kernel's group (edgectl's: its blocks of 32)
    source_group: int = 0  # the group of the values quantized or stored (GPTQ/AWQ, portable)
    out_dtype: torch.dtype = torch.bfloat16  # the model's (params) dtype


class Int4Kernel(ABC):
    """One kernel: see the module docstring."""

    name: ClassVar[str]  # the setting (EDGECTL_INT4_KERNEL) and the read-back's "kernel"
    takes_gguf_blocks: ClassVar[bool] = False  # installs GGUF blocks as they are (gguf_loader.py)

    # --- the class: what this machine has, what a layer can be, chosen once

    @classmethod  # noqa: B027 (a no-op by default: a kernel every machine runs needs no check)
    def require(cls) -> None:
        """Raise ``ValueError``, with the fix, where this machine cannot run the kernel."""

    @classmethod
    def describe(cls) -> dict[str, Any]:
        """What the configuration's description adds when this kernel is in use."""
        return {}

    @classmethod
    def lookup_kernel(cls) -> type[Int4Kernel]:
        """The kernel of an int4 LM head / tied embedding next to linear layers on this one."""
        return cls

    @classmethod
    def can_implement(cls, n: int, k: int) -> tuple[bool, str]:
        """Whether the kernel runs a ``[n, k]`` weight, and if not why."""
        return True, ""

    @classmethod
    def fallback(cls) -> type[Int4Kernel]:
        """The kernel that takes a layer this one cannot run."""
        raise NotImplementedError(f"the {cls.name} kernel runs every shape")

    @classmethod
    def holds(cls, sizes: list[int], k: int, bits: int, group_setting: int, stored_groups: bool) -> tuple[bool, str]:
        """Whether a layer ``[sum(sizes), k]`` can be quantized for this kernel, and why (not);
        ``stored_groups``: a portable checkpoint's groups (the shared rule of int4 groups)."""
        return quantizable_partitions(sizes, k, group_setting)

    @classmethod
    def kernel_group(cls, source_group: int) -> int:
        """The group the kernel multiplies with, for values quantized in groups of ``source_group``."""
        return source_group

    @classmethod
    @abstractmethod
    def format_name(cls, bits: int, group: int) -> str:
        """The read-back name of a layer's format (the plan's weight formats)."""

    @classmethod
    def pack_gguf(cls, parts: list[tuple[str, torch.Tensor, int]], n: int, k: int, bits: int) -> torch.Tensor:
        """GGUF tensors ``(ggml type, raw rows, k)`` packed as they are (``takes_gguf_blocks``)."""
        raise NotImplementedError(f"the {cls.name} kernel does not take GGUF blocks")

    # --- the instance: one layer

    def __init__(self, layer: Int4Layer, checkpoint: Int4Checkpoint) -> None:
        self.layer = layer
        self.checkpoint = checkpoint

    @abstractmethod
    def process_weights(self, module: torch.nn.Module, dtype: torch.dtype) -> bool:
        """Replace the loaded weight (a checkpoint's 4-bit tensors or a dense weight) by the
        kernel's tensors; False where the layer must stay dense (it then keeps its weight)."""

    def pack_arriving(self, module: torch.nn.Module, loaded: torch.Tensor, dtype: torch.dtype) -> bool:
        """Quantize an LM head / embedding straight from its checkpoint tensor as it arrives; False
        where it must stay dense (it then holds ``loaded`` as its weight, padded to ``n`` rows)."""
        raise NotImplementedError(f"the {self.name} kernel serves no LM head")

    @abstractmethod
    def apply(self, holder: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x`` times the weight that ``holder`` (this layer, or the embedding a head is tied to) packs."""

    def embedding(self, module: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids`` of the packed weight, dequantized, in the model's dtype."""
        raise NotImplementedError(f"the {self.name} kernel has no row lookup")

    @abstractmethod
    def unpack(self, module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q uint8 [N, K], scales [N, K/g], zeros [N, K/g])`` read back from the kernel's tensors."""

    def dequantize(self, module: torch.nn.Module) -> torch.Tensor:
        """The fp32 weight ``[N, K]`` the kernel multiplies by."""
        return dequantize_int4(*self.unpack(module))[:, :self.layer.k]

    @staticmethod
    def install(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """The kernel's tensors become the layer's only parameters; vLLM's global pass then skips it."""
        for name, tensor in tensors.items():
            module.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
        module._already_called_process_weights_after_loading = True


def dense_weight(module: torch.nn.Module, prefix: str) -> torch.Tensor:
    """The loaded dense weight, refused if the checkpoint never fed it."""
    weight = module.weight.data
    if weight.is_meta:
        raise RuntimeError(f"cpu_int4: {prefix} was never loaded from the checkpoint")
    return weight

