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

Where the plan says so (``EDGECTL_SPEECH_HEAD=w8-scan``), the whole vocabulary is scanned on an int8
copy of the tied table instead (edgectl's ``linear_w8a8``: blocks of 32 with an fp16 scale, the
activations quantized the same way), half the bytes of the bf16 table read at every decoding step,
and the ``SCAN_TOP`` best of the scan are recomputed exactly as above from the bf16 rows. Greedy
decoding then picks the float32 head's token whenever it is among the scan's ``SCAN_TOP`` best
(tests/test_whisper_exact_top.py checks it on near-ties and on whisper-base's own table; docs/speech.md
"The head"). The other
logits are the scan's (sampling with a temperature sees them with the int8 error). The copy costs the
table's size in int8 (28 MB for whisper-base's 51865 × 512).
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

import os
from collections.abc import Iterable

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.whisper import WhisperForConditionalGeneration

from edgectl.contract import environment

# How many of each row's best logits are recomputed in float32: the bf16 step at the logits' size
# (|logit| < 64: at most 0.25, half of that after rounding) is far smaller than the spread of eight
# candidates, and the gather costs TOP rows of the table per token.
TOP = 8
# After the int8 scan, more of the best are recomputed: the scan's error (int8 weights and activations,
# a few hundredths of a logit on whisper-base) is larger than bf16's rounding. On adversarial near-ties
# (tests/test_whisper_exact_top.py: 4000 rows alike) the float32 head's best was 9th to 16th of the scan
# in 1 of 256 rows; 32 keeps a margin, at 32 table rows gathered per token.
SCAN_TOP = 32


def exact_top_logits(logits: torch.Tensor, hidden: torch.Tensor, table: torch.Tensor, top: int = TOP,
                     scale: float = 1.0, approximate: bool | None = None) -> torch.Tensor:
    """``logits`` [tokens, vocab] as float32, with each row's ``top`` largest replaced by
    ``scale * (hidden_row . table[token])`` computed in float32. ``approximate``: whether the logits
    need it (default: unless they are float32 already; the int8 scan's always do)."""
    if not (logits.dtype != torch.float32 if approximate is None else approximate):
        return logits.float()
    out = logits.to(torch.float32, copy=True)  # the caller's tensor stays as it was
    best = out.topk(min(top, out.shape[-1]), dim=-1).indices  # [tokens, top]
    rows = table[best].float()  # [tokens, top, hidden]
    exact = torch.einsum("tkd,td->tk", rows, hidden.float())
    if scale != 1.0:
        exact = exact * scale
    return out.scatter_(-1, best, exact)


def pack_scan(table: torch.Tensor) -> torch.Tensor:
    """The int8 copy of ``table [vocab, hidden]`` the scan multiplies (edgectl's W8 layout)."""
    from edgectl_runtime.formats import blocks
    from edgectl_runtime.kernels import ops

    ops.load()
    return blocks.quantize_and_pack(table.detach().float(), 8)


def scan_logits(hidden: torch.Tensor, packed: torch.Tensor, rows: int, vocab: int) -> torch.Tensor:
    """Every logit from the int8 copy of a ``rows``-row table: ``hidden [tokens, width]`` times it, the first ``vocab``."""
    return torch.ops.edgectl.linear_w8a8(hidden, packed, rows, hidden.shape[-1])[..., :vocab]


class WhisperExactTopForConditionalGeneration(WhisperForConditionalGeneration):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # dense | w8-scan, as the plan set it; read back by the worker (service/readback.py)
        self.speech_head = environment.read("EDGECTL_SPEECH_HEAD", os.environ)
        self._scan: torch.Tensor | None = None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = super().load_weights(weights)
        table = self.proj_out.weight
        if self.speech_head == "w8-scan" and table.is_floating_point() and table.dim() == 2:
            self._scan = pack_scan(table)
        else:
            self.speech_head = "dense"  # what compute_logits will do: read back as such
        return loaded

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        table = self.proj_out.weight
        dense = table.is_floating_point() and table.dim() == 2 and table.shape[-1] == hidden_states.shape[-1]
        if self._scan is not None and dense and self.logits_processor.soft_cap is None:
            logits = scan_logits(hidden_states, self._scan, table.shape[0], self.logits_processor.org_vocab_size)
            if self.logits_processor.scale != 1.0:
                logits = logits * self.logits_processor.scale
            return exact_top_logits(logits, hidden_states, table, top=SCAN_TOP, scale=self.logits_processor.scale,
                                    approximate=True)
        logits = self.logits_processor(self.proj_out, hidden_states)
        if logits is None or self.logits_processor.soft_cap is not None or not dense:
            return logits  # a packed (quantized) head has no rows to take: as vLLM computed them
        return exact_top_logits(logits, hidden_states, table, scale=self.logits_processor.scale)
