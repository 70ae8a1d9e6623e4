"""The ``cpu_int4`` method registered with vLLM: the settings (``config.py``) plus which method
each layer gets (``method.py``). This module depends on both; neither depends on it."""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)

from edgectl_runtime.kernels.cpu_int4.config import CpuInt4Settings, tied_embeddings
from edgectl_runtime.kernels.cpu_int4.method import CpuInt4LinearMethod
from edgectl_runtime.kernels.cpu_int4.names import NAME


def _tensor_parallel_size() -> int:
    from vllm.distributed import get_tensor_model_parallel_world_size

    try:
        return get_tensor_model_parallel_world_size()
    except AssertionError:  # no process group (unit tests): one rank
        return 1


@register_quantization_config(NAME)
class CpuInt4Config(CpuInt4Settings):
    """The ``cpu_int4`` quantization config vLLM builds (see ``config.py`` for its settings)."""

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if _tensor_parallel_size() > 1:
            raise ValueError("cpu_int4 supports tensor_parallel_size 1 only (its loaders do not shard)")
        if isinstance(layer, LinearBase):
            if self.not_convert and any(name in prefix for name in self.not_convert):
                return UnquantizedLinearMethod()  # stored unquantized in the checkpoint
            return CpuInt4LinearMethod(self, role="linear", prefix=prefix)
        quantized_head = self.lm_head != "dense"
        if isinstance(layer, ParallelLMHead):
            return CpuInt4LinearMethod(self, role="lm_head", prefix=prefix) if quantized_head else None
        if isinstance(layer, VocabParallelEmbedding):
            if quantized_head and tied_embeddings():
                return CpuInt4LinearMethod(self, role="embedding", prefix=prefix)
            return None
        return None
