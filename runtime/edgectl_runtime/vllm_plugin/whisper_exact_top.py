"""Whisper whose best logits are exact: the vocabulary's logits in the model's dtype, the best few
of each row computed again in float32.

vLLM 0.32 computes the logits in the model's dtype (``LogitsProcessor._apply_head``,
vllm/model_executor/layers/logits_processor.py). In bf16 a logit near 20 is rounded to a step of
0.125 (an 8-bit significand), so greedy decoding picks between near-ties by the rounding: whisper-base
served in bf16 heard 18.6% of the speech bench's words wrong where float32 and float16 heard 16.7%
(docs/speech.md "Which dtype"). vLLM's own remedy, ``--hf-overrides '{"head_dtype": "float32"}'``,
casts the whole tied table (51865 × 512 for whisper-base) to float32 at every decoding step on a CPU
(the same function: ``torch.mm(..., out_dtype=)`` is taken on CUDA and ROCm only).

This class keeps the product in the model's dtype for the whole vocabulary and recomputes the
``TOP`` largest logits of each row as float32 dot products of the same hidden state and table rows.
Those are the values the float32 head gives for those tokens (both multiply the same bf16 numbers and
accumulate in float32; only the rounding of the result differs), so greedy decoding picks the float32
head's token whenever that token is among the ``TOP`` best in the model's dtype — a rounding error of
a fraction of a logit cannot push it further down. The remaining logits stay as computed (sampling
with a temperature sees them rounded as before). Float32 logits are returned as they are.

:func:`exact_top_logits` is the arithmetic (tested against the float32 head, tests/test_whisper_exact_top.py);
the class is vLLM's Whisper with it, registered lazily by the plugin
(``edgectl.contract.whisper_names.ARCHITECTURE``); the English-only class derives from it.
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

# How many of each row's best logits are recomputed in float32: the bf16 step at the logits' size
# (|logit| < 64: at most 0.25, half of that after rounding) is far smaller than the spread of eight
# candidates, and the gather costs TOP rows of the table per token.
TOP = 8


def exact_top_logits(logits: torch.Tensor, hidden: torch.Tensor, table: torch.Tensor, top: int = TOP,
                     scale: float = 1.0) -> torch.Tensor:
    """``logits`` [tokens, vocab] (the model's dtype) as float32, with each row's ``top`` largest
    replaced by ``scale * (hidden_row . table[token])`` computed in float32."""
    out = logits.float()
    if logits.dtype == torch.float32:
        return out
    best = out.topk(min(top, out.shape[-1]), dim=-1).indices  # [tokens, top]
    rows = table[best].float()  # [tokens, top, hidden]
    exact = torch.einsum("tkd,td->tk", rows, hidden.float())
    if scale != 1.0:
        exact = exact * scale
    return out.scatter_(-1, best, exact)


class WhisperExactTopForConditionalGeneration(WhisperForConditionalGeneration):
    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.logits_processor(self.proj_out, hidden_states)
        table = self.proj_out.weight
        dense = table.is_floating_point() and table.dim() == 2 and table.shape[-1] == hidden_states.shape[-1]
        if logits is None or self.logits_processor.soft_cap is not None or not dense:
            return logits  # a packed (quantized) head has no rows to take: as vLLM computed them
        return exact_top_logits(logits, hidden_states, table, scale=self.logits_processor.scale)
