"""config.json for a GGUF served as it is: the keyword arguments of transformers' config class of
its model type, from the GGUF metadata. vLLM 0.32 has no GGUF loader of its own; edgectl's
(``runtime/edgectl_runtime/vllm_plugin/gguf_loader.py``) builds the model from a small directory holding this
config, the tokenizer made from the GGUF's, and the GGUF itself (tensor names and llama.cpp's
quirks: ``edgectl/contract/gguf_names.py``).
"""

from __future__ import annotations

from typing import Any

from edgectl.contract.gguf_header import GGUFHeader
from edgectl.models.gguf_metadata import (
    ARCHITECTURES,
    layer_types,
    positive,
    vocab_size,
)


def hf_config(header: GGUFHeader) -> dict[str, Any]:
    """``model_type`` and the keyword arguments of its transformers config class (which fills the
    rest), from the GGUF metadata (ggml ``docs/gguf.md``, "LLM" keys)."""
    arch = header.architecture or ""
    vllm_class, model_type = ARCHITECTURES[arch]
    layers = positive(header, "block_count")
    hidden = positive(header, "embedding_length")
    heads = positive(header, "attention.head_count")
    kv = positive(header, "attention.head_count_kv", required=False) or heads
    head_dim = positive(header, "attention.key_length", required=False) or hidden // heads
    names = {t.name for t in header.tensors}
    md = header.metadata
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [vllm_class],
        "hidden_size": hidden,
        "intermediate_size": positive(header, "feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "rms_norm_eps": float(header.arch_key("attention.layer_norm_rms_epsilon") or 1e-6),
        "max_position_embeddings": positive(header, "context_length", required=False) or 4096,
        "vocab_size": vocab_size(header),
        "tie_word_embeddings": "output.weight" not in names,
        "dtype": "bfloat16",
    }
    theta = header.arch_key("rope.freq_base")
    if isinstance(theta, (int, float)):
        cfg["rope_theta"] = float(theta)
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("padding_token_id", "pad_token_id"), ("unknown_token_id", "unk_token_id")):
        value = md.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int) and not isinstance(value, bool):
            cfg[field] = value
    scaling = header.arch_key("rope.scaling.type")
    if isinstance(scaling, str) and scaling not in ("none", ""):
        raise ValueError(f"RoPE scaling {scaling!r} is not mapped yet")
    if arch == "llama":
        cfg.update(hidden_act="silu", attention_bias="blk.0.attn_q.bias" in names, mlp_bias=False)
    elif arch in ("qwen2", "qwen3"):
        cfg.update(hidden_act="silu", use_sliding_window=False)
        if arch == "qwen3":
            cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    elif arch == "gemma3":
        window = positive(header, "attention.sliding_window", required=False)
        cfg.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=head_dim,  # llama.cpp: attention scale 1/sqrt(head_dim) for Gemma-3 below 27B
            sliding_window=window,
            layer_types=list(layer_types(arch, layers, window)),
            # llama.cpp's Gemma-3 runs its sliding layers at RoPE base 10000 (llama-model.cpp,
            # LLM_ARCH_GEMMA3: rope_freq_base_train_swa); transformers' rope_local_base_freq
            rope_local_base_freq=10000.0,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        )
    return cfg
