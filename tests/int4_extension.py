"""A vLLM worker extension for the int4 engine tests: edgectl's read-back RPCs plus two that only
tests use. A test double: it lives under tests/ and never ships.

    LLM(..., worker_extension_cls="int4_extension.Int4TestExtension")
    llm.collective_rpc("edgectl_dump_int4", args=(path,))          # every int4 layer, unpacked
    llm.collective_rpc("edgectl_int4_matmul_check", args=([1, 3],))  # apply() vs the dequantized weight

The module is found in vLLM's worker processes because they are spawned with the test script's
``sys.path`` (tests/ first).
"""

from __future__ import annotations

import torch

from edgectl_runtime.service.readback import ReadbackExtension


def dump_int4_layers(model: torch.nn.Module, path: str) -> int:
    """Write every int4 layer's unpacked values and scales/zeros (as read back from the kernel's
    tensors) to a safetensors file: ``NAME.q`` uint8 ``[N, K]``, ``NAME.scales`` and
    ``NAME.zeros`` ``[N, K/g]``; returns the number of layers."""
    from safetensors.torch import save_file

    from edgectl_runtime.kernels.cpu_int4 import (
        W_ATTR,
        CpuInt4LinearMethod,
        unpack_layer,
    )

    tensors = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if not isinstance(method, CpuInt4LinearMethod) or not hasattr(module, W_ATTR) or method.bits != 4:
            continue
        q, scales, zeros = unpack_layer(module)
        tensors[f"{name}.q"] = q.contiguous()
        tensors[f"{name}.scales"] = scales.contiguous()
        tensors[f"{name}.zeros"] = zeros.contiguous()
        tensors[f"{name}.group_size"] = torch.tensor([method.group_size])
    save_file(tensors, path)
    return sum(1 for k in tensors if k.endswith(".q"))


class Int4TestExtension(ReadbackExtension):
    def edgectl_dump_int4(self, path: str) -> int:
        return dump_int4_layers(self.get_model(), path)

    def edgectl_int4_matmul_check(self, m_values: list[int]) -> dict[str, float]:
        """Max relative error, over quantized layers, of the layer's own ``apply`` against the
        dequantized weight, for activations of each M in ``m_values`` (eager, in the worker)."""
        from edgectl_runtime.kernels.cpu_int4 import (
            W_ATTR,
            CpuInt4LinearMethod,
            dequantized_weight,
        )

        model = self.get_model()
        gen = torch.Generator().manual_seed(0)
        worst: dict[str, float] = {}
        for _name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if not isinstance(method, CpuInt4LinearMethod) or not hasattr(module, W_ATTR):
                continue
            w = dequantized_weight(module)
            k = w.shape[1]
            dtype = method.out_dtype
            for m in m_values:
                x = torch.randn(m, k, generator=gen).to(dtype)
                out = method.apply(module, x).float()
                ref = x.float() @ w.t()
                rel = float((out - ref).norm() / ref.norm().clamp_min(1e-12))
                worst[str(m)] = max(worst.get(str(m), 0.0), rel)
        return worst

    def edgectl_dump_dequantized(self, path: str, names: list[str]) -> list[str]:
        """The fp32 weights edgectl's kernels multiply by (``w = d q + m`` / ``d q``, computed like
        formats.blocks.dequantize_*), of the named layers, to a safetensors file."""
        from safetensors.torch import save_file

        from edgectl_runtime.formats import blocks
        from edgectl_runtime.kernels.cpu_int4 import W_ATTR

        modules = dict(self.get_model().named_modules())
        tensors = {}
        for name in names:
            layer = modules[name]
            method, packed = layer.quant_method, getattr(layer, W_ATTR)
            if method.bits == 4:
                w = blocks.dequantize_w4(*blocks.unpack_w4(packed, method.n), method.k)
            else:
                w = blocks.dequantize_w8(*blocks.unpack_w8(packed, method.n), method.k)
            tensors[name] = w.contiguous()
        save_file(tensors, path)
        return sorted(tensors)
