"""ggml's tensor types as edgectl serves them, written once for both sides: which types a served GGUF
may hold, their block sizes (read from ggml's table, :data:`edgectl.contract.gguf_header.GGML_TYPES`),
and the bits of the edgectl block each becomes as it is. The control plane refuses a file by them
(``edgectl/models/gguf_inspect.py``) and sizes its layers; the runtime reads the blocks by them
(``runtime/edgectl_runtime/formats/ggml.py``).
"""

from __future__ import annotations

from edgectl.contract.gguf_header import GGML_TYPES_BY_NAME

FLOAT_TYPES = ("F32", "F16", "BF16")

# Tensor types a served GGUF may hold: the blocks edgectl's kernels run as they are (Q4_0 and
# Q4_1 are its W4 block, Q5_0 its W5 block, Q8_0 its W8 block: docs/kernels.md "Layout"), the K-quants and
# Q5_1 that convert block by block to the nearest of those (runtime/edgectl_runtime/formats/
# ggml.py), and plain floats (norms, and small or unquantized files). Q4_K_M files use Q5_0 where
# a row is not a multiple of 256 values (Gemma-3-270M's 640).
SERVED_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", *FLOAT_TYPES})

# type -> (values per block, bytes per block), for the served types.
BLOCK_SIZES: dict[str, tuple[int, int]] = {
    name: (GGML_TYPES_BY_NAME[name].block, GGML_TYPES_BY_NAME[name].block_bytes) for name in sorted(SERVED_TYPES)
}

# The values of a K-quant's super-block (ggml-common.h, QK_K).
SUPER_BLOCK = GGML_TYPES_BY_NAME["Q4_K"].block

# The bits of the edgectl block a type becomes without re-quantizing (absent: a float, which takes
# the plan's format).
NATIVE_BITS: dict[str, int] = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q8_0": 8, "Q5_0": 5, "Q5_1": 8, "Q5_K": 8, "Q6_K": 8}
# The types whose blocks are W5 blocks as they are: Q5_0 (w = d (q - 16)) and Q4_0 (w = d (q - 8), its
# q + 8 a 5-bit value with the same d). A W5 block has no minimum, so nothing else goes into one.
W5_TYPES = frozenset({"Q5_0", "Q4_0"})


def layer_bits(types: list[str] | tuple[str, ...], plan_bits: int) -> int:
    """The bits of the edgectl block a linear layer takes from the types of its GGUF tensors (vLLM merges
    q, k, v and gate, up into one layer): the widest of their native bits; 5 only where every part's
    blocks are W5 blocks as they are (Q5_0 beside Q4_K or a float takes 8, as before W5 existed); the
    plan's bits where every part is a float."""
    native = [NATIVE_BITS[t] for t in types if t in NATIVE_BITS]
    if not native:
        return plan_bits
    widest = max(native)
    if widest == 5 and not all(t in W5_TYPES for t in types):
        return 8
    return widest
