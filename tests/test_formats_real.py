"""The real model: SmolLM2-135M's Q4_1 GGUF dequantized to bf16 by transformers (the bf16 copy
the bench's stock arm loads; the embedding is Q8_0 there). edgectl's W4 / W8 quantizers (formats/blocks.py) must give back the
GGUF's own 4-bit / 8-bit values for every tensor and, in the kernel's arithmetic, every bf16
weight of the checkpoint: the w4a8 format with an int8 head adds no weight error to this model."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from edgectl_runtime.formats import blocks  # noqa: E402

pytestmark = pytest.mark.slow

_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    parts = gguf_name.split(".")
    if parts[0] == "blk" and parts[2] in _NAMES:
        return f"model.layers.{parts[1]}.{_NAMES[parts[2]]}.weight"
    return None


def _llama_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf.py reorders q/k rows for its RoPE; transformers undoes it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_blocks(tensor, width: int) -> np.ndarray:
    return np.asarray(tensor.data).reshape(-1).view(np.uint8).reshape(-1, width)


def test_every_weight_of_smollm2_is_exact(pulled_smollm2, smollm2_bf16):
    from safetensors import safe_open

    manifest = json.loads((pulled_smollm2 / "edgectl-model.json").read_text())
    config = json.loads((smollm2_bf16 / "config.json").read_text())
    reader = gguf.GGUFReader(manifest["gguf"]["path"])
    checked = {"Q4_1": 0, "Q8_0": 0}
    with safe_open(str(smollm2_bf16 / "model.safetensors"), "pt") as ckpt:
        for t in reader.tensors:
            name = _hf_name(t.name)
            if name is None:
                continue
            w = ckpt.get_tensor(name)
            n, k = w.shape
            kind = t.tensor_type.name
            if kind == "Q4_1":
                raw = _gguf_blocks(t, 20)  # fp16 d, fp16 m, 16 bytes: q[j] low nibble, q[j + 16] high
                want = torch.from_numpy(np.concatenate([raw[:, 4:] & 15, raw[:, 4:] >> 4], axis=1).reshape(n, k))
                q, d, m = blocks.quantize_w4(w)
                back = blocks.dequantize_w4(q, d, m, k)
            else:
                assert kind == "Q8_0", t.name
                raw = _gguf_blocks(t, 34)  # fp16 d, 32 int8
                want = torch.from_numpy(raw[:, 2:].copy().view(np.int8).reshape(n, k))
                q, d = blocks.quantize_w8(w)
                back = blocks.dequantize_w8(q, d, k)
            if t.name.split(".")[-2] in ("attn_q", "attn_k"):
                heads = config["num_attention_heads"] if "attn_q" in t.name else config["num_key_value_heads"]
                q = _llama_permute(q, heads)
            assert torch.equal(q[:, :k], want), f"{name}: 4/8-bit values differ from the GGUF's"
            assert torch.equal(back.to(w.dtype), w), f"{name}: a weight is not reproduced"
            checked[kind] += 1
    assert checked == {"Q4_1": 7 * config["num_hidden_layers"], "Q8_0": 1}, checked
