"""A model's shape from a GGUF's metadata keys (ggml's ``docs/gguf.md``, "Standardized key-value
pairs"): read once here for the facts the planner sizes from (:mod:`edgectl.models.gguf_inspect`)
and for the config.json a GGUF is served with (:mod:`edgectl.models.gguf_hf`)."""

from __future__ import annotations

from edgectl.contract.gguf_header import GGUFHeader, SkippedArray
from edgectl.errors import EdgectlError
from edgectl.models.facts import FULL_ATTENTION, SLIDING_ATTENTION

# GGUF ``general.architecture`` -> (vLLM's model class, Hugging Face model_type). The GGUF names
# are llama.cpp's (``src/llama-arch.cpp``, LLM_ARCH_NAMES); Mistral and SmolLM2 files say "llama".
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}


def bad(header: GGUFHeader, problem: str) -> EdgectlError:
    """The one-line refusal of the file ``header`` was read from."""
    return EdgectlError(f"{header.path}: {problem}")


def positive(header: GGUFHeader, key: str, *, required: bool = True) -> int | None:
    """``<architecture>.<key>`` as a positive integer; None when absent and not ``required``."""
    value = header.arch_key(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        found = "missing" if value is None else f"{value!r}"
        raise bad(header, f"metadata {header.architecture}.{key} is {found}, expected a positive "
                          "integer; the file was not written by a complete converter")
    return value


def layer_types(arch: str, num_layers: int, window: int | None) -> tuple[str, ...]:
    """One attention kind per layer."""
    if window is None:
        return (FULL_ATTENTION,) * num_layers
    if arch == "gemma3":
        # transformers' Gemma3TextConfig: five sliding layers, then one full (sliding_window_pattern 6)
        return tuple(FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(num_layers))
    return (SLIDING_ATTENTION,) * num_layers


def vocab_size(header: GGUFHeader) -> int | None:
    """``<architecture>.vocab_size``, else the length of the tokenizer's token list; None when neither is there."""
    size = header.arch_key("vocab_size")
    if isinstance(size, int) and size > 0:
        return size
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        return tokens.length
    if isinstance(tokens, list):
        return len(tokens)
    return None
