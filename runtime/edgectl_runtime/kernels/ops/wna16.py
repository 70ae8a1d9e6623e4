"""vLLM's own W4A16 kernel, ``torch.ops._C.cpu_gemm_wna16`` (the ``w4a16-vllm`` format): only
vLLM's AVX-512 C libraries register it (``_C``, ``_C_AVX512``; not ``_C_AVX2``)."""

from __future__ import annotations

import torch


def wna16_available() -> bool:
    """Whether vLLM's loaded C library registers ``cpu_gemm_wna16`` (its AVX-512 builds only)."""
    import vllm._custom_ops  # noqa: F401  (loads the library vLLM picked for this CPU)

    return hasattr(torch.ops._C, "cpu_gemm_wna16")


def wna16_pack(q: torch.Tensor) -> torch.Tensor:
    """``q`` (``[N, K]``, 0..15) in ``cpu_gemm_wna16``'s layout: int32 ``[N/16, 2K]``, eight output
    channels per int32 and blocks of 16 channels contiguous over K (the layout vLLM's
    CPUWNA16LinearKernel builds from GPTQ, mixed_precision/cpu.py ``_process_gptq_weights_w4a16``)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        pack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    n, k = q.shape
    w = pack_quantized_values_into_int32(q.t().contiguous().to(torch.int32), scalar_types.uint4b8, 1)  # [K, N/8]
    return w.reshape(k, n // 16, 2).permute(1, 0, 2).reshape(n // 16, 2 * k).contiguous()


def wna16_unpack(w: torch.Tensor, n: int) -> torch.Tensor:
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    k = w.shape[1] // 2
    kn8 = w.reshape(n // 16, k, 2).permute(1, 0, 2).reshape(k, n // 8)
    return unpack_quantized_values_into_int32(kn8, scalar_types.uint4b8, 1).t().to(torch.uint8).contiguous()


def wna16_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int, isa_hint: str = "vec") -> torch.Tensor:
    """``x @ W^T`` with ``W = (q - 8) * scale + zero``: vLLM's kernel computes the symmetric part
    ``(q - 8) * scale`` (GPTQ ``uint4b8``, no zero points), and the zero term, one value per group
    and output, is ``(x summed per group) @ zeros`` (a GEMM K/g times smaller)."""
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m, k = x2.shape
    out = torch.empty((m, scales.shape[1]), dtype=x2.dtype, device=x2.device)
    torch.ops._C.cpu_gemm_wna16(x2, w, out, scales, None, None, 8, isa_hint)
    sums = x2.to(torch.float32).reshape(m, k // group_size, group_size).sum(-1)
    out = out + (sums @ zeros).to(out.dtype)
    return out.reshape(*x.shape[:-1], out.shape[-1])
