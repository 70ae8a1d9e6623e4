"""The exact best logits of edgectl's Whisper (runtime/edgectl_runtime/vllm_plugin/whisper_exact_top.py)
against vLLM's float32 head: the same bf16 hidden states and table, multiplied in float32."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.runtime

torch = pytest.importorskip("torch")


def _case(tokens: int = 64, vocab: int = 4000, d: int = 512, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, d, generator=g).to(torch.bfloat16)
    # rows alike, as a trained table's near-synonyms are: many near-ties at the top
    table = (torch.randn(vocab, d, generator=g) * 0.05 + torch.randn(1, d, generator=g)).to(torch.bfloat16)
    return hidden, table


def test_the_best_logits_are_the_float32_heads_and_the_rest_as_computed() -> None:
    from edgectl_runtime.vllm_plugin.whisper_exact_top import TOP, exact_top_logits

    hidden, table = _case()
    low = torch.nn.functional.linear(hidden, table)  # what vLLM computes in bf16
    head32 = torch.nn.functional.linear(hidden.float(), table.float())  # vLLM's float32 head
    out = exact_top_logits(low, hidden, table)
    assert out.dtype == torch.float32
    best = low.float().topk(TOP, dim=-1).indices
    torch.testing.assert_close(out.gather(-1, best), head32.gather(-1, best), rtol=1e-5, atol=1e-4)
    rest = torch.ones_like(out, dtype=torch.bool).scatter_(-1, best, False)
    assert torch.equal(out[rest], low.float()[rest])
    # greedy decoding picks the float32 head's token; in bf16 alone it does not, for some rows here
    assert torch.equal(out.argmax(-1), head32.argmax(-1))
    assert not torch.equal(low.float().argmax(-1), head32.argmax(-1))


def test_float32_logits_and_the_scale() -> None:
    from edgectl_runtime.vllm_plugin.whisper_exact_top import exact_top_logits

    hidden, table = _case(tokens=4, vocab=300)
    logits32 = torch.nn.functional.linear(hidden.float(), table.float())
    assert torch.equal(exact_top_logits(logits32, hidden, table), logits32)  # nothing to redo
    low = torch.nn.functional.linear(hidden, table) * 2
    scaled = exact_top_logits(low, hidden, table, top=3, scale=2.0)
    best = low.float().topk(3, dim=-1).indices
    torch.testing.assert_close(scaled.gather(-1, best), (2 * logits32).gather(-1, best), rtol=1e-5, atol=1e-4)
