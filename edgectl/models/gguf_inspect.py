"""What a GGUF file holds, as :class:`~edgectl.models.facts.ModelFacts`, without loading a tensor.

``inspect_gguf(path) -> ModelFacts``: the shape from the ``<architecture>.*`` metadata keys
(ggml's ``docs/gguf.md``, "Standardized key-value pairs"), the weight bytes from each tensor's
ggml type (so a Q4_1 file is sized as Q4_1, not as the bf16 it would become), the linear layers
under the names vLLM's model classes give them, and the tokenizer and chat template from the
``tokenizer.*`` keys. Refused with one line each: a damaged or truncated file
(:mod:`edgectl.contract.gguf_header`), an architecture edgectl does not map to a vLLM model class,
tensor types outside what edgectl's kernels take (:data:`edgectl.contract.gguf_types.SERVED_TYPES`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from edgectl.contract.gguf_header import GGUFHeader, read_gguf
from edgectl.contract.gguf_names import LINEAR_NAMES
from edgectl.contract.gguf_types import SERVED_TYPES, layer_bits
from edgectl.models import architectures
from edgectl.models.facts import LinearLayer, ModelFacts, ParamBytes, natural_key
from edgectl.models.gguf_metadata import (
    ARCHITECTURES,
    bad,
    layer_types,
    positive,
    vocab_size,
)

# The layers vLLM merges (its packed_modules_mapping: qkv_proj, gate_up_proj).
_MERGED = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "ffn_gate": "gate_up", "ffn_up": "gate_up"}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def inspect_gguf(path: Path | str, name: str | None = None) -> ModelFacts:
    """Facts about the GGUF file ``path``; raises :class:`EdgectlError` with one line for anything
    edgectl could not serve from it."""
    path = Path(path).expanduser().resolve()
    return facts_from_header(read_gguf(path), name or path.stem)


def facts_from_header(header: GGUFHeader, name: str) -> ModelFacts:
    """:func:`inspect_gguf` of a header already read (or shipped: ``gguf_header.header_from_json``)."""
    arch, vllm_class, model_type = _architecture(header)
    types = _kernel_types(header)
    num_layers = positive(header, "block_count")
    hidden = positive(header, "embedding_length")
    heads = positive(header, "attention.head_count")
    assert num_layers and hidden and heads  # required=True raised otherwise
    kv_heads = positive(header, "attention.head_count_kv", required=False) or heads
    head_dim = positive(header, "attention.key_length", required=False) or hidden // heads
    window = positive(header, "attention.sliding_window", required=False)
    theta, scaling = _rope(header)
    linear, param_bytes, weights_dtype = _weights(header)
    template = header.metadata.get("tokenizer.chat_template")
    vocab = vocab_size(header)
    return ModelFacts(
        name=name,
        path=str(header.path),
        architecture=vllm_class,
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden,
        intermediate_size=positive(header, "feed_forward_length", required=False),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab or 0,
        tie_word_embeddings=param_bytes.lm_head == 0,
        max_position_embeddings=positive(header, "context_length", required=False),
        rope_theta=theta,
        rope_scaling=scaling,
        sliding_window=window,
        layer_types=layer_types(arch, num_layers, window),
        dtype="bfloat16",  # what vLLM's CPU backend computes a quantized model in
        weights_dtype=weights_dtype,
        param_bytes=param_bytes,
        param_source="gguf",
        num_params=sum(t.numel for t in header.tensors),
        linear_layers=linear,
        quantization_config={"quant_method": "gguf", "gguf_version": header.version,
                             "tensor_types": dict(sorted(types.items()))},
        tokenizer=isinstance(header.metadata.get("tokenizer.ggml.model"), str) and vocab is not None,
        chat_template=isinstance(template, str) and bool(template.strip()),
    )


def _architecture(header: GGUFHeader) -> tuple[str, str, str]:
    """The GGUF's architecture, vLLM's model class for it and its Hugging Face model_type."""
    arch = header.architecture
    if arch is None:
        raise bad(header, "no general.architecture in its metadata, so the model class is unknown")
    if arch not in ARCHITECTURES:
        raise bad(header, f"GGUF architecture {arch!r} is not one edgectl maps to a vLLM model class "
                          f"(it maps {', '.join(sorted(ARCHITECTURES))})")
    vllm_class, model_type = ARCHITECTURES[arch]
    if not architectures.is_supported(vllm_class):
        raise bad(header, f"{vllm_class} is not served by vLLM {architectures.VLLM_VERSION}")
    return arch, vllm_class, model_type


def _kernel_types(header: GGUFHeader) -> Counter[str]:
    """Tensors per ggml type, refused when a type is not one edgectl's kernels take."""
    types = Counter(t.type.name for t in header.tensors)
    unusable = {kind: n for kind, n in types.items() if kind not in SERVED_TYPES}
    if unusable:
        kinds = ", ".join(f"{n} × {kind}" for kind, n in sorted(unusable.items()))
        raise bad(header, f"tensor types edgectl's kernels do not take: {kinds} (they take "
                          f"{', '.join(sorted(SERVED_TYPES))}); use a Q4_0, Q4_1, Q4_K_M or Q8_0 file of this model")
    return types


def _rope(header: GGUFHeader) -> tuple[float | None, dict[str, Any] | None]:
    """RoPE's base and scaling (None: not scaled)."""
    theta = header.arch_key("rope.freq_base")
    scaling_type = header.arch_key("rope.scaling.type")
    scaling = None
    if isinstance(scaling_type, str) and scaling_type != "none":
        scaling = {"rope_type": scaling_type, "factor": header.arch_key("rope.scaling.factor")}
    return (float(theta) if isinstance(theta, (int, float)) else None), scaling


def _weights(header: GGUFHeader) -> tuple[tuple[LinearLayer, ...], ParamBytes, str]:
    """The linear layers under vLLM's names (in a directory's order), the bytes of the stored weights
    by the planner's split, and the dominant type of the linear weights."""
    linear_bytes = embedding = lm_head = other = 0
    kinds: Counter[str] = Counter()
    found: list[tuple[str, str, str, int, int]] = []  # block, llama.cpp name, type, rows, columns
    for t in header.tensors:
        m = _BLOCK.match(t.name)
        if m and m.group(2) in LINEAR_NAMES and len(t.dims) == 2:
            found.append((m.group(1), m.group(2), t.type.name, t.dims[1], t.dims[0]))
            linear_bytes += t.nbytes
            kinds[t.type.name] += t.nbytes
        elif t.name == "token_embd.weight":
            embedding += t.nbytes
        elif t.name == "output.weight":
            lm_head += t.nbytes
        else:
            other += t.nbytes
    # vLLM merges q/k/v and gate/up into one layer: its block follows all its parts' types (layer_bits,
    # which the runtime installs it by).
    group_types: dict[tuple[str, str], list[str]] = {}
    for block, base, kind, _, _ in found:
        group_types.setdefault((block, _MERGED.get(base, base)), []).append(kind)
    group_bits = {key: layer_bits(types, 4) for key, types in group_types.items()}  # floats take the plan's 4
    linear = [LinearLayer(f"model.layers.{block}.{LINEAR_NAMES[base]}", out_features=rows, in_features=cols,
                          gguf_bits=group_bits[(block, _MERGED.get(base, base))])
              for block, base, kind, rows, cols in found]
    if not linear:
        raise bad(header, "no linear layers under llama.cpp's names (blk.N.attn_q.weight, ...): "
                          "not a decoder edgectl can serve")
    if embedding == 0:
        raise bad(header, "no token_embd.weight tensor: the file has no embedding table")
    return (tuple(sorted(linear, key=lambda layer: natural_key(layer.name))),  # as for a directory
            ParamBytes(linear=linear_bytes, embedding=embedding, lm_head=lm_head, other=other),
            kinds.most_common(1)[0][0])
