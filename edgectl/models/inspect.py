"""What a model directory holds, read without loading a tensor: ``config.json``, the
safetensors headers and the tokenizer files.

``inspect_model(path) -> ModelFacts`` (schema ``edgectl.model/1``) is what the planner sizes
weights, KV cache and RoPE tables from. Anything vLLM would refuse later (no config, corrupt
weights, an architecture it has no class for, no tokenizer) is refused here with one line.
A directory that serves a GGUF as it is (``model.gguf``) is read from the GGUF's header; a Whisper
directory (speech to text) by :mod:`edgectl.models.whisper_inspect`; a vision-language directory as
its language model plus the image side :mod:`edgectl.models.vision_inspect` reads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from edgectl.contract.gguf_names import DIRECT_GGUF
from edgectl.errors import EdgectlError
from edgectl.models import architectures, config_json
from edgectl.models.facts import ModelFacts
from edgectl.models.gguf_inspect import inspect_gguf
from edgectl.models.safetensors_header import TensorInfo, read_model_tensors
from edgectl.models.tokenizer_files import (
    TOKENIZER_FILES,
    has_chat_template,
    has_tokenizer,
    tokenizer_cost,
)
from edgectl.models.vision_inspect import vision_architecture, with_vision
from edgectl.models.weights import (
    CONFIG_LAYOUTS,
    ModelShape,
    Weights,
    config_tensors,
    tensor_kind,
    weights_from_config,
    weights_from_tensors,
)
from edgectl.models.whisper_inspect import inspect_whisper


def inspect_model(path: Path | str, name: str | None = None, *, require_tokenizer: bool = True) -> ModelFacts:
    """As :func:`_inspect_model`, with the tokenizer's measured cost where the directory records it."""
    facts = _inspect_model(path, name, require_tokenizer=require_tokenizer)
    return dataclasses.replace(facts, tokenizer_bytes=tokenizer_cost(Path(facts.path)))


def _inspect_model(path: Path | str, name: str | None = None, *, require_tokenizer: bool = True) -> ModelFacts:
    """Facts about the HF model directory ``path``, without loading any tensor.

    ``name`` is how the user called it (a catalog name); default: the directory's name.
    ``require_tokenizer=False`` is for planning from a catalog entry's shipped configuration,
    before the model (and its tokenizer) is downloaded.
    Raises :class:`EdgectlError` with one line for anything vLLM could not serve.
    """
    path = _model_directory(path)
    if (path / DIRECT_GGUF).is_file():
        return _direct_gguf_facts(path, name, require_tokenizer)
    raw = config_json.read_config(path)
    config = config_json.text_config(raw)
    vision = vision_architecture(raw)
    if vision is not None:  # the text model's facts, under the architecture vLLM loads (not text_config's own)
        config = {**config, "architectures": [vision]}
    arch = config_json.architecture(path, config)
    if architectures.is_speech_to_text(arch):
        return inspect_whisper(path, config, arch, name, require_tokenizer)
    shape, max_pos, unknown = _dimensions(path, config)
    layer_types, window = config_json.layer_types(path, config, shape.num_layers)
    rope_theta, rope_scaling = config_json.rope(config)
    if rope_theta is None:
        unknown.append("rope_theta")
    dtype = config.get("dtype") or config.get("torch_dtype")
    if not isinstance(dtype, str):
        dtype = None
    if require_tokenizer:
        _require_tokenizer(path)
    tensors = read_model_tensors(path)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    tied = _tied(path, config, tensors)
    weights, source = _weights(path, config, shape, tensors, tied, dtype, model_type)
    if dtype is None:
        dtype = weights.weights_dtype
        unknown.append("dtype")
    facts = ModelFacts(
        name=name or path.name, path=str(path), architecture=arch, model_type=model_type,
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_attention_heads=shape.num_attention_heads, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
        vocab_size=shape.vocab_size, tie_word_embeddings=tied, max_position_embeddings=max_pos,
        rope_theta=rope_theta, rope_scaling=rope_scaling, sliding_window=window, layer_types=layer_types,
        dtype=dtype, weights_dtype=weights.weights_dtype, param_bytes=weights.param_bytes, param_source=source,
        num_params=weights.num_params, linear_layers=weights.linear_layers,
        quantization_config=config_json.quantization_config(path, config),
        tokenizer=True if require_tokenizer else has_tokenizer(path),  # checked above when required
        chat_template=has_chat_template(path),
        unknown=tuple(unknown + weights.unknown),
    )
    return with_vision(path, raw, facts, tensors) if vision is not None else facts


def _model_directory(path: Path | str) -> Path:
    """``path`` resolved, refused with one line when it is not a directory."""
    path = Path(path).expanduser()
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise EdgectlError(
            f"{path} {what}: give a Hugging Face model directory (config.json, *.safetensors, tokenizer) "
            "or a catalog name from `edgectl models list`"
        )
    return path.resolve()


def _direct_gguf_facts(path: Path, name: str | None, require_tokenizer: bool) -> ModelFacts:
    """The facts of a direct GGUF directory: the weights from the GGUF's tensor table, the
    tokenizer and chat template from the directory (what vLLM will read)."""
    facts = inspect_gguf(path / DIRECT_GGUF, name or path.name)
    if require_tokenizer and not has_tokenizer(path):
        raise EdgectlError(f"{path}: no tokenizer beside {DIRECT_GGUF}: pull the model again "
                           "(`edgectl models pull`) to write it")
    return dataclasses.replace(facts, path=str(path), tokenizer=has_tokenizer(path),
                               chat_template=has_chat_template(path))


def _dimensions(path: Path, config: dict[str, Any]) -> tuple[ModelShape, int | None, list[str]]:
    """The model's dimensions from config.json (under any of the names configs use for each), its
    maximum position, and the optional fields it does not give."""
    num_layers = config_json.int_field(path, config, "num_hidden_layers", "n_layer", "num_layers")
    hidden = config_json.int_field(path, config, "hidden_size", "n_embd", "d_model")
    heads = config_json.int_field(path, config, "num_attention_heads", "n_head")
    kv_heads = config_json.int_field(path, config, "num_key_value_heads", "num_kv_heads",
                                     "multi_query_group_num", required=False) or heads
    head_dim = config_json.int_field(path, config, "head_dim", required=False) or hidden // heads
    vocab = config_json.int_field(path, config, "vocab_size", "padded_vocab_size")
    intermediate = config_json.int_field(path, config, "intermediate_size", "ffn_hidden_size", "n_inner",
                                         required=False)
    max_pos = config_json.int_field(path, config, "max_position_embeddings", "n_positions",
                                    "max_sequence_length", "seq_length", required=False)
    assert num_layers and hidden and heads and vocab  # required=True raised otherwise
    unknown = [field_name for field_name, value in (("intermediate_size", intermediate),
                                                    ("max_position_embeddings", max_pos)) if value is None]
    return ModelShape(num_layers, hidden, intermediate, heads, kv_heads, head_dim, vocab), max_pos, unknown


def _require_tokenizer(path: Path) -> None:
    if not has_tokenizer(path):
        raise EdgectlError(
            f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}, *.tiktoken); vLLM needs one to "
            "serve text: copy the model's tokenizer files next to config.json"
        )


def _tied(path: Path, config: dict[str, Any], tensors: list[TensorInfo]) -> bool:
    """Whether the LM head is the embedding table (``tie_word_embeddings``)."""
    tied = config.get("tie_word_embeddings")
    if tied is None:
        # Absent: the weights tell (a tied model stores no lm_head); else the default of
        # transformers' Llama/Mistral/Qwen configuration classes, which is False.
        tied = not any(tensor_kind(t.name) == "lm_head" for t in tensors) if tensors else False
    if not isinstance(tied, bool):
        raise config_json.bad_config(path, f"tie_word_embeddings is {tied!r}, expected true or false")
    return tied


def _weights(path: Path, config: dict[str, Any], shape: ModelShape, tensors: list[TensorInfo], tied: bool,
             dtype: str | None, model_type: str | None) -> tuple[Weights, str]:
    """The weights from the safetensors headers, else computed from config.json; and which it was."""
    layout = config_tensors(config, shape, tied)
    if tensors:
        config_linear = None
        if layout is not None:
            config_linear = {n[: -len(".weight")]: s for n, s in layout if n.endswith(".weight") and len(s) == 2}
        return weights_from_tensors(tensors, tied, model_type, config_linear), "safetensors"
    if layout is not None:
        return weights_from_config(path, layout, dtype, tied, model_type), "config"
    raise EdgectlError(
        f"{path}: no *.safetensors weights, and edgectl cannot size a {model_type!r} model from "
        f"config.json alone (it can for {', '.join(sorted(CONFIG_LAYOUTS))}); add the safetensors files"
    )
