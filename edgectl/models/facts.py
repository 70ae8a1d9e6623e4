"""What a model is, as the planner reads it: :class:`ModelFacts` (schema ``edgectl.model/1``) and its
parts, as :mod:`edgectl.probe.facts` holds what a host is.

Read from a model directory by :func:`edgectl.models.inspect.inspect_model`, from a GGUF file by
:func:`edgectl.models.gguf_inspect.inspect_gguf`; written to and read back from JSON here.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgectl.contract import codec
from edgectl.errors import EdgectlError

SCHEMA = "edgectl.model/1"

# The attention kind of a layer, as transformers' ``layer_types`` name them.
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
# The language model's tensors in an Idefics3 / SmolVLM checkpoint (vLLM's get_mm_mapping: language_model
# "model.text_model"); the rest but the LM head is the vision tower and the connector.
TEXT_MODEL_PREFIX = "model.text_model."


@dataclass(frozen=True)
class LinearLayer:
    """One linear weight as vLLM builds it: ``out_features × in_features`` (PyTorch layout)."""

    name: str  # the module name, e.g. "model.layers.0.self_attn.q_proj"
    out_features: int
    in_features: int
    # A GGUF served as it is: the bits of the edgectl block its file's type becomes (4 for
    # Q4_0/Q4_1/Q4_K, 5 for Q5_0, 8 for other 5-8-bit types; gguf_types.layer_bits over the
    # layers vLLM merges with it); None
    # for a checkpoint quantized at load (the plan's format decides).
    gguf_bits: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "out_features": self.out_features, "in_features": self.in_features}
        if self.gguf_bits is not None:
            out["gguf_bits"] = self.gguf_bits
        return out


@dataclass(frozen=True)
class ParamBytes:
    """Bytes of the stored weights, split the way the planner prices them.

    ``linear`` holds only the weight matrices of linear layers (what a weight-only int4 method
    replaces); their biases are in ``other`` with the norms. ``lm_head`` is 0 when the
    embeddings are tied (vLLM then reuses the embedding matrix).
    """

    linear: int
    embedding: int
    lm_head: int
    other: int

    @property
    def total(self) -> int:
        return self.linear + self.embedding + self.lm_head + self.other

    def to_dict(self) -> dict[str, int]:
        return {"linear": self.linear, "embedding": self.embedding, "lm_head": self.lm_head,
                "other": self.other, "total": self.total}


@dataclass(frozen=True)
class SpeechFacts:
    """An encoder-decoder speech-to-text model (Whisper), as the planner sizes it."""

    encoder_layers: int
    decoder_layers: int
    d_model: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    num_mel_bins: int
    max_source_positions: int  # 1500 encoder positions = one 30 s window
    max_target_positions: int  # 448 decoder tokens
    multilingual: bool  # False for *.en models (tiny.en)
    sample_rate: int = 16000
    window_s: int = 30

    def to_dict(self) -> dict[str, Any]:
        return dict(codec.to_json(self))


@dataclass(frozen=True)
class VisionFacts:
    """A vision-language model's image side (Idefics3 / SmolVLM), as its config.json and processor
    files say: the vision tower, the connector, and what one image costs in tokens.

    An image is cut into ``tile_size`` squares (``tile_size / patch_size`` patches a side), each tile
    becomes ``tokens_per_tile`` tokens after the connector's pixel shuffle by ``scale_factor``; the
    processor first resizes the image to a longest edge of ``resize_longest_edge`` and, when it
    splits, cuts it into tiles of ``tile_longest_edge`` plus one global view
    (edgectl/models/vision_inspect.py, ``idefics3_tiles``)."""

    tower_model_type: str  # vision_config.model_type, e.g. "idefics3_vision"
    tower_layers: int
    tower_hidden_size: int
    tower_attention_heads: int
    tower_intermediate_size: int
    patch_size: int
    tile_size: int  # vision_config.image_size: the side of the square the tower takes
    connector: str  # "pixel_shuffle": scale_factor² neighbouring patches become one token
    scale_factor: int
    image_token_id: int | None
    tokens_per_tile: int  # the processor's image_seq_len
    image_processor: str  # image_processor_type
    image_splitting: bool  # do_image_splitting
    resize_longest_edge: int  # size.longest_edge: every image is resized to this longest edge first
    tile_longest_edge: int  # max_image_size.longest_edge: the tiles' side
    tiles_512: int  # tiles (the global view included) of a 512x512 image
    image_tokens_512: int
    tiles_max: int  # the most tiles any image gets (a square at resize_longest_edge)
    image_tokens_max: int
    tower_params: int | None  # the vision tower and connector (None: not read from the weights)
    tower_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(codec.to_json(self))


@dataclass(frozen=True)
class ModelFacts:
    name: str
    path: str
    architecture: str
    model_type: str | None
    num_layers: int
    hidden_size: int
    intermediate_size: int | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    sliding_window: int | None  # None when no layer slides
    layer_types: tuple[str, ...]  # one per layer
    dtype: str | None  # the dtype vLLM computes in ("auto" = config.json's), e.g. "bfloat16"
    weights_dtype: str | None  # the dominant dtype of the stored linear weights
    param_bytes: ParamBytes
    param_source: str  # "safetensors" (headers read) or "config" (computed from config.json)
    num_params: int | None  # None for pre-quantized checkpoints (packed tensors hide the count)
    linear_layers: tuple[LinearLayer, ...]
    quantization_config: dict[str, Any] | None
    tokenizer: bool
    chat_template: bool
    unknown: tuple[str, ...] = field(default=())  # fields that could not be read
    # What the worker holds of the tokenizer, measured at pull (edgectl_runtime/introspect/tokenizer_cost.py);
    # None: not measured (a directory edgectl did not pull, or an older pull)
    tokenizer_bytes: int | None = field(default=None)
    # "text" (a causal LM), "speech" (speech to text: ``speech`` says its encoder and decoder) or
    # "vision" (images and text in: ``vision`` says its tower and image tokens; the other fields are its
    # language model's, and the weights fields count every stored tensor, the tower's included)
    modality: str = field(default="text")
    speech: SpeechFacts | None = field(default=None)
    vision: VisionFacts | None = field(default=None)

    @property
    def language_model_layers(self) -> tuple[LinearLayer, ...]:
        """The linear layers a quantized format packs: every one, but of a vision-language model only its
        language model's (the tower and the connector stay in the model dtype)."""
        if self.vision is None:
            return self.linear_layers
        return tuple(layer for layer in self.linear_layers if layer.name.startswith(TEXT_MODEL_PREFIX))

    @property
    def linear_params(self) -> int | None:
        """The parameters of the language model's linear layers (the LM head is not among them): what each
        prompt token multiplies. None when the layers are not known."""
        return sum(layer.out_features * layer.in_features for layer in self.language_model_layers) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "name": self.name,
            "path": self.path,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "dtype": self.dtype,
            "weights_dtype": self.weights_dtype,
            "param_bytes": self.param_bytes.to_dict(),
            "param_source": self.param_source,
            "num_params": self.num_params,
            "linear_layers": [layer.to_dict() for layer in self.linear_layers],
            "quantization_config": self.quantization_config,
            "tokenizer": self.tokenizer,
            "chat_template": self.chat_template,
            "unknown": list(self.unknown),
            "tokenizer_bytes": self.tokenizer_bytes,
            "modality": self.modality,
            "speech": self.speech.to_dict() if self.speech is not None else None,
            "vision": self.vision.to_dict() if self.vision is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelFacts:
        """Read back what :meth:`to_dict` wrote (possibly on another host), strictly, through the
        contract's codec (``edgectl/contract/codec.py``); EdgectlError naming every bad field."""
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise EdgectlError(f"model facts have schema {found!r}, expected {SCHEMA!r}")
        # written by to_dict but not fields: the schema, and param_bytes.total (checked against its parts);
        # weights_dtype and num_params may be absent (facts written before them): read as None
        body = {"weights_dtype": None, "num_params": None, **data}
        del body["schema"]
        pb = body.get("param_bytes")
        total = pb.get("total") if isinstance(pb, dict) else None
        if isinstance(pb, dict):
            body["param_bytes"] = {k: v for k, v in pb.items() if k != "total"}
        facts, problems = codec.read(cls, body, "model")
        if isinstance(facts, ModelFacts) and total != facts.param_bytes.total:
            problems.append(f"model.param_bytes.total: {total!r} is not the sum of its parts "
                            f"({facts.param_bytes.total})")
        if problems:
            raise EdgectlError(f"model facts ({SCHEMA}) are malformed: {problems[0]}", details=problems[1:])
        assert isinstance(facts, ModelFacts)
        return facts

    def render_text(self) -> str:
        pb = self.param_bytes
        n_sliding = sum(t == SLIDING_ATTENTION for t in self.layer_types)
        n_full = sum(t == FULL_ATTENTION for t in self.layer_types)
        kinds = [f"{n_full} full attention"] if n_full else []
        if n_sliding:
            kinds.append(f"{n_sliding} sliding window {self.sliding_window}")
        other_kinds = Counter(t for t in self.layer_types if t not in (FULL_ATTENTION, SLIDING_ATTENTION))
        kinds += [f"{n} {kind}" for kind, n in sorted(other_kinds.items())]
        if self.rope_scaling:
            rope_type = self.rope_scaling.get("rope_type") or self.rope_scaling.get("type") or "?"
            scaling = f"RoPE scaling {rope_type} factor {self.rope_scaling.get('factor', '?')}"
        else:
            scaling = "no RoPE scaling"
        params = f"{self.num_params / 1e6:.1f} M parameters, " if self.num_params is not None else ""
        lines = [
            f"{self.name}  {self.path}",
            f"  architecture   {self.architecture} ({self.model_type}), {self.dtype or 'dtype unknown'}",
            f"  layers         {self.num_layers} ({', '.join(kinds)})",
            f"  hidden         {self.hidden_size}, intermediate {self.intermediate_size}",
            f"  heads          {self.num_attention_heads} query, {self.num_kv_heads} KV, head_dim {self.head_dim}",
            f"  vocab          {self.vocab_size}, {'tied' if self.tie_word_embeddings else 'separate'} "
            "embeddings and LM head",
            f"  positions      max_position_embeddings {self.max_position_embeddings}, "
            f"rope_theta {self.rope_theta:g}, {scaling}" if self.rope_theta is not None else
            f"  positions      max_position_embeddings {self.max_position_embeddings}, {scaling}",
            f"  weights        {params}{_mib(pb.total)} ({self.weights_dtype}, from {self.param_source}): "
            f"linear {_mib(pb.linear)} in {len(self.linear_layers)} layers, embedding {_mib(pb.embedding)}, "
            f"lm_head {_mib(pb.lm_head)}, other {_mib(pb.other)}",
            f"  quantization   {json.dumps(self.quantization_config) if self.quantization_config else 'none'}",
            f"  tokenizer      {'yes' if self.tokenizer else 'no'}, chat template "
            f"{'yes' if self.chat_template else 'no'}",
        ]
        if self.speech is not None:
            sp = self.speech
            lines.insert(1, f"  modality       speech to text: encoder {sp.encoder_layers} layers x "
                            f"{sp.encoder_attention_heads} heads (ffn {sp.encoder_ffn_dim}) over {sp.num_mel_bins} mel bins, "
                            f"{sp.max_source_positions} positions = {sp.window_s} s at {sp.sample_rate} Hz; decoder "
                            f"{sp.decoder_layers} layers x {sp.decoder_attention_heads} heads, {sp.max_target_positions} "
                            f"tokens; {'multilingual' if sp.multilingual else 'English only'}")
        if self.vision is not None:
            v = self.vision
            tower = (f", {v.tower_params / 1e6:.1f} M parameters ({_mib(v.tower_bytes)}) with the connector"
                     if v.tower_params is not None and v.tower_bytes is not None else "")
            split = (f"resized to a longest edge of {v.resize_longest_edge}, cut into {v.tile_longest_edge}x"
                     f"{v.tile_longest_edge} tiles plus a global view" if v.image_splitting else
                     f"resized to {v.tile_longest_edge}x{v.tile_longest_edge}, not split")
            lines[1:1] = [
                f"  modality       images and text in, text out: vision tower {v.tower_model_type}, "
                f"{v.tower_layers} layers x {v.tower_attention_heads} heads, hidden {v.tower_hidden_size} "
                f"(MLP {v.tower_intermediate_size}), patch {v.patch_size} on {v.tile_size}x{v.tile_size} tiles{tower}",
                f"  connector      {v.connector} by {v.scale_factor}: {v.tokens_per_tile} tokens per tile, "
                f"image token id {v.image_token_id}",
                f"  images         {v.image_processor}: {split}; a 512x512 image: {v.tiles_512} tile(s) = "
                f"{v.image_tokens_512} tokens; the largest: {v.tiles_max} tiles = {v.image_tokens_max} tokens",
            ]
        if self.unknown:
            lines.append(f"  unknown        {', '.join(self.unknown)}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def natural_key(name: str) -> list[Any]:
    """The order linear layers are listed in: numbered parts compared as numbers (layers.2 before layers.10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
