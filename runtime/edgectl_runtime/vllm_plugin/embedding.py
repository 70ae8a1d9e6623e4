"""Which dense embedding tables get a prepacked GEMM copy (lever ``EDGECTL_EMBEDDING_PACK``).

On CPU, vLLM 0.32's ``UnquantizedEmbeddingMethod.process_weights_after_loading``
(``vllm/model_executor/layers/vocab_parallel_embedding.py:67-71``) calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=False)`` for *every* dense embedding:
a oneDNN (or sgl-kernel) prepacked copy of the whole table is made so the layer can serve as
an LM head, and the original is kept for the lookups. For a model whose LM head is tied to its
input embedding (SmolLM2, Llama-3.2, Qwen2.5-0.5B, Gemma) the table is packed twice — once for
the input embedding, which only ever does lookups, and once for the LM head — so the process
holds three copies of the largest matrix of a small model (SmolLM2-135M: 3 × 54 MiB).

- ``vllm``: unmodified vLLM (both copies);
- ``lm-head``: only the layer that computes logits (``ParallelLMHead``) keeps its packed copy;
  an input embedding gets none (its GEMM path is never used; ``F.linear`` is left in place
  should anything call it);

- ``none``: no layer keeps one; only for a model whose logits never go through vLLM's GEMM (a
  Whisper whose head is edgectl's int8 scan, ``whisper_exact_top.py``: the packed copy would be
  53 MB that nothing reads).

Not offered to a model whose head does run vLLM's GEMM: the LM head on ``F.linear``. Measured on x86_64-amx
(docs/memory.md): a bf16 ``F.linear`` GEMV of SmolLM2's head took 15.5 ms against 8.7 ms for the
packed one (50 calls, M = 1), a slower decode for 54 MiB; and the worker died at its first
forward pass with SIGILL in vLLM's AMX attention kernel, since no oneDNN GEMM was left to request
the AMX tile permission (the plugin now requests it itself: ``plugin.request_amx``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from edgectl.contract import environment as runtime_env

INFO_ATTR = "edgectl_embedding_pack"  # one of STATES on every dense embedding layer
# "packed": vLLM holds a prepacked copy; "not packed": edgectl withheld it (the lever);
# "no packed kernel": vLLM tried and found no packed GEMM for this CPU (see _holds_packed_copy)
STATES = ("packed", "not packed", "no packed kernel")
_ORIGINAL: list = []


def _holds_packed_copy(layer: torch.nn.Module) -> bool:
    """Whether vLLM's dispatch bound a prepacked GEMM to the layer.

    ``dispatch_cpu_unquantized_gemm`` (``vllm/model_executor/layers/utils.py:470-608``) binds
    ``layer.cpu_linear`` to a closure over the packed weight (sgl-kernel, AMX only) or the oneDNN
    handler; when neither exists — no AMX, and oneDNN cannot build a bf16 matmul below AVX-512
    ("Failed to create oneDNN linear, fallback to torch linear", every AVX2 CPU) — it binds
    ``torch.nn.functional.linear`` over nothing (utils.py:603), and no copy is made.
    """
    return bool(getattr(getattr(layer, "cpu_linear", None), "__closure__", None))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def install(environ: Mapping[str, str]) -> str:
    """Wrap vLLM's method once per process; the mode read from ``environ``."""
    mode = runtime_env.read("EDGECTL_EMBEDDING_PACK", environ)
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
    )
    from vllm.platforms import current_platform

    if not _ORIGINAL:
        _ORIGINAL.append(UnquantizedEmbeddingMethod.process_weights_after_loading)
    original = _ORIGINAL[0]

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        keep = mode == "vllm" or (mode == "lm-head" and isinstance(layer, ParallelLMHead))
        if keep or not current_platform.is_cpu():
            original(self, layer)
            if not current_platform.is_cpu():
                state = "not packed"
            else:
                state = "packed" if _holds_packed_copy(layer) else "no packed kernel"
            setattr(layer, INFO_ATTR, state)
            return
        layer.cpu_linear = _linear  # what dispatch_cpu_unquantized_gemm falls back to
        setattr(layer, INFO_ATTR, "not packed")

    UnquantizedEmbeddingMethod.process_weights_after_loading = process_weights_after_loading
    return mode


def packed_copies(model: torch.nn.Module) -> list[dict]:
    """Read-back: every dense embedding layer with a prepacked copy, and its size (rows × cols ×
    element size: the packed copy holds the same values)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    out = []
    for name, module in model.named_modules():
        state = getattr(module, INFO_ATTR, None)
        weight = getattr(module, "weight", None)
        if state is None or not isinstance(weight, torch.Tensor):
            continue
        out.append({"name": name, "state": state, "lm_head": isinstance(module, ParallelLMHead),
                    "bytes": weight.numel() * weight.element_size() if state == "packed" else 0})
    return out
