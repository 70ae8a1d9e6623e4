"""RoPE cos/sin table capped to ``max_model_len`` (lever ``EDGECTL_ROPE_CAP``).

vLLM builds each rotary module's ``cos_sin_cache`` with ``max_position_embeddings`` rows (for
YaRN and linear scaling, times the factor), in fp32 first, whatever ``max_model_len`` is
(``vllm/model_executor/layers/rotary_embedding/base.py:94-103``, ``yarn_scaling_rope.py:76-85``):
32 MiB in bf16 plus a ~160 MiB fp32 transient for a 131072-row table with head_dim 128
(docs/facts.md, "The RoPE table"). Positions never reach ``max_model_len``, and the CPU forward indexes the
table by position, so rows past it are never read.

The cap replaces ``_compute_cos_sin_cache`` on the classes whose table is a plain function of
the position (plain, Llama3, single-factor linear scaling, YaRN) so that only
``min(max_model_len, full)`` rows are computed, directly: no fp32 transient of the full table.
The rows are the same numbers vLLM computes for those positions (tests/test_rope.py compares
them bit for bit). Every other class is left alone: Phi-3 LongRoPE indexes a second table with
an offset, multi-factor linear scaling concatenates tables at offsets, mRoPE positions can exceed
the token count, dynamic NTK depends on the full length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from edgectl.contract import environment as runtime_env

INFO_ATTR = "edgectl_rope"  # set on every module whose table this module built
# class -> its own _compute_cos_sin_cache before the cap (None: it inherited one)
_ORIGINALS: dict[type, object] = {}


def _classes():
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.model_executor.layers.rotary_embedding.linear_scaling_rope import (
        LinearScalingRotaryEmbedding,
    )
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import (
        Llama3RotaryEmbedding,
    )
    from vllm.model_executor.layers.rotary_embedding.yarn_scaling_rope import (
        YaRNScalingRotaryEmbedding,
    )

    return RotaryEmbedding, Llama3RotaryEmbedding, LinearScalingRotaryEmbedding, YaRNScalingRotaryEmbedding


def full_rows(module) -> int:
    """Rows vLLM's own table has for ``module`` (one of the capped classes)."""
    RotaryEmbedding, Llama3, Linear, YaRN = _classes()
    if type(module) is YaRN:
        return math.ceil(module.max_position_embeddings * module.scaling_factor)
    if type(module) is Linear:
        return sum(math.ceil(module.max_position_embeddings * f) for f in module.scaling_factors)
    return int(module.max_position_embeddings)


def _max_model_len() -> int | None:
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    if cfg is None or cfg.model_config is None:
        return None
    return int(cfg.model_config.max_model_len)


def _table(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    freqs = torch.einsum("i,j -> ij", positions, inv_freq)
    cos = freqs.cos()
    sin = freqs.sin()
    if scale != 1.0:
        cos = cos * scale
        sin = sin * scale
    return torch.cat((cos, sin), dim=-1)


def capped_table(module, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of ``module``'s fp32 cos/sin table, computed without the rest."""
    RotaryEmbedding, Llama3, Linear, YaRN = _classes()
    t = torch.arange(rows, dtype=torch.float32)
    if type(module) is YaRN:
        return _table(t, module._compute_inv_freq(module.scaling_factor), module.mscale)
    if type(module) is Linear:
        (factor,) = module.scaling_factors
        module._scaling_factor_to_offset = {float(factor): 0}
        return _table(t / factor, module._compute_inv_freq(module.base))
    return _table(t, module._compute_inv_freq(module.base))


def _eligible(module) -> bool:
    RotaryEmbedding, Llama3, Linear, YaRN = _classes()
    kind = type(module)
    if kind in (RotaryEmbedding, Llama3, YaRN):
        return True
    return kind is Linear and len(module.scaling_factors) == 1


def _make_compute(cls, original):
    def _compute_cos_sin_cache(self):
        if _eligible(self):
            mml = _max_model_len()
            full = full_rows(self)
            if mml is not None and mml < full:
                self.edgectl_rope = {"rows": mml, "full_rows": full, "capped": True}
                return capped_table(self, mml)
            self.edgectl_rope = {"rows": full, "full_rows": full, "capped": False}
        if original is not None:
            return original(self)
        return super(cls, self)._compute_cos_sin_cache()

    _compute_cos_sin_cache.__doc__ = f"edgectl RoPE cap over {cls.__name__}'s table"
    return _compute_cos_sin_cache


def install(environ: Mapping[str, str]) -> bool:
    """Patch the capped classes if ``EDGECTL_ROPE_CAP=1``; returns whether the cap is active.

    Idempotent, and a no-op when the lever is off (vLLM's own tables, byte for byte).
    """
    if not runtime_env.read_bool("EDGECTL_ROPE_CAP", environ):
        return False
    RotaryEmbedding, Llama3, Linear, YaRN = _classes()
    for cls in (RotaryEmbedding, Linear, YaRN):  # Llama3 inherits RotaryEmbedding's method
        if cls in _ORIGINALS:
            continue
        original = cls.__dict__.get("_compute_cos_sin_cache")
        _ORIGINALS[cls] = original
        cls._compute_cos_sin_cache = _make_compute(cls, original)
    return True


def uninstall() -> None:
    """Undo :func:`install` (tables built afterwards are vLLM's again)."""
    for cls, original in list(_ORIGINALS.items()):
        if original is None:
            del cls._compute_cos_sin_cache
        else:
            cls._compute_cos_sin_cache = original
        del _ORIGINALS[cls]


def vllm_table(module) -> torch.Tensor:
    """vLLM's own fp32 table for ``module``, whether or not the cap is installed (for checks)."""
    for cls in type(module).__mro__:
        if cls in _ORIGINALS:
            original = _ORIGINALS[cls]
            return original(module) if original is not None else super(cls, module)._compute_cos_sin_cache()
        own = cls.__dict__.get("_compute_cos_sin_cache")
        if own is not None:
            return own(module)
    raise TypeError(f"{type(module).__name__} has no cos/sin table")
