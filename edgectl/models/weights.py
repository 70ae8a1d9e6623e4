"""The bytes of a model's weights, split the way the planner prices them, and its linear layers: from
the safetensors headers, or computed from ``config.json`` for the layouts edgectl knows."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.models.config_json import bad_config
from edgectl.models.facts import LinearLayer, ParamBytes, natural_key
from edgectl.models.safetensors_header import DTYPE_BITS, TORCH_DTYPE_NAMES, TensorInfo

# Bytes per element of the dtypes a config.json names (for sizing a model from its config alone).
DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}

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
class ModelShape:
    """The dimensions :func:`config_tensors` lays a model's tensors out from (read from config.json)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


def config_tensors(config: dict[str, Any], s: ModelShape, tied: bool) -> list[tuple[str, tuple[int, ...]]] | None:
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
    if not tied:
        tensors.append(("lm_head.weight", (s.vocab_size, h)))
    return tensors


def tensor_kind(name: str) -> str:
    """embedding / lm_head / linear-or-other, from the tensor's name."""
    if name.startswith("lm_head.") or ".lm_head." in name:
        return "lm_head"
    module = name.rsplit(".", 1)[0]
    leaf = module.rsplit(".", 1)[-1]
    if "embed" in leaf or leaf in ("wte", "wpe", "word_embeddings", "tok_embeddings"):
        return "embedding"
    return "body"


@dataclass
class Weights:
    """What the weights tell :class:`~edgectl.models.facts.ModelFacts`."""

    param_bytes: ParamBytes
    num_params: int | None
    linear_layers: tuple[LinearLayer, ...]
    weights_dtype: str | None
    unknown: list[str]


def weights_from_tensors(
    tensors: list[TensorInfo],
    tied: bool,
    model_type: str | None,
    config_linear: dict[str, tuple[int, int]] | None,
) -> Weights:
    by_kind = Counter[str]()
    linear: list[LinearLayer] = []
    linear_dtype_bytes = Counter[str]()
    quantized_modules: set[str] = set()
    numel = 0
    for t in tensors:
        kind = tensor_kind(t.name)
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
    linear.sort(key=lambda layer: natural_key(layer.name))
    dominant = linear_dtype_bytes.most_common(1)
    return Weights(
        param_bytes=ParamBytes(linear=by_kind["linear"], embedding=by_kind["embedding"],
                               lm_head=by_kind["lm_head"], other=by_kind["other"]),
        num_params=None if quantized_modules else numel,
        linear_layers=tuple(linear),
        weights_dtype=TORCH_DTYPE_NAMES.get(dominant[0][0], dominant[0][0]) if dominant else None,
        unknown=unknown,
    )


def weights_from_config(path: Path, layout: list[tuple[str, tuple[int, ...]]], dtype: str | None,
                        tied: bool, model_type: str | None) -> Weights:
    if dtype not in DTYPE_BYTES:
        raise bad_config(path, f"names dtype {dtype!r}, and without *.safetensors weights edgectl cannot "
                               "size the model otherwise; add the weights or set \"dtype\": \"bfloat16\"")
    fake_dtype = {2: "BF16" if dtype == "bfloat16" else "F16", 4: "F32", 8: "F64"}[DTYPE_BYTES[dtype]]
    tensors = [
        TensorInfo(name=name, dtype=fake_dtype, shape=shape,
                   nbytes=DTYPE_BITS[fake_dtype] // 8 * _prod(shape), file="config.json")
        for name, shape in layout
    ]
    weights = weights_from_tensors(tensors, tied, model_type, None)
    weights.weights_dtype = dtype
    return weights


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
