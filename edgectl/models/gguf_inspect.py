"""What a GGUF file holds, as :class:`~edgectl.models.inspect.ModelFacts`, without loading a tensor.

``inspect_gguf(path) -> ModelFacts``: the shape from the ``<architecture>.*`` metadata keys
(ggml's ``docs/gguf.md``, "Standardized key-value pairs"), the weight bytes from each tensor's
ggml type (so a Q4_1 file is sized as Q4_1, not as the bf16 it would become), the linear layers
under the names vLLM's model classes give them, and the tokenizer and chat template from the
``tokenizer.*`` keys. Refused with one line each: a damaged or truncated file
(:mod:`edgectl.contract.gguf_header`), an architecture edgectl does not map to a vLLM model class,
tensor types outside what edgectl's kernels take (:data:`KERNEL_TYPES`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from edgectl.errors import EdgectlError
from edgectl.models import architectures
from edgectl.contract.gguf_header import GGUFHeader, SkippedArray, read_gguf
from edgectl.models.inspect import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    LinearLayer,
    ModelFacts,
    ParamBytes,
    _natural_key,
)

# GGUF ``general.architecture`` -> (vLLM's model class, Hugging Face model_type). The GGUF names
# are llama.cpp's (``src/llama-arch.cpp``, LLM_ARCH_NAMES); Mistral and SmolLM2 files say "llama".
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}

# Tensor types a served GGUF may hold: the blocks edgectl's kernels run as they are (Q4_0 and
# Q4_1 are its W4 block, Q8_0 and Q5_0 its W8 block: docs/kernels.md "Layout"), the K-quants and
# Q5_1 that convert block by block to the nearest of those (runtime/edgectl_runtime/formats/
# ggml.py), and plain floats (norms, and small or unquantized files). Q4_K_M files use Q5_0 where
# a row is not a multiple of 256 values (Gemma-3-270M's 640).
KERNEL_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F32", "F16", "BF16"})

# llama.cpp tensor names (per block ``blk.N.``) of the linear layers -> vLLM's module names.
_LINEAR = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# The layers vLLM merges (its packed_modules_mapping: qkv_proj, gate_up_proj).
_MERGED = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "ffn_gate": "gate_up", "ffn_up": "gate_up"}
# The bits of the edgectl block each type becomes as it is (runtime/edgectl_runtime/formats/ggml.py
# NATIVE_BITS); floats take the plan's 4.
_NATIVE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q8_0": 8, "Q5_0": 8, "Q5_1": 8, "Q5_K": 8, "Q6_K": 8}
_BLOCK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.weight$")


def _bad(path: Path, problem: str) -> EdgectlError:
    return EdgectlError(f"{path}: {problem}")


def _positive(header: GGUFHeader, key: str, *, required: bool = True) -> int | None:
    value = header.arch_key(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        found = "missing" if value is None else f"{value!r}"
        raise _bad(header.path, f"metadata {header.architecture}.{key} is {found}, expected a positive "
                                "integer; the file was not written by a complete converter")
    return value


def _layer_types(arch: str, num_layers: int, window: int | None) -> tuple[str, ...]:
    if window is None:
        return (FULL_ATTENTION,) * num_layers
    if arch == "gemma3":
        # transformers' Gemma3TextConfig: five sliding layers, then one full (sliding_window_pattern 6)
        return tuple(FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(num_layers))
    return (SLIDING_ATTENTION,) * num_layers


def _vocab_size(header: GGUFHeader) -> int | None:
    size = header.arch_key("vocab_size")
    if isinstance(size, int) and size > 0:
        return size
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        return tokens.length
    if isinstance(tokens, list):
        return len(tokens)
    return None


def inspect_gguf(path: Path | str, name: str | None = None) -> ModelFacts:
    """Facts about the GGUF file ``path``; raises :class:`EdgectlError` with one line for anything
    edgectl could not serve from it."""
    path = Path(path).expanduser().resolve()
    return facts_from_header(read_gguf(path), name or path.stem)


def facts_from_header(header: GGUFHeader, name: str) -> ModelFacts:
    """:func:`inspect_gguf` of a header already read (or shipped: ``gguf_header.header_from_json``)."""
    path = header.path
    arch = header.architecture
    if arch is None:
        raise _bad(path, "no general.architecture in its metadata, so the model class is unknown")
    if arch not in ARCHITECTURES:
        raise _bad(path, f"GGUF architecture {arch!r} is not one edgectl maps to a vLLM model class "
                         f"(it maps {', '.join(sorted(ARCHITECTURES))})")
    vllm_class, model_type = ARCHITECTURES[arch]
    if not architectures.is_supported(vllm_class):
        raise _bad(path, f"{vllm_class} is not served by vLLM {architectures.VLLM_VERSION}")

    types = Counter(t.type.name for t in header.tensors)
    unusable = {kind: n for kind, n in types.items() if kind not in KERNEL_TYPES}
    if unusable:
        kinds = ", ".join(f"{n} × {kind}" for kind, n in sorted(unusable.items()))
        raise _bad(path, f"tensor types edgectl's kernels do not take: {kinds} (they take "
                         f"{', '.join(sorted(KERNEL_TYPES))}); use a Q4_0, Q4_1, Q4_K_M or Q8_0 file of this model")

    num_layers = _positive(header, "block_count")
    hidden = _positive(header, "embedding_length")
    heads = _positive(header, "attention.head_count")
    kv_heads = _positive(header, "attention.head_count_kv", required=False) or heads
    head_dim = _positive(header, "attention.key_length", required=False) or hidden // heads
    window = _positive(header, "attention.sliding_window", required=False)
    theta = header.arch_key("rope.freq_base")
    scaling_type = header.arch_key("rope.scaling.type")
    scaling = None
    if isinstance(scaling_type, str) and scaling_type != "none":
        scaling = {"rope_type": scaling_type, "factor": header.arch_key("rope.scaling.factor")}

    linear: list[LinearLayer] = []
    linear_bytes = embedding = lm_head = other = 0
    kinds: Counter[str] = Counter()
    found: list[tuple[str, str, str, int, int]] = []  # block, llama.cpp name, type, rows, columns
    for t in header.tensors:
        m = _BLOCK.match(t.name)
        if m and m.group(2) in _LINEAR and len(t.dims) == 2:
            found.append((m.group(1), m.group(2), t.type.name, t.dims[1], t.dims[0]))
            linear_bytes += t.nbytes
            kinds[t.type.name] += t.nbytes
        elif t.name == "token_embd.weight":
            embedding += t.nbytes
        elif t.name == "output.weight":
            lm_head += t.nbytes
        else:
            other += t.nbytes
    # vLLM merges q/k/v and gate/up into one layer: it gets the widest block of its parts.
    group_bits: dict[tuple[str, str], int] = {}
    for block, base, kind, _, _ in found:
        key = (block, _MERGED.get(base, base))
        group_bits[key] = max(group_bits.get(key, 4), _NATIVE_BITS.get(kind, 4))
    for block, base, kind, rows, cols in found:
        linear.append(LinearLayer(f"model.layers.{block}.{_LINEAR[base]}", out_features=rows, in_features=cols,
                                  gguf_bits=group_bits[(block, _MERGED.get(base, base))]))
    if not linear:
        raise _bad(path, "no linear layers under llama.cpp's names (blk.N.attn_q.weight, ...): "
                         "not a decoder edgectl can serve")
    if embedding == 0:
        raise _bad(path, "no token_embd.weight tensor: the file has no embedding table")
    template = header.metadata.get("tokenizer.chat_template")
    vocab = _vocab_size(header)
    return ModelFacts(
        name=name,
        path=str(path),
        architecture=vllm_class,
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=hidden,
        intermediate_size=_positive(header, "feed_forward_length", required=False),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab or 0,
        tie_word_embeddings=lm_head == 0,
        max_position_embeddings=_positive(header, "context_length", required=False),
        rope_theta=float(theta) if isinstance(theta, (int, float)) else None,
        rope_scaling=scaling,
        sliding_window=window,
        layer_types=_layer_types(arch, num_layers, window),
        dtype="bfloat16",  # what vLLM's CPU backend computes a quantized model in
        weights_dtype=kinds.most_common(1)[0][0],
        param_bytes=ParamBytes(linear=linear_bytes, embedding=embedding, lm_head=lm_head, other=other),
        param_source="gguf",
        num_params=sum(t.numel for t in header.tensors),
        linear_layers=tuple(sorted(linear, key=lambda layer: _natural_key(layer.name))),  # as for a directory
        quantization_config={"quant_method": "gguf", "gguf_version": header.version,
                             "tensor_types": dict(sorted(types.items()))},
        tokenizer=isinstance(header.metadata.get("tokenizer.ggml.model"), str) and vocab is not None,
        chat_template=isinstance(template, str) and bool(template.strip()),
    )


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts like a GGUF file (or is named like one)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
