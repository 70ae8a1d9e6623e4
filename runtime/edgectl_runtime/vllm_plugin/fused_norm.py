"""RMSNorm (+ residual add) in one pass: edgectl's op as a vLLM IR implementation.

vLLM 0.32 routes ``RMSNorm.forward`` through its IR ops ``vllm.ir.ops.rms_norm`` and
``vllm.ir.ops.fused_add_rms_norm`` (``vllm/model_executor/layers/layernorm.py:80-94``); each IR op
dispatches to the first supported implementation in its priority list
(``vllm/ir/op.py:321`` ``IrOp.dispatch``), in eager mode and when the compiler lowers the graph.
A plugin adds an implementation with ``IrOp.register_impl(provider)`` (``vllm/ir/op.py:240``);
the priority list is vLLM configuration, ``KernelConfig.ir_op_priority``
(``vllm/config/kernel.py:21``; ``--ir-op-priority``, or ``kernel_config`` in Python), to which the
CPU platform appends its own default, ``native`` (``vllm/platforms/interface.py:1431``), and
which the worker installs at start (``vllm/v1/worker/worker_base.py:98``).

So :func:`register` (called by edgectl's plugin in every vLLM process) only makes the provider
``edgectl`` known; a server uses it when its arguments carry :func:`priority` — unmodified vLLM
(a benchmark's stock arm) keeps its native path. The native path on CPU is several bf16 ops per
norm (an fp32 copy, a pow, a mean, a rsqrt, two multiplies, casts); edgectl's op reads and
writes each row once (``ops/csrc``: ``add_rms_norm``).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

logger = logging.getLogger("edgectl.fused_norm")

PROVIDER = "edgectl"  # the name edgectl/contract/vllm_args.py EDGECTL_NORMS gives vLLM
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_registered: list[str] = []


def priority() -> dict[str, list[str]]:
    """vLLM's ``ir_op_priority`` that selects edgectl's norms (vLLM appends ``native`` after them:
    a call the op does not support, e.g. a weight in another dtype, falls back to it)."""
    from edgectl.contract.vllm_args import EDGECTL_NORMS

    return {op: list(providers) for op, providers in EDGECTL_NORMS.items()}


def _supported(x: Tensor, weight: Tensor | None) -> bool:
    return weight is not None and x.dtype in _DTYPES and weight.dtype == x.dtype and weight.dim() == 1 \
        and x.device.type == "cpu"


def _rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return torch.ops.edgectl.rms_norm(x, weight, epsilon)


def _rms_norm_args(x, weight, epsilon, variance_size=None) -> bool:
    return variance_size is None and _supported(x, weight)


def _fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                        variance_size: int | None = None) -> tuple[Tensor, Tensor]:
    return torch.ops.edgectl.add_rms_norm(x, x_residual, weight, epsilon)


def _fused_add_rms_norm_args(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return variance_size is None and _supported(x, weight) and x_residual.dtype == x.dtype


def register() -> list[str]:
    """Register provider ``edgectl`` for vLLM's two norm IR ops (once per process). Returns the
    ops registered; none if edgectl's kernel library is not available here (then a priority
    naming ``edgectl`` fails at vLLM's config check, which says so)."""
    if _registered:
        return list(_registered)
    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    if not ok:
        logger.warning("edgectl's fused RMSNorm is not available: %s", why)
        return []
    ops.load()
    from vllm import ir

    ir.ops.rms_norm.register_impl(PROVIDER, supports_args=_rms_norm_args)(_rms_norm)
    ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=_fused_add_rms_norm_args)(_fused_add_rms_norm)
    _registered.extend(["rms_norm", "fused_add_rms_norm"])
    return list(_registered)
