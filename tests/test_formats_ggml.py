"""GGUF's block types read in PyTorch (runtime/edgectl_runtime/formats/ggml.py), checked against
the gguf package's NumPy dequantizers (gguf-py, llama.cpp's own Python reading of the same
blocks), and their conversion into edgectl's W4 / W8 blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from edgectl.contract import gguf_types  # noqa: E402
from edgectl_runtime.formats import blocks, ggml  # noqa: E402

QUANT = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Byte offsets of each block's fp16 fields, set to sane values (random bytes make NaN/inf).
FP16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
               "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_raw(type_name: str, rows: int, k: int, seed: int) -> torch.Tensor:
    """Random blocks of ``type_name``: every bit random except the fp16 scales (0.5e-3..2e-2)."""
    g = np.random.default_rng(seed)
    per, nbytes = gguf_types.BLOCK_SIZES[type_name]
    raw = g.integers(0, 256, size=(rows, k // per, nbytes), dtype=np.uint8)
    for off in FP16_FIELDS[type_name]:
        vals = g.uniform(5e-4, 2e-2, size=(rows, k // per)).astype(np.float16)
        raw[:, :, off:off + 2] = vals.view(np.uint8).reshape(rows, k // per, 2)
    return torch.from_numpy(raw.reshape(rows, -1).copy())


@pytest.mark.parametrize("type_name", QUANT)
def test_dequantize_matches_gguf_py(type_name: str) -> None:
    raw = random_raw(type_name, 5, 512, seed=len(type_name) * 7 + ord(type_name[1]))
    ours = ggml.dequantize(raw, type_name, 512)
    theirs = torch.from_numpy(quants.dequantize(raw.numpy(), T[type_name]).astype(np.float32))
    assert ours.shape == theirs.shape == (5, 512)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("type_name,dtype", [("F32", np.float32), ("F16", np.float16)])
def test_float_types(type_name: str, dtype) -> None:
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(dtype)
    raw = torch.from_numpy(x.view(np.uint8).copy())
    torch.testing.assert_close(ggml.dequantize(raw, type_name, 64), torch.from_numpy(x.astype(np.float32)))


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_four_bit_blocks_become_w4_exactly(type_name: str) -> None:
    raw = random_raw(type_name, 7, 256, seed=3)
    q, d, m = ggml.to_w4(raw, type_name, 256)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    # Bit for bit: the W4 values equal the GGUF values (w = d q + m in fp32 either way).
    assert torch.equal(blocks.dequantize_w4(q, d, m, 256), ggml.dequantize(raw, type_name, 256))


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0"])
def test_symmetric_blocks_become_w8_exactly(type_name: str) -> None:
    raw = random_raw(type_name, 7, 256, seed=4)
    q, d = ggml.to_w8(raw, type_name, 256)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert torch.equal(blocks.dequantize_w8(q, d, 256), ggml.dequantize(raw, type_name, 256))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q4_0"])
def test_q5_0_and_q4_0_blocks_become_w5_exactly(type_name: str) -> None:
    raw = random_raw(type_name, 7, 256, seed=8)
    q, d = ggml.to_w5(raw, type_name, 256)
    assert q.dtype == torch.uint8 and int(q.max()) <= 31
    if type_name == "Q4_0":
        assert 8 <= int(q.min()) and int(q.max()) <= 23  # Q4_0's q + 8
    assert torch.equal(blocks.dequantize_w5(q, d, 256), ggml.dequantize(raw, type_name, 256))
    # and through the packed record, bit for bit
    packed_q, packed_d = blocks.unpack_w5(blocks.pack_w5(q, d), 7)
    assert torch.equal(packed_q, q) and torch.equal(packed_d, d)


def test_only_blocks_without_a_minimum_become_w5() -> None:
    with pytest.raises(ValueError, match="not W5 blocks as it is"):
        ggml.to_w5(random_raw("Q5_1", 2, 64, seed=9), "Q5_1", 64)


def test_a_layers_bits_follow_all_its_parts() -> None:
    """vLLM merges q/k/v and gate/up: the planner sizes and the runtime installs the layer by one rule."""
    bits = gguf_types.layer_bits
    assert bits(["Q5_0", "Q5_0", "Q5_0"], 4) == 5
    assert bits(["Q5_0", "Q4_0"], 4) == 5  # Q4_0's blocks are W5 blocks too
    assert bits(["Q5_0", "Q8_0"], 4) == 8
    assert bits(["Q5_0", "Q4_K"], 4) == 8  # a minimum: no W5 block holds it
    assert bits(["Q5_0", "F32"], 4) == 8  # a float beside it: quantized to W8, as before W5
    assert bits(["Q4_K", "Q4_0"], 4) == 4
    assert bits(["Q6_K"], 4) == 8
    assert bits(["F16", "BF16"], 8) == 8 and bits(["F16"], 4) == 4


def test_q4_k_becomes_w4_up_to_fp16_scales() -> None:
    raw = random_raw("Q4_K", 6, 512, seed=5)
    want = ggml.dequantize(raw, "Q4_K", 512)
    q, d, m = ggml.to_w4(raw, "Q4_K", 512)
    got = blocks.dequantize_w4(q, d, m, 512)
    # d sc and dmin mn rounded once to fp16: at most 2^-11 of each term, per value.
    scale = want.abs().amax()
    assert (got - want).abs().max() <= scale * 2.0 ** -10


@pytest.mark.parametrize("type_name", ["Q6_K", "Q5_K", "Q5_1"])
def test_other_types_requantize_to_w8_within_half_a_step(type_name: str) -> None:
    raw = random_raw(type_name, 4, 512, seed=6)
    want = ggml.dequantize(raw, type_name, 512)
    q, d = ggml.to_w8(raw, type_name, 512)
    got = blocks.dequantize_w8(q, d, 512)
    step = d.to(torch.float32).repeat_interleave(32, dim=1)
    assert ((got - want).abs() <= step / 2 + 1e-6).all()


def test_conversion_names_the_loss() -> None:
    assert ggml.conversion("Q4_1", 4) == "Q4_1 as W4 (exact)"
    assert ggml.conversion("Q5_0", 5) == "Q5_0 as W5 (exact)"
    assert "rounded" in ggml.conversion("Q4_K", 4)
    assert "re-quantized" in ggml.conversion("Q6_K", 8)
    assert "re-quantized" in ggml.conversion("Q8_0", 4)


def test_wrong_row_bytes_refused() -> None:
    with pytest.raises(ValueError, match="expected uint8"):
        ggml.dequantize(torch.zeros((2, 19), dtype=torch.uint8), "Q4_1", 32)
    with pytest.raises(ValueError, match="multiple of 256"):
        ggml.row_bytes("Q4_K", 640)
    with pytest.raises(ValueError, match="not one edgectl reads"):
        ggml.dequantize(torch.zeros((2, 18), dtype=torch.uint8), "IQ2_XS", 32)
