"""A GGUF's tensors in the terms vLLM's model classes use: the names, and llama.cpp's conversion
quirks to undo. Shared by the control plane (``edgectl/models/gguf_inspect.py``, which lists the
linear layers, and ``edgectl/models/gguf_hf.py``, which writes the config) and the runtime's loader
(``runtime/edgectl_runtime/vllm_plugin/gguf_loader.py``).

The quirks are llama.cpp's ``convert_hf_to_gguf.py``: ``LlamaModel.modify_tensors`` permutes the
rows of ``q_proj`` / ``k_proj`` per head (its ``permute``: ``reshape(n_head, 2, dim // n_head // 2,
...)`` then ``swapaxes(1, 2)``), for ggml's interleaved RoPE; Qwen2/3 and Gemma-3 are written as
they are. ``Gemma3Model.modify_tensors`` stores every ``*norm.weight`` plus one (llama.cpp's
RMSNorm multiplies by the weight, Gemma's by one plus it).
"""

from __future__ import annotations

import re
from typing import Any

# A directory that serves a GGUF as it is (``edgectl models pull``): config.json and the tokenizer
# made from the GGUF, and the GGUF itself under this name.
DIRECT_GGUF = "model.gguf"

# llama.cpp's per-block tensor names -> the Hugging Face / vLLM module names (before vLLM merges
# q/k/v and gate/up), per architecture family. The linear layers are the same in every family.
LINEAR_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_COMMON = {**LINEAR_NAMES, "attn_norm": "input_layernorm"}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
BLOCK_NAMES: dict[str, dict[str, str]] = {
    "llama": {**_COMMON, "ffn_norm": "post_attention_layernorm"},
    "qwen2": {**_COMMON, "ffn_norm": "post_attention_layernorm"},
    "qwen3": {**_COMMON, **_QK_NORM, "ffn_norm": "post_attention_layernorm"},
    # Gemma-3 has four norms per block (llama.cpp: LLM_TENSOR_ATTN_POST_NORM, FFN_NORM, FFN_POST_NORM)
    "gemma3": {**_COMMON, **_QK_NORM, "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"},
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Architectures whose q/k rows llama.cpp permuted (undone by :func:`unpermute_heads`).
PERMUTED = frozenset({"llama"})
# Architectures whose norm weights llama.cpp stored plus this offset.
NORM_OFFSET = {"gemma3": 1.0}

_TENSOR = re.compile(r"^(?:blk\.(\d+)\.)?([a-z0-9_]+)\.(weight|bias)$")


def hf_name(arch: str, gguf_name: str) -> str | None:
    """vLLM's (unmerged) parameter name of GGUF tensor ``gguf_name``, or None if unknown."""
    m = _TENSOR.match(gguf_name)
    if not m or arch not in BLOCK_NAMES:
        return None
    block, base, kind = m.groups()
    if block is None:
        top = TOP_NAMES.get(base)
        return f"{top}.{kind}" if top else None
    mod = BLOCK_NAMES[arch].get(base)
    return f"model.layers.{block}.{mod}.{kind}" if mod else None


def gguf_name(arch: str, hf: str) -> str | None:
    """The inverse of :func:`hf_name` (``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``)."""
    kind = hf.rsplit(".", 1)[-1]
    base = hf[: -len(kind) - 1]
    for g, h in TOP_NAMES.items():
        if base == h:
            return f"{g}.{kind}"
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", base)
    if not m or arch not in BLOCK_NAMES:
        return None
    for g, h in BLOCK_NAMES[arch].items():
        if h == m.group(2):
            return f"blk.{m.group(1)}.{g}.{kind}"
    return None


def heads_of(arch: str, gguf_tensor: str, config: dict[str, Any]) -> int | None:
    """The head count whose permutation to undo on this tensor's rows, or None (not permuted)."""
    if arch not in PERMUTED:
        return None
    if ".attn_q." in gguf_tensor:
        return int(config["num_attention_heads"])
    if ".attn_k." in gguf_tensor:
        return int(config["num_key_value_heads"])
    return None


def unpermute_order(rows: int, heads: int) -> list[int]:
    """Row ``i`` of the Hugging Face tensor is row ``order[i]`` of llama.cpp's permuted one.

    llama.cpp wrote ``W.reshape(h, 2, r, ...).swapaxes(1, 2)`` (``r = rows / h / 2``): its row
    ``(head, j, half)`` is the original row ``(head, half, j)``."""
    if rows % (2 * heads):
        raise ValueError(f"{rows} rows do not split into {heads} heads of pairs")
    r = rows // heads // 2
    return [head * 2 * r + j * 2 + half for head in range(heads) for half in range(2) for j in range(r)]
