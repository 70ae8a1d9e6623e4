"""The method's name, and the attribute names a quantized layer carries (read back by
``service/readback.py`` and the tests)."""

NAME = "cpu_int4"

W_ATTR = "int4_weight"  # torch: uint8 [N, K/2] packed for this ISA; edgectl: uint8 [tiles, blocks, record]
SZ_ATTR = "int4_scales_zeros"  # torch: [K/g, N, 2], activation dtype
INFO_ATTR = "edgectl_int4"  # dict: format, kernel, group_size, reason, role
LAYOUT_ATTR = "int4_row_slots"  # torch's tied embedding only: the learned PackedLayout.perm_table
# kernel vllm (w4a16-vllm): W_ATTR is int32 [N/16, 2K] in cpu_gemm_wna16's layout
S_ATTR = "int4_scales"  # [K/g, N], activation dtype
Z_ATTR = "int4_zeros"  # [K/g, N], float32 (the zero term is applied as a small GEMM)
