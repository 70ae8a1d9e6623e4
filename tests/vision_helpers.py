"""A vision-language model directory for the tests, without torch: the shape model's (synth-smolvlm-256m)
config.json, processor files and safetensors headers (zeros, written sparse; tests/models_helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models_helpers import SHAPES, llama_tensors, write_safetensors

from edgectl.models import CATALOG

SPEC = CATALOG["synth-smolvlm-256m"].synthetic
VOCAB = 49280
IMAGE_TOKEN_ID = 49153


def vlm_config(**overrides: Any) -> dict[str, Any]:
    """The shape model's config.json: the catalog's spec with SmolLM2-135M's as its text_config."""
    text = json.loads((SHAPES / "smollm2-135m" / "config.json").read_text())
    text = {k: v for k, v in text.items() if k != "architectures"} | {"vocab_size": VOCAB, "tie_word_embeddings": True}
    return {**SPEC.config, "text_config": text, "image_token_id": IMAGE_TOKEN_ID, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", **overrides}


def tower_tensors(vision: dict[str, Any], text_hidden: int, scale: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The names and shapes transformers' Idefics3 vision tower and connector save."""
    h, i, p, n = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"], vision["num_hidden_layers"]
    patches = (vision["image_size"] // p) ** 2
    v = "model.vision_model."
    t = {v + "embeddings.patch_embedding.weight": ("BF16", (h, 3, p, p)), v + "embeddings.patch_embedding.bias": ("BF16", (h,)),
         v + "embeddings.position_embedding.weight": ("BF16", (patches, h))}
    for layer in range(n):
        q = f"{v}encoder.layers.{layer}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[f"{q}self_attn.{proj}.weight"] = ("BF16", (h, h))
            t[f"{q}self_attn.{proj}.bias"] = ("BF16", (h,))
        t |= {q + "mlp.fc1.weight": ("BF16", (i, h)), q + "mlp.fc1.bias": ("BF16", (i,)),
              q + "mlp.fc2.weight": ("BF16", (h, i)), q + "mlp.fc2.bias": ("BF16", (h,))}
        for norm in ("layer_norm1", "layer_norm2"):
            t |= {f"{q}{norm}.weight": ("BF16", (h,)), f"{q}{norm}.bias": ("BF16", (h,))}
    t |= {v + "post_layernorm.weight": ("BF16", (h,)), v + "post_layernorm.bias": ("BF16", (h,)),
          "model.connector.modality_projection.proj.weight": ("BF16", (text_hidden, h * scale * scale))}
    return t


def make_vlm(root: Path, config: dict[str, Any] | None = None, processor: dict[str, Any] | None = None) -> Path:
    """The shape model's directory as its maker writes it (processor_config.json holding the image
    processor's settings, the tokenizer, chat_template.jinja); ``processor`` replaces that file's content."""
    root.mkdir(parents=True, exist_ok=True)
    config = config or vlm_config()
    (root / "config.json").write_text(json.dumps(config))
    text = config["text_config"]
    tensors = {"model.text_model." + k[len("model."):]: v
               for k, v in llama_tensors(layers=text["num_hidden_layers"], hidden=text["hidden_size"],
                                         intermediate=text["intermediate_size"], heads=text["num_attention_heads"],
                                         kv_heads=text["num_key_value_heads"], vocab=text["vocab_size"],
                                         head_dim=text.get("head_dim")).items()}
    tensors |= tower_tensors(config["vision_config"], text["hidden_size"], config["scale_factor"])
    write_safetensors(root / "model.safetensors", tensors)
    settings = {k: v for k, v in SPEC.processor.items() if k != "image_seq_len"}
    if processor is None:
        processor = {"image_processor": {**settings, "image_processor_type": "Idefics3ImageProcessor"},
                     "image_seq_len": SPEC.processor["image_seq_len"], "processor_class": "Idefics3Processor"}
    (root / "processor_config.json").write_text(json.dumps(processor))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (root / f).write_bytes((SHAPES / "smollm2-135m" / f).read_bytes())
    (root / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return root
