"""The ``cpu_int4`` method registered with vLLM: the settings (``config.py``) plus which method
each layer gets (``method.py``). This module depends on both; neither depends on it."""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)

from edgectl_runtime.kernels.cpu_int4.config import (
    CpuInt4Settings,
    current_model_config,
    tied_embeddings,
)
from edgectl_runtime.kernels.cpu_int4.method import CpuInt4LinearMethod
from edgectl_runtime.kernels.cpu_int4.names import NAME


def _tensor_parallel_size() -> int:
    from vllm.distributed import get_tensor_model_parallel_world_size

    try:
        return get_tensor_model_parallel_world_size()
    except AssertionError:  # no process group (unit tests): one rank
        return 1


def tower_prefixes() -> tuple[str, ...]:
    """The module prefixes of a multimodal model's encoders and connectors, which stay in the model
    dtype: only the language model is quantized (the tower runs once per image and is checked against a
    dense reference; every decode step reads the language model's weights). vLLM's own map of the model's parts says where
    they are (``SupportsMultiModal.get_mm_mapping``, e.g. Idefics3's ``model.vision_model`` and
    ``model.connector``); a multimodal model without one is refused rather than quantized whole."""
    mc = current_model_config()
    if mc is None or not mc.is_multimodal_model:
        return ()
    # imported when first asked, as _tensor_parallel_size does: loading this module must not import vLLM's loader
    from vllm.model_executor.model_loader.utils import get_model_cls

    cls = get_model_cls(mc)
    mapping = getattr(cls, "get_mm_mapping", None)
    # the map is constant per class (a method only by vLLM's interface), so it is read without an instance
    keys = mapping(None) if mapping is not None else None
    parts = [*(keys.connector if keys else ()), *(keys.tower_model if keys else ())]
    if not parts:
        raise ValueError(f"cpu_int4: {cls.__name__} does not say where its encoder is (get_mm_mapping): "
                         "edgectl quantizes only a multimodal model's language model")
    return tuple(parts)


@register_quantization_config(NAME)
class CpuInt4Config(CpuInt4Settings):
    """The ``cpu_int4`` quantization config vLLM builds (see ``config.py`` for its settings)."""

    _towers: tuple[str, ...] | None = None

    def dense_parts(self) -> tuple[str, ...]:
        """What stays dense with ``EDGECTL_INT4_PARTS=language-model``: a multimodal model's encoder and
        connector prefixes (asked once; none for a text model)."""
        if self._towers is None:
            self._towers = tower_prefixes() if self.parts == "language-model" else ()
        return self._towers

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.parts == "language-model":  # read back: the plan's check expects these layers dense
            out["dense_parts"] = list(self.dense_parts())
        return out

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> QuantizeMethodBase | None:
        if _tensor_parallel_size() > 1:
            raise ValueError("cpu_int4 supports tensor_parallel_size 1 only (its loaders do not shard)")
        if any(prefix == part or prefix.startswith(part + ".") for part in self.dense_parts()):
            return UnquantizedLinearMethod() if isinstance(layer, LinearBase) else None
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
