"""Make a synthetic vision-language model: a real VLM's shape around a real language model.

Run by ``edgectl models pull`` for a synthetic vision catalog entry (edgectl/models/synthetic.py), under
the runtime interpreter, in a subprocess::

    python -P -m edgectl_runtime.tools.synth_vlm SPEC_JSON LANGUAGE_MODEL_DIR OUT_DIR

``SPEC_JSON`` is one JSON object: ``config`` (the VLM's config.json keys without ``text_config``:
``architectures``, ``model_type``, ``scale_factor``, ``vision_config``, ...), ``processor`` (the image
processor's settings and ``image_seq_len``), ``vocab_size`` (the VLM's padded vocabulary) and ``seed``.
``LANGUAGE_MODEL_DIR`` is a Hugging Face ``LlamaForCausalLM`` directory (config.json, model.safetensors,
tokenizer.json) whose weights become the text model unchanged. ``OUT_DIR`` must not exist or be empty.
It receives what transformers' ``Idefics3ForConditionalGeneration`` and ``Idefics3Processor`` load, and
so what vLLM's ``Idefics3ForConditionalGeneration`` (vllm/model_executor/models/idefics3.py) serves:

- ``config.json``: the spec's config with the language model's config.json as ``text_config`` (its
  ``vocab_size`` raised to the spec's, its architecture SmolVLM's ``VLlama3ForCausalLM``), the ``<image>``
  token's id as ``image_token_id``;
- ``model.safetensors`` (bf16): ``model.text_model.*`` = the language model's ``model.*`` tensors as
  they are, the embedding table grown to ``vocab_size`` with zero rows (the image-layout tokens and
  the padding: a tied LM head then gives them logit exactly 0, below the trained pieces', so greedy
  decoding of the real text model is unchanged). ``model.vision_model.*`` and ``model.connector.*``
  are seeded random, each tensor from its own ``torch.Generator`` seeded from ``seed`` and the
  tensor's name (bytes independent of write order and threads): norms ones, biases zeros, every other
  weight N(0, 0.02²) (SigLIP's ``initializer_range``), except the connector's projection, drawn at
  std ``rms(text embeddings) / sqrt(in_features)`` so that an image token's embedding has about the
  RMS of a text token's (a unit-variance input: the vision tower ends in a LayerNorm);
- the processor (``processor.save_pretrained``): the image processor's settings, the language model's
  tokenizer with Idefics3's image tokens added (``<fake_token_around_image>``, ``<image>``,
  ``<end_of_utterance>``, ``<global-img>``, ``<row_i_col_j>`` for i, j in 1..6;
  transformers/models/idefics3/processing_idefics3.py ``__init__``), and a ChatML chat template (the
  language model's) in which an image part of a message is the ``<image>`` placeholder.

Nothing is downloaded. The vision tower is random: the model does not see; it exists so speed, memory
and numerical agreement between engines can be measured at SmolVLM's shape. On success the last line on
stdout is one JSON object (files, parameter counts, image token id, tool versions). Exit codes: 0 done,
2 bad arguments, 1 failed.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

TOOLS = ("torch", "safetensors", "transformers")
INIT_STD = 0.02  # Idefics3VisionConfig.initializer_range (transformers' default, SigLIP's)
CONNECTOR = "model.connector.modality_projection.proj.weight"

# The tokens Idefics3Processor looks up (processing_idefics3.py: fake_image_token, image_token,
# end_of_utterance_token, global_image_tag, row_col_ids), in the order they are added.
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)))

# ChatML (SmolLM2-Instruct's template, without its default system message) where a message's content
# may be a list of parts: a text part is its text, an image part the <image> placeholder the processor
# expands into the image's tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    return {name: metadata.version(name) for name in TOOLS}


def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _is_norm(name: str) -> bool:
    return "norm" in name.rsplit(".", 2)[-2]


def tower_tensor(name: str, shape: tuple[int, ...], seed: int, connector_std: float):
    """One seeded vision-tower or connector tensor (bf16)."""
    import torch

    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.bfloat16)
    if _is_norm(name):
        return torch.ones(shape, dtype=torch.bfloat16)
    std = connector_std if name == CONNECTOR else INIT_STD
    return (torch.randn(shape, generator=_generator(seed, name), dtype=torch.float32) * std).to(torch.bfloat16)


# The text model's class as SmolVLM-256M-Instruct's config.json names it in text_config. vLLM and
# transformers build the text model from the top-level architecture; llama.cpp's convert_hf_to_gguf.py
# converts the text model by this name (conversion/base.py, get_model_architecture: text_config's
# architectures win for the text GGUF; conversion/llama.py registers VLlama3ForCausalLM).
TEXT_ARCHITECTURE = "VLlama3ForCausalLM"


def build_config(spec: dict, text_config: dict, image_token_id: int) -> dict:
    text = {k: v for k, v in text_config.items()
            if k not in ("architectures", "_model_name_or_path", "transformers_version")}
    text["vocab_size"] = int(spec["vocab_size"])
    text["architectures"] = [TEXT_ARCHITECTURE]
    return {**spec["config"], "text_config": text, "image_token_id": image_token_id,
            "tie_word_embeddings": bool(text.get("tie_word_embeddings", False)),
            "pad_token_id": text.get("pad_token_id"), "torch_dtype": "bfloat16"}


def make(spec: dict, language_model: Path, out_dir: Path) -> dict:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(language_model), local_files_only=True)
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    vocab = int(spec["vocab_size"])
    if len(tokenizer) > vocab:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens with the image tokens, vocab_size is {vocab}")
    text_config = json.loads((language_model / "config.json").read_text())
    config = build_config(spec, text_config, tokenizer.convert_tokens_to_ids("<image>"))

    # The names and shapes transformers expects, from a model built on the meta device (no memory).
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in
                  Idefics3ForConditionalGeneration(Idefics3Config(**config)).state_dict().items()}

    text = load_file(str(language_model / "model.safetensors"))
    tensors = {}
    for name, t in text.items():
        if not name.startswith("model."):
            continue  # lm_head: tied, or copied below
        tensors["model.text_model." + name[len("model."):]] = t.to(torch.bfloat16)
    embed = tensors["model.text_model.embed_tokens.weight"]
    grown = torch.zeros((vocab, embed.shape[1]), dtype=torch.bfloat16)
    grown[: embed.shape[0]] = embed
    tensors["model.text_model.embed_tokens.weight"] = grown
    if not config["tie_word_embeddings"]:
        head = torch.zeros_like(grown)
        head[: embed.shape[0]] = text["lm_head.weight"].to(torch.bfloat16)
        tensors["lm_head.weight"] = head
    embed_rms = float(embed.float().pow(2).mean().sqrt())
    in_features = shapes[CONNECTOR][1]
    connector_std = embed_rms / math.sqrt(in_features)
    tower_params = 0
    for name, shape in sorted(shapes.items()):
        if name.startswith(("model.vision_model.", "model.connector.")):
            tensors[name] = tower_tensor(name, shape, int(spec["seed"]), connector_std)
            tower_params += tensors[name].numel()
    missing = sorted(set(shapes) - set(tensors) - ({"lm_head.weight"} if config["tie_word_embeddings"] else set()))
    wrong = sorted(n for n, t in tensors.items() if shapes.get(n) != tuple(t.shape))
    if missing or wrong:
        raise ValueError(f"tensors missing {missing[:5]}, of the wrong shape or unknown {wrong[:5]}")

    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    p = spec["processor"]
    image_processor = Idefics3ImageProcessorPil(**{k: v for k, v in p.items() if k != "image_seq_len"})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=int(p["image_seq_len"]), chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(out_dir))
    files = sorted(str(f.relative_to(out_dir)) for f in out_dir.rglob("*") if f.is_file())
    return {"files": files, "parameters": sum(t.numel() for t in tensors.values()), "tower_parameters": tower_params,
            "image_token_id": config["image_token_id"], "tokens": len(tokenizer),
            "connector_std": connector_std, "text_embedding_rms": embed_rms, "tools": tool_versions()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m edgectl_runtime.tools.synth_vlm SPEC_JSON LANGUAGE_MODEL_DIR OUT_DIR", file=sys.stderr)
        return 2
    try:
        spec = json.loads(args[0])
        spec["config"]["vision_config"], spec["processor"]["image_seq_len"], spec["vocab_size"], spec["seed"]  # noqa: B018
    except (ValueError, KeyError, TypeError) as exc:
        print(f"error: SPEC_JSON is not a synthetic vision model spec ({exc})", file=sys.stderr)
        return 2
    language_model, out_dir = Path(args[1]), Path(args[2])
    if not (language_model / "model.safetensors").is_file():
        print(f"error: {language_model} has no model.safetensors", file=sys.stderr)
        return 2
    if out_dir.exists() and any(out_dir.iterdir()):
        print(f"error: {out_dir} is not empty", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    result = make(spec, language_model, out_dir)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
