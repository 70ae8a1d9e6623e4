"""The int4 layout rules shared by the planner and the runtime (pure Python, no torch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgectl.contract.int4_layout import (
    ALLOWED_GROUP_SIZES,
    choose_group_size,
    layer_bytes,
    packed_bytes,
    quantizable,
    quantizable_partitions,
)


@pytest.mark.parametrize(
    ("k", "preferred", "expected"),
    [
        (2048, 128, 128),  # preferred divides K
        (576, 128, 64),  # SmolLM2 hidden: 9 x 64, not a multiple of 128
        (1536, 128, 128),  # SmolLM2 down_proj
        (576, 32, 32),
        (576, 256, 64),  # largest allowed size below the preferred one that divides K
        (160, 128, 32),  # 5 x 32
        (96, 64, 32),
        (512, 32, 32),  # a smaller preferred size is kept even if larger ones divide K
        (48, 128, None),  # no allowed size divides 48
        (100, 128, None),
        (0, 128, None),
    ],
)
def test_choose_group_size(k, preferred, expected):
    assert choose_group_size(k, preferred) == expected


def test_choose_group_size_is_the_largest_allowed_divisor_up_to_the_preferred_size():
    # The allowed sizes are powers of two, so a larger one dividing K implies the smaller ones
    # do: the "larger sizes" fallback of the rule never changes the answer for them.
    for k in range(32, 4097, 32):
        for preferred in ALLOWED_GROUP_SIZES:
            g = choose_group_size(k, preferred)
            assert g is not None and k % g == 0 and g <= preferred
            assert not any(k % other == 0 for other in ALLOWED_GROUP_SIZES if g < other <= preferred)


@pytest.mark.parametrize("preferred", [0, 16, 100, 512])
def test_unsupported_preferred_group_size_is_an_error(preferred):
    with pytest.raises(ValueError, match="group size"):
        choose_group_size(256, preferred)


def test_quantizable_refuses_rows_not_a_multiple_of_16():
    ok, reason = quantizable(40, 256, 128)
    assert not ok and "multiple of 16" in reason
    ok, _ = quantizable(48, 256, 128)
    assert ok


def test_quantizable_refuses_k_without_a_group():
    ok, reason = quantizable(64, 48, 128)
    assert not ok and "not a multiple of any int4 group size" in reason


def test_quantizable_says_which_group_it_took():
    ok, reason = quantizable(960, 576, 128)
    assert ok and "group 64" in reason and "576" in reason
    ok, reason = quantizable(576, 1536, 128)
    assert ok and reason == "int4, group 128"


def test_fused_layer_is_int4_only_if_every_part_is():
    assert quantizable_partitions([576, 192, 192], 576, 128)[0]
    ok, reason = quantizable_partitions([64, 40, 40], 256, 128)  # 144 = 9 x 16, but k/v are 40
    assert not ok and "40" in reason


def test_packed_bytes():
    # uint8 [N, K/2] + bf16 [K/g, N, 2]
    assert packed_bytes(960, 576, 64) == 960 * 288 + 9 * 960 * 2 * 2
    assert packed_bytes(576, 1536, 128, scale_dtype_bytes=4) == 576 * 768 + 12 * 576 * 2 * 4
    with pytest.raises(ValueError):
        packed_bytes(960, 576, 128)
    with pytest.raises(ValueError):
        packed_bytes(960, 576, 16)


def test_layer_bytes_dense_when_refused():
    assert layer_bytes(40, 256, 128) == 40 * 256 * 2
    assert layer_bytes(960, 576, 128) == packed_bytes(960, 576, 64)


def test_smollm2_int4_weights_are_about_a_quarter_plus_scales():
    # 30 layers: qkv [960, 576], o [576, 576], gate_up as two [1536, 576], down [576, 1536]
    shapes = [(960, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30
    dense = sum(n * k * 2 for n, k in shapes)
    g32 = sum(layer_bytes(n, k, 32) for n, k in shapes)
    g128 = sum(layer_bytes(n, k, 128) for n, k in shapes)
    assert g128 < g32 < dense
    assert abs(g32 / dense - (0.25 + 0.0625)) < 1e-9  # 4 bits + 2x16-bit per 32 weights


def test_module_imports_without_torch():
    code = "import sys, edgectl.contract.int4_layout; assert 'torch' not in sys.modules and 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
