"""What a model directory holds, read without loading a tensor: ``config.json``, the
safetensors headers and the tokenizer files.

``inspect_model(path) -> ModelFacts`` (schema ``edgectl.model/1``) is what the planner sizes
weights, KV cache and RoPE tables from. Anything vLLM would refuse later (no config, corrupt
weights, an architecture it has no class for, no tokenizer) is refused here with one line.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgectl.contract.gguf_names import DIRECT_GGUF
from edgectl.errors import EdgectlError
from edgectl.models import architectures
from edgectl.models.safetensors_header import (
    DTYPE_BITS,
    TORCH_DTYPE_NAMES,
    TensorInfo,
    read_model_tensors,
)

SCHEMA = "edgectl.model/1"

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"

# Bytes per element of the dtypes a config.json names (for sizing a model from its config alone).
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}

# Any one of these makes a tokenizer transformers/vLLM can load (fast tokenizer, SentencePiece,
# GPT-2 style BPE vocab, Mistral tekken); tokenizer_config.json alone carries no vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tekken.json")

# Parts of a linear layer stored by pre-quantized checkpoints (GPTQ/AWQ: qweight, qzeros, scales,
# g_idx; compressed-tensors: weight_packed, weight_scale, weight_zero_point, weight_shape, weight_g_idx).
QUANTIZED_LINEAR_PARTS = frozenset(
    {"qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point",
     "weight_shape", "weight_g_idx"}
)

# Layouts whose tensors edgectl can list from config.json alone (the decoder layer of
# transformers' modeling_llama / modeling_mistral / modeling_qwen2 / modeling_qwen3).
CONFIG_LAYOUTS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(frozen=True)
class LinearLayer:
    """One linear weight as vLLM builds it: ``out_features × in_features`` (PyTorch layout)."""

    name: str  # the module name, e.g. "model.layers.0.self_attn.q_proj"
    out_features: int
    in_features: int
    # A GGUF served as it is: the bits of the edgectl block its file's type becomes (4 for
    # Q4_0/Q4_1/Q4_K, 8 for 5-8-bit types), the widest of the layers vLLM merges with it; None
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
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelFacts:
        """Read back what :meth:`to_dict` wrote (possibly on another host)."""
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise EdgectlError(f"model facts have schema {found!r}, expected {SCHEMA!r}")
        try:
            pb = data["param_bytes"]
            param_bytes = ParamBytes(linear=int(pb["linear"]), embedding=int(pb["embedding"]),
                                     lm_head=int(pb["lm_head"]), other=int(pb["other"]))
            if int(pb["total"]) != param_bytes.total:
                raise ValueError(f"param_bytes.total {pb['total']} is not the sum of its parts")
            return cls(
                name=data["name"],
                path=data["path"],
                architecture=data["architecture"],
                model_type=data["model_type"],
                num_layers=int(data["num_layers"]),
                hidden_size=int(data["hidden_size"]),
                intermediate_size=data["intermediate_size"],
                num_attention_heads=int(data["num_attention_heads"]),
                num_kv_heads=int(data["num_kv_heads"]),
                head_dim=int(data["head_dim"]),
                vocab_size=int(data["vocab_size"]),
                tie_word_embeddings=bool(data["tie_word_embeddings"]),
                max_position_embeddings=data["max_position_embeddings"],
                rope_theta=data["rope_theta"],
                rope_scaling=data["rope_scaling"],
                sliding_window=data["sliding_window"],
                layer_types=tuple(data["layer_types"]),
                dtype=data["dtype"],
                weights_dtype=data.get("weights_dtype"),
                param_bytes=param_bytes,
                param_source=data["param_source"],
                num_params=data.get("num_params"),
                linear_layers=tuple(
                    LinearLayer(name=d["name"], out_features=int(d["out_features"]), gguf_bits=d.get("gguf_bits"),
                                in_features=int(d["in_features"]))
                    for d in data["linear_layers"]
                ),
                quantization_config=data["quantization_config"],
                tokenizer=bool(data["tokenizer"]),
                chat_template=bool(data["chat_template"]),
                unknown=tuple(data.get("unknown", ())),
                tokenizer_bytes=data.get("tokenizer_bytes"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise EdgectlError(f"model facts ({SCHEMA}) are malformed: {exc.__class__.__name__}: {exc}") from None

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
        if self.unknown:
            lines.append(f"  unknown        {', '.join(self.unknown)}")
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


# --- reading config.json -----------------------------------------------------------------


def _bad_config(path: Path, problem: str) -> EdgectlError:
    return EdgectlError(f"{path / 'config.json'}: {problem}")


def read_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise EdgectlError(
            f"{path}: no config.json, so this is not a Hugging Face model directory; give the directory "
            "that holds config.json, the *.safetensors weights and the tokenizer"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise _bad_config(path, f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); "
                                "download the model again or fix the file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad_config(path, f"cannot be read ({exc})") from None
    if not isinstance(config, dict):
        raise _bad_config(path, f"holds a JSON {type(config).__name__}, expected an object")
    return config


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Some text models nest their decoder's settings in text_config (as vLLM's get_text_config does).
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        return {**config, **text}
    return config


def _int_field(path: Path, config: dict[str, Any], *names: str, required: bool = True) -> int | None:
    for name in names:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _bad_config(path, f"{name} is {value!r}, expected a positive integer")
        return value
    if required:
        raise _bad_config(path, f"has no {names[0]}; it is needed to size the model")
    return None


def _architecture(path: Path, config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise _bad_config(path, "has no 'architectures' list, which vLLM needs to pick a model class; "
                                "add it (e.g. \"architectures\": [\"LlamaForCausalLM\"])")
    arch = archs[0]
    if not architectures.is_supported(arch):
        common = ", ".join(architectures.COMMON_ARCHITECTURES)
        more = len(architectures.TEXT_GENERATION_ARCHITECTURES) - len(architectures.COMMON_ARCHITECTURES)
        raise EdgectlError(
            f"{path}: architecture {arch!r} is not one vLLM {architectures.VLLM_VERSION} can serve for text "
            f"generation; it serves {common} and {more} more (listed below)",
            details=["supported: " + ", ".join(sorted(architectures.TEXT_GENERATION_ARCHITECTURES, key=str.lower))],
        )
    return arch


def _rope(config: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    # transformers 5 writes rope_parameters {"rope_theta", "rope_type", ...scaling}; older configs
    # have rope_theta and rope_scaling at the top level.
    params = config.get("rope_parameters")
    theta = config.get("rope_theta")
    scaling = config.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return (float(theta) if isinstance(theta, (int, float)) else None), (scaling or None)


def _layer_types(path: Path, config: dict[str, Any], num_layers: int) -> tuple[tuple[str, ...], int | None]:
    """One attention kind per layer, and the sliding window (None when nothing slides).

    Follows transformers' configuration classes, which vLLM reads: an explicit ``layer_types``
    wins; Qwen2/Qwen3 slide only with ``use_sliding_window`` and from layer ``max_window_layers``
    on (configuration_qwen2.py ``__post_init__``); any other config with a ``sliding_window``
    slides in every layer (vLLM's Attention falls back to the model-level window,
    vllm/model_executor/layers/attention/attention.py:265-273). 0 means no window (vLLM
    config/model.py:802-808).
    """
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        window = None
    explicit = config.get("layer_types")
    if explicit is not None:
        if not isinstance(explicit, list) or len(explicit) != num_layers or not all(
            isinstance(t, str) for t in explicit
        ):
            raise _bad_config(path, f"layer_types must list one string per layer ({num_layers})")
        if window is None and SLIDING_ATTENTION in explicit:
            raise _bad_config(path, "layer_types has sliding_attention layers but no sliding_window")
        types = tuple(explicit)
    elif config.get("model_type") in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not config.get("use_sliding_window", False):
            window = None
        first_sliding = config.get("max_window_layers", 28)  # transformers' default for both
        types = tuple(
            SLIDING_ATTENTION if window is not None and i >= first_sliding else FULL_ATTENTION
            for i in range(num_layers)
        )
    else:
        types = (SLIDING_ATTENTION if window is not None else FULL_ATTENTION,) * num_layers
    return types, (window if SLIDING_ATTENTION in types else None)


def _has_tokenizer(path: Path) -> bool:
    found = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if "tokenizer.json" in found:
        try:
            json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EdgectlError(f"{path / 'tokenizer.json'}: not a valid tokenizer file ({exc}); "
                               "copy the model's tokenizer again") from None
    return bool(found) or any(path.glob("*.tiktoken"))


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        tok_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(tok_config, dict) and bool(tok_config.get("chat_template"))


def _quantization_config(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    qc = config.get("quantization_config")
    if qc is None and (path / "quantize_config.json").is_file():  # older GPTQ checkpoints
        try:
            qc = json.loads((path / "quantize_config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EdgectlError(f"{path / 'quantize_config.json'}: not valid JSON ({exc})") from None
    if qc is not None and not isinstance(qc, dict):
        raise _bad_config(path, f"quantization_config is {qc!r}, expected an object")
    return qc


# --- weights -------------------------------------------------------------------------------


@dataclass
class _Shape:
    num_layers: int
    hidden_size: int
    intermediate_size: int | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool


def _config_tensors(config: dict[str, Any], s: _Shape) -> list[tuple[str, tuple[int, ...]]] | None:
    """The tensors transformers' Llama/Mistral/Qwen2/Qwen3 classes create, or None for other layouts."""
    model_type = config.get("model_type")
    if model_type not in CONFIG_LAYOUTS or s.intermediate_size is None:
        return None
    q_out, kv_out = s.num_attention_heads * s.head_dim, s.num_kv_heads * s.head_dim
    h, i_size = s.hidden_size, s.intermediate_size
    attention_bias = bool(config.get("attention_bias", False))
    qkv_bias = model_type == "qwen2" or attention_bias  # Qwen2 always has q/k/v biases
    o_bias = attention_bias and model_type != "qwen2"
    mlp_bias = bool(config.get("mlp_bias", False))
    tensors: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (s.vocab_size, h))]
    for n in range(s.num_layers):
        p = f"model.layers.{n}"
        layer = [
            (f"{p}.self_attn.q_proj", q_out, h, qkv_bias),
            (f"{p}.self_attn.k_proj", kv_out, h, qkv_bias),
            (f"{p}.self_attn.v_proj", kv_out, h, qkv_bias),
            (f"{p}.self_attn.o_proj", h, q_out, o_bias),
            (f"{p}.mlp.gate_proj", i_size, h, mlp_bias),
            (f"{p}.mlp.up_proj", i_size, h, mlp_bias),
            (f"{p}.mlp.down_proj", h, i_size, mlp_bias),
        ]
        for name, out_f, in_f, bias in layer:
            tensors.append((f"{name}.weight", (out_f, in_f)))
            if bias:
                tensors.append((f"{name}.bias", (out_f,)))
        tensors += [(f"{p}.input_layernorm.weight", (h,)), (f"{p}.post_attention_layernorm.weight", (h,))]
        if model_type == "qwen3":  # per-head RMSNorm of q and k (modeling_qwen3.py)
            tensors += [(f"{p}.self_attn.q_norm.weight", (s.head_dim,)),
                        (f"{p}.self_attn.k_norm.weight", (s.head_dim,))]
    tensors.append(("model.norm.weight", (h,)))
    if not s.tie_word_embeddings:
        tensors.append(("lm_head.weight", (s.vocab_size, h)))
    return tensors


def _kind(name: str) -> str:
    """embedding / lm_head / linear-or-other, from the tensor's name."""
    if name.startswith("lm_head.") or ".lm_head." in name:
        return "lm_head"
    module = name.rsplit(".", 1)[0]
    leaf = module.rsplit(".", 1)[-1]
    if "embed" in leaf or leaf in ("wte", "wpe", "word_embeddings", "tok_embeddings"):
        return "embedding"
    return "body"


def _natural_key(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


@dataclass
class _Weights:
    param_bytes: ParamBytes
    num_params: int | None
    linear_layers: tuple[LinearLayer, ...]
    weights_dtype: str | None
    unknown: list[str]


def _weights_from_tensors(
    tensors: list[TensorInfo],
    tied: bool,
    model_type: str | None,
    config_linear: dict[str, tuple[int, int]] | None,
) -> _Weights:
    by_kind = Counter[str]()
    linear: list[LinearLayer] = []
    linear_dtype_bytes = Counter[str]()
    quantized_modules: set[str] = set()
    numel = 0
    for t in tensors:
        kind = _kind(t.name)
        if kind == "lm_head" and tied:
            continue  # a stored copy of a tied head is not loaded: vLLM reuses the embedding
        module, _, leaf = t.name.rpartition(".")
        if kind == "body" and leaf in QUANTIZED_LINEAR_PARTS:
            by_kind["linear"] += t.nbytes
            quantized_modules.add(module)
            continue
        if kind == "body" and leaf == "weight" and len(t.shape) == 2:
            out_f, in_f = t.shape
            if model_type == "gpt2":  # GPT-2's Conv1D stores weights as in × out
                out_f, in_f = in_f, out_f
            linear.append(LinearLayer(module, out_f, in_f))
            linear_dtype_bytes[t.dtype] += t.nbytes
            by_kind["linear"] += t.nbytes
        else:
            by_kind["other" if kind == "body" else kind] += t.nbytes
        numel += t.numel
    unknown: list[str] = []
    if quantized_modules:
        # Packed tensors hide the logical shape; take it from config.json where the layout is known.
        for module in sorted(quantized_modules):
            if config_linear and module in config_linear:
                out_f, in_f = config_linear[module]
                linear.append(LinearLayer(module, out_f, in_f))
            elif "linear_layers" not in unknown:
                unknown.append("linear_layers")
    linear.sort(key=lambda layer: _natural_key(layer.name))
    dominant = linear_dtype_bytes.most_common(1)
    return _Weights(
        param_bytes=ParamBytes(linear=by_kind["linear"], embedding=by_kind["embedding"],
                               lm_head=by_kind["lm_head"], other=by_kind["other"]),
        num_params=None if quantized_modules else numel,
        linear_layers=tuple(linear),
        weights_dtype=TORCH_DTYPE_NAMES.get(dominant[0][0], dominant[0][0]) if dominant else None,
        unknown=unknown,
    )


def _weights_from_config(path: Path, layout: list[tuple[str, tuple[int, ...]]], dtype: str | None,
                         tied: bool, model_type: str | None) -> _Weights:
    if dtype not in DTYPE_BYTES:
        raise _bad_config(path, f"names dtype {dtype!r}, and without *.safetensors weights edgectl cannot "
                                "size the model otherwise; add the weights or set \"dtype\": \"bfloat16\"")
    fake_dtype = {2: "BF16" if dtype == "bfloat16" else "F16", 4: "F32", 8: "F64"}[DTYPE_BYTES[dtype]]
    tensors = [
        TensorInfo(name=name, dtype=fake_dtype, shape=shape,
                   nbytes=DTYPE_BITS[fake_dtype] // 8 * _prod(shape), file="config.json")
        for name, shape in layout
    ]
    weights = _weights_from_tensors(tensors, tied, model_type, None)
    weights.weights_dtype = dtype
    return weights


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# --- the entry point ---------------------------------------------------------------------


def _direct_gguf_facts(path: Path, name: str | None, require_tokenizer: bool) -> ModelFacts:
    """The facts of a direct GGUF directory: the weights from the GGUF's tensor table, the
    tokenizer and chat template from the directory (what vLLM will read)."""
    import dataclasses

    from edgectl.models.gguf_inspect import inspect_gguf

    facts = inspect_gguf(path / DIRECT_GGUF, name or path.name)
    if require_tokenizer and not _has_tokenizer(path):
        raise EdgectlError(f"{path}: no tokenizer beside {DIRECT_GGUF}: pull the model again "
                           "(`edgectl models pull`) to write it")
    return dataclasses.replace(facts, path=str(path), tokenizer=_has_tokenizer(path),
                               chat_template=_has_chat_template(path))


# The measured cost of a model's tokenizer in the worker: in a pulled directory, its manifest's
# "tokenizer_cost" (edgectl/models/pull.py); in the catalog's shipped copy, this file.
TOKENIZER_COST_JSON = "tokenizer-cost.json"


def tokenizer_cost(path: Path) -> int | None:
    """The tokenizer's measured bytes recorded in ``path`` (a pulled directory or a shipped one), or None."""
    import json

    from edgectl.models.cache import MANIFEST_NAME

    for name, key in ((MANIFEST_NAME, "tokenizer_cost"), (TOKENIZER_COST_JSON, None)):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        record = data.get(key) if key and isinstance(data, dict) else data
        value = record.get("bytes") if isinstance(record, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def inspect_model(path: Path | str, name: str | None = None, *, require_tokenizer: bool = True) -> ModelFacts:
    """As :func:`_inspect_model`, with the tokenizer's measured cost where the directory records it."""
    import dataclasses

    facts = _inspect_model(path, name, require_tokenizer=require_tokenizer)
    return dataclasses.replace(facts, tokenizer_bytes=tokenizer_cost(Path(facts.path)))


def _inspect_model(path: Path | str, name: str | None = None, *, require_tokenizer: bool = True) -> ModelFacts:
    """Facts about the HF model directory ``path``, without loading any tensor.

    ``name`` is how the user called it (a catalog name); default: the directory's name.
    ``require_tokenizer=False`` is for planning from a catalog entry's shipped configuration,
    before the model (and its tokenizer) is downloaded.
    Raises :class:`EdgectlError` with one line for anything vLLM could not serve.
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise EdgectlError(
            f"{path} {what}: give a Hugging Face model directory (config.json, *.safetensors, tokenizer) "
            "or a catalog name from `edgectl models list`"
        )
    path = path.resolve()
    if (path / DIRECT_GGUF).is_file():
        return _direct_gguf_facts(path, name, require_tokenizer)
    config = _text_config(read_config(path))
    arch = _architecture(path, config)
    unknown: list[str] = []

    num_layers = _int_field(path, config, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int_field(path, config, "hidden_size", "n_embd", "d_model")
    heads = _int_field(path, config, "num_attention_heads", "n_head")
    kv_heads = _int_field(path, config, "num_key_value_heads", "num_kv_heads", "multi_query_group_num",
                          required=False) or heads
    head_dim = _int_field(path, config, "head_dim", required=False) or hidden // heads
    vocab = _int_field(path, config, "vocab_size", "padded_vocab_size")
    intermediate = _int_field(path, config, "intermediate_size", "ffn_hidden_size", "n_inner", required=False)
    max_pos = _int_field(path, config, "max_position_embeddings", "n_positions", "max_sequence_length",
                         "seq_length", required=False)
    assert num_layers and hidden and heads and vocab  # required=True raised otherwise
    for field_name, value in (("intermediate_size", intermediate), ("max_position_embeddings", max_pos)):
        if value is None:
            unknown.append(field_name)

    layer_types, window = _layer_types(path, config, num_layers)
    rope_theta, rope_scaling = _rope(config)
    if rope_theta is None:
        unknown.append("rope_theta")
    dtype = config.get("dtype") or config.get("torch_dtype")
    if not isinstance(dtype, str):
        dtype = None

    if require_tokenizer and not _has_tokenizer(path):
        raise EdgectlError(
            f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}, *.tiktoken); vLLM needs one to "
            "serve text: copy the model's tokenizer files next to config.json"
        )

    tensors = read_model_tensors(path)
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    tied = config.get("tie_word_embeddings")
    if tied is None:
        # Absent: the weights tell (a tied model stores no lm_head); else the default of
        # transformers' Llama/Mistral/Qwen configuration classes, which is False.
        tied = not any(_kind(t.name) == "lm_head" for t in tensors) if tensors else False
    if not isinstance(tied, bool):
        raise _bad_config(path, f"tie_word_embeddings is {tied!r}, expected true or false")
    shape = _Shape(num_layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied)
    layout = _config_tensors(config, shape)
    if tensors:
        config_linear = None
        if layout is not None:
            config_linear = {n[: -len(".weight")]: s for n, s in layout if n.endswith(".weight") and len(s) == 2}
        weights = _weights_from_tensors(tensors, tied, model_type, config_linear)
        source = "safetensors"
    elif layout is not None:
        weights = _weights_from_config(path, layout, dtype, tied, model_type)
        source = "config"
    else:
        raise EdgectlError(
            f"{path}: no *.safetensors weights, and edgectl cannot size a {model_type!r} model from "
            f"config.json alone (it can for {', '.join(sorted(CONFIG_LAYOUTS))}); add the safetensors files"
        )
    if dtype is None:
        dtype = weights.weights_dtype
        unknown.append("dtype")

    return ModelFacts(
        name=name or path.name,
        path=str(path),
        architecture=arch,
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        max_position_embeddings=max_pos,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        sliding_window=window,
        layer_types=layer_types,
        dtype=dtype,
        weights_dtype=weights.weights_dtype,
        param_bytes=weights.param_bytes,
        param_source=source,
        num_params=weights.num_params,
        linear_layers=weights.linear_layers,
        quantization_config=_quantization_config(path, config),
        tokenizer=True if require_tokenizer else _has_tokenizer(path),  # checked above when required
        chat_template=_has_chat_template(path),
        unknown=tuple(unknown + weights.unknown),
    )
