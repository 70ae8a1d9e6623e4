"""The ``vllm`` kernel [w4a16-vllm]: vLLM's ``cpu_gemm_wna16``, only where its C library
registers it (``ops/wna16.py``), for linear layers whose N and K are multiples of 32; other
layers, and the LM head (it has no row lookup), take PyTorch's int4 kernel."""

from __future__ import annotations

import torch

from edgectl_runtime.formats.groups import quantize_int4
from edgectl_runtime.kernels.cpu_int4.kernel import Int4Kernel
from edgectl_runtime.kernels.cpu_int4.kernel_torch import TorchInt4Kernel
from edgectl_runtime.kernels.cpu_int4.names import NAME, S_ATTR, W_ATTR, Z_ATTR
from edgectl_runtime.kernels.ops.wna16 import (
    wna16_available,
    wna16_matmul,
    wna16_pack,
    wna16_unpack,
)


class VllmWna16Kernel(Int4Kernel):
    """See the module docstring."""

    name = "vllm"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.isa_hint = "vec"

    @classmethod
    def require(cls) -> None:
        if not wna16_available():
            raise ValueError("cpu_int4: EDGECTL_INT4_KERNEL=vllm needs vLLM's cpu_gemm_wna16, which the vLLM "
                             "library loaded on this CPU does not register (see `python -m "
                             "edgectl_runtime.tools.diagnostics.report`); use EDGECTL_INT4_KERNEL=torch or edgectl")

    @classmethod
    def lookup_kernel(cls) -> type[Int4Kernel]:
        return TorchInt4Kernel

    @classmethod
    def can_implement(cls, n: int, k: int) -> tuple[bool, str]:
        if n % 32 == 0 and k % 32 == 0:
            return True, ""
        return False, f"cpu_gemm_wna16 needs N and K multiples of 32, got [{n}, {k}]"

    @classmethod
    def fallback(cls) -> type[Int4Kernel]:
        return TorchInt4Kernel

    @classmethod
    def format_name(cls, bits: int, group: int) -> str:
        return f"{NAME}-wna16/g{group}"

    def process_weights(self, module: torch.nn.Module, dtype: torch.dtype) -> bool:
        group = self.layer.group_size
        stored = self.checkpoint.take_values(module, dtype, group)
        if stored is not None:
            q, scales, zeros = stored
            del stored
        else:
            weight = module.weight.data
            dtype = weight.dtype
            q, scales, zeros = quantize_int4(weight, group, dtype)
            delattr(module, "weight")
            del weight
        # vLLM's own choice (mixed_precision/cpu.py _get_isa_hint): AMX tiles for bf16 where present.
        self.isa_hint = "amx" if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported() else "vec"
        module.register_parameter(W_ATTR, torch.nn.Parameter(wna16_pack(q), requires_grad=False))
        del q
        self.install(module, {S_ATTR: scales.t().to(dtype).contiguous(),
                              Z_ATTR: zeros.t().to(torch.float32).contiguous()})
        return True

    def apply(self, holder: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return wna16_matmul(x, getattr(holder, W_ATTR), getattr(holder, S_ATTR), getattr(holder, Z_ATTR),
                            self.layer.group_size, self.isa_hint)

    def unpack(self, module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        scales = getattr(module, S_ATTR)
        q = wna16_unpack(getattr(module, W_ATTR), scales.shape[1])
        return q, scales.t(), getattr(module, Z_ATTR).t()
