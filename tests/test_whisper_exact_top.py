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


def _scan_or_skip():
    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    if not ok:
        pytest.skip(f"edgectl's kernel library: {why}")
    level = ops.load()
    import isa_helpers

    if isa_helpers.TIER == "avx2":  # the tier runs the scan on the kernels' AVX2 level, and says so
        assert level == "avx2"
    from edgectl_runtime.vllm_plugin import whisper_exact_top

    return whisper_exact_top


@pytest.mark.isa_avx2  # the scan is edgectl's kernel: again at its AVX2 level
def test_the_int8_scan_then_the_exact_best_pick_the_float32_heads_token() -> None:
    w = _scan_or_skip()
    hidden, table = _case()
    head32 = torch.nn.functional.linear(hidden.float(), table.float())
    scanned = w.scan_logits(hidden, w.pack_scan(table), table.shape[0], table.shape[0])
    # the scan alone is int8 arithmetic: close to the float32 head, not equal to it
    assert scanned.shape == head32.shape
    assert (scanned.float() - head32).abs().max() < 0.05 * head32.abs().max()
    out = w.exact_top_logits(scanned, hidden, table, top=w.SCAN_TOP)
    assert torch.equal(out.argmax(-1), head32.argmax(-1))
    # with bf16's TOP alone the scan's error loses a row of these near-ties: the margin is needed
    assert not torch.equal(w.exact_top_logits(scanned, hidden, table, top=w.TOP).argmax(-1), head32.argmax(-1))
    best = scanned.float().topk(w.SCAN_TOP, dim=-1).indices
    torch.testing.assert_close(out.gather(-1, best), head32.gather(-1, best), rtol=1e-5, atol=1e-4)


def test_the_scan_finds_the_best_row_of_whisper_bases_own_table() -> None:
    """On the real table: queries near its rows (as a decoder's last hidden state is near the row of
    the token it predicts), the float32 head's best row is among the scan's best SCAN_TOP every time."""
    w = _scan_or_skip()
    from pathlib import Path

    path = Path("/var/lib/edgectl/models/whisper-base/model.safetensors")
    if not path.is_file():
        pytest.skip("whisper-base is not pulled (edgectl models pull whisper-base)")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        name = next(k for k in f.keys() if k.endswith("decoder.embed_tokens.weight"))
        table = f.get_tensor(name).to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, table.shape[0], (200,), generator=g)
    hidden = (table[rows].float() * 3 + torch.randn(200, table.shape[1], generator=g) * 0.5).to(torch.bfloat16)
    head32 = torch.nn.functional.linear(hidden.float(), table.float())
    scanned = w.scan_logits(hidden, w.pack_scan(table), table.shape[0], table.shape[0])
    out = w.exact_top_logits(scanned, hidden, table, top=w.SCAN_TOP)
    assert torch.equal(out.argmax(-1), head32.argmax(-1))


@pytest.mark.isa_avx2  # the scan is edgectl's kernel: again at its AVX2 level
def test_a_float32_models_scan_is_recomputed_too() -> None:
    """On a CPU without bf16 arithmetic the plan serves float32: the scan's logits are then float32 too,
    and still int8 arithmetic; the best are recomputed all the same."""
    w = _scan_or_skip()
    hidden, table = _case()
    hidden, table = hidden.float(), table.float()
    head32 = torch.nn.functional.linear(hidden, table)
    scanned = w.scan_logits(hidden, w.pack_scan(table), table.shape[0], table.shape[0])
    assert scanned.dtype == torch.float32 and not torch.equal(scanned, head32)
    out = w.exact_top_logits(scanned, hidden, table, top=w.SCAN_TOP, approximate=True)
    assert torch.equal(out.argmax(-1), head32.argmax(-1))
    best = scanned.topk(w.SCAN_TOP, dim=-1).indices
    torch.testing.assert_close(out.gather(-1, best), head32.gather(-1, best), rtol=1e-5, atol=1e-4)
