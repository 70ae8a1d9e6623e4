"""llama.cpp's GGUF pair of a vision-language model in the terms of the Hugging Face directory it was
converted from: which projector pairs with which language model, and the tensors' names. Shared by the
control plane (``edgectl/models/llamacpp_pair.py``, which checks a pair before anything is written) and the
runtime's converter back to a directory (``runtime/edgectl_runtime/tools/convert_gguf_vlm.py``).

llama.cpp reads such a model as two files (llama-server ``--mmproj``): the language model's GGUF and the
vision projector's (``general.architecture`` "clip": the tower and the connector). Both are written by
its ``convert_hf_to_gguf.py``: the language model by the class of ``text_config``'s architecture
(``conversion/llama.py``, ``LlamaModel``, for SmolVLM's ``VLlama3ForCausalLM``; it drops the
``text_model.`` of the names and permutes q/k rows, undone by ``gguf_names.unpermute_order``), the
projector with ``--mmproj`` by ``conversion/smolvlm.py`` (``SmolVLMModel``: ``clip.projector_type``
"idefics3", the tensor names gguf-py's ``MODEL_TENSOR.V_*`` give, nothing permuted, the embeddings
stored as F32).
"""

from __future__ import annotations

import re

from edgectl.contract.gguf_names import hf_name

# The projector's architecture and type keys (gguf-py constants.py, Keys.Clip / Keys.ClipVision).
MMPROJ_ARCHITECTURE = "clip"
PROJECTOR_TYPE_KEY = "clip.projector_type"

# clip.projector_type -> the language model's general.architecture it is converted with, and the
# Hugging Face architecture the pair is turned back into (vLLM 0.32 serves Idefics3 / SmolVLM with one class).
PROJECTOR_TYPES: dict[str, tuple[str, str]] = {
    "idefics3": ("llama", "Idefics3ForConditionalGeneration"),
}

# Where the language model's tensors sit in Idefics3ForConditionalGeneration's checkpoint.
TEXT_PREFIX = "model.text_model."

# The projector's tensors (gguf-py constants.py TENSOR_NAMES, MODEL_TENSOR.V_*) -> transformers'
# Idefics3 names (modeling_idefics3.py: Idefics3VisionTransformer under model.vision_model, the
# connector's modality_projection under model.connector).
IDEFICS3_TOP = {
    "v.patch_embd": "model.vision_model.embeddings.patch_embedding",
    "v.position_embd": "model.vision_model.embeddings.position_embedding",
    "v.post_ln": "model.vision_model.post_layernorm",
    "mm.model.fc": "model.connector.modality_projection.proj",
}
IDEFICS3_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}
# The connector's projection: its rows are the language model's embedding width.
CONNECTOR = "mm.model.fc.weight"

_BLOCK = re.compile(r"^v\.blk\.(\d+)\.([a-z0-9_]+)\.(weight|bias)$")


def projector_hf_name(gguf_name: str) -> str | None:
    """transformers' Idefics3 name of the projector's tensor ``gguf_name``, or None if unknown."""
    m = _BLOCK.match(gguf_name)
    if m:
        block, base, kind = m.groups()
        mod = IDEFICS3_BLOCK.get(base)
        return f"model.vision_model.encoder.layers.{block}.{mod}.{kind}" if mod else None
    base, _, kind = gguf_name.rpartition(".")
    top = IDEFICS3_TOP.get(base)
    return f"{top}.{kind}" if top and kind in ("weight", "bias") else None


def text_hf_name(gguf_name: str) -> str | None:
    """transformers' Idefics3 name of the language model's tensor ``gguf_name`` (a llama GGUF), or None."""
    name = hf_name("llama", gguf_name)
    if name is None or not name.startswith("model."):
        return name  # lm_head stays where it is
    return TEXT_PREFIX + name[len("model."):]
