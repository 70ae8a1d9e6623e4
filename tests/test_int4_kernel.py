"""The int4 arithmetic and torch's CPU int4 kernel, without an engine.

- packed matmul == the dequantized reference, for every group size, odd shapes and M = 1, 3, 17, 64;
- packing in row blocks is byte-identical to packing the whole matrix;
- the learned packed layout returns exactly the rows that were packed, on this ISA and on the
  lower ones torch can be forced to (ATEN_CPU_CAPABILITY), so AVX2 is covered on an AVX-512 box;
- the quantizer reproduces Q4_1-style weights (``d * q + m``, groups of 32) exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from int4_helpers import runtime_env  # noqa: E402

from edgectl_runtime.formats.groups import (  # noqa: E402
    dequantize_int4,
    pack_nibbles,
    quantize_int4,
    unpack_nibbles,
)
from edgectl_runtime.kernels.ops import tinygemm, wna16  # noqa: E402

GROUPS = (32, 64, 128, 256)
MS = (1, 3, 17, 64)


def _case(n: int, k: int, g: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    q, s, z = quantize_int4(w, g, dtype)
    packed = tinygemm.kernel_pack(q)
    sz = tinygemm.scales_and_zeros(s, z, dtype)
    return q, s, z, packed, sz


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize(("n", "k_groups"), [(48, 2), (176, 3)])  # N % 64 != 0: tail blocks of 48 / 16 rows
@pytest.mark.parametrize("m", MS)
def test_packed_matmul_matches_dequantized_reference_bf16(g, n, k_groups, m):
    k = g * k_groups
    q, s, z, packed, sz = _case(n, k, g, torch.bfloat16)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    out = tinygemm.int4_matmul(x, packed, g, sz)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    ref = x.float() @ dequantize_int4(q, s, z).t()
    assert _rel(out, ref) < 1e-2  # bf16 accumulation and output rounding (measured ~2e-3)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("m", MS)
def test_packed_matmul_other_activation_dtypes(dtype, tol, m):
    q, s, z, packed, sz = _case(112, 192, 64, dtype)
    x = torch.randn(m, 192, generator=torch.Generator().manual_seed(7)).to(dtype)
    out = tinygemm.int4_matmul(x, packed, 64, sz)
    ref = x.float() @ dequantize_int4(q, s, z).t()
    assert _rel(out, ref) < tol


def test_matmul_accepts_3d_and_non_contiguous_activations():
    q, s, z, packed, sz = _case(64, 128, 32, torch.bfloat16)
    x = torch.randn(2, 5, 256).to(torch.bfloat16)[..., ::2]  # [2, 5, 128], not contiguous
    out = tinygemm.int4_matmul(x, packed, 32, sz)
    assert out.shape == (2, 5, 64)
    ref = x.float().reshape(10, 128) @ dequantize_int4(q, s, z).t()
    assert _rel(out.reshape(10, 64), ref) < 1e-2


def test_int4_error_against_the_original_weight_is_the_quantization_error():
    # Sanity of the whole chain: the int4 product is close to the bf16 product of the original
    # weight, with the error expected of 4 bits on Gaussian weights (facts §4: ~0.1).
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(256, 512, generator=gen)
    q, s, z = quantize_int4(w, 128, torch.bfloat16)
    x = torch.randn(8, 512, generator=gen).to(torch.bfloat16)
    out = tinygemm.int4_matmul(x, tinygemm.kernel_pack(q), 128, tinygemm.scales_and_zeros(s, z, torch.bfloat16))
    rel = _rel(out, x.float() @ w.t())
    assert 0.02 < rel < 0.2


@pytest.mark.parametrize("n", [16, 48, 176, 1072])
def test_blocked_pack_is_byte_identical_to_whole_pack(n):
    q = torch.randint(0, 16, (n, 96), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    for block in (64, 128, 256):
        assert torch.equal(tinygemm.kernel_pack(q, block_rows=block), whole)


def test_pack_block_must_be_a_multiple_of_64():
    with pytest.raises(ValueError, match="multiple of 64"):
        tinygemm.kernel_pack(torch.zeros(64, 32, dtype=torch.uint8), block_rows=32)


@pytest.mark.parametrize("n", [8, 40])
def test_the_op_itself_rejects_rows_not_a_multiple_of_16(n):
    # Why edgectl/contract/int4_layout.py refuses such layers (keeps them dense) instead of packing them.
    with pytest.raises(RuntimeError):
        torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.zeros(n, 64, dtype=torch.int32), 1)


@pytest.mark.parametrize(("n", "k"), [(16, 32), (48, 64), (176, 576), (1072, 96), (4096 + 48, 64)])
def test_learned_layout_returns_exactly_the_packed_rows(n, k):
    layout = tinygemm.packed_layout()
    q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n + k), dtype=torch.uint8)
    packed = tinygemm.kernel_pack(q)
    assert torch.equal(layout.gather_rows(packed, torch.arange(n)), q)
    some = torch.tensor([n - 1, 0, n // 2, max(0, n - 17)])
    assert torch.equal(layout.gather_rows(packed, some), q[some])


_LAYOUT_SCRIPT = """
import json, torch
from edgectl_runtime.kernels.ops import tinygemm
layout = tinygemm.packed_layout()
ok = True
for n, k in ((16, 32), (48, 64), (176, 576), (1072, 96)):
    q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    ok &= bool(torch.equal(layout.gather_rows(tinygemm.kernel_pack(q), torch.arange(n)), q))
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "block_rows": layout.block_rows, "ok": ok}))
"""

_LOWER = {"AVX512": ["avx2", "default"], "AVX2": ["default"], "DEFAULT": []}


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_learned_layout_on_lower_isas(capability):
    current = torch.backends.cpu.get_cpu_capability()
    if capability not in _LOWER.get(current, []):
        pytest.skip(f"torch runs {current} here; {capability} is not a lower capability it can be forced to")
    done = subprocess.run([sys.executable, "-c", _LAYOUT_SCRIPT], env=runtime_env({"ATEN_CPU_CAPABILITY": capability}),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["capability"] == capability.upper()
    assert result["ok"]
    assert result["block_rows"] == 32  # BLOCK_N of torch's AVX2 and scalar kernels


def test_layout_block_rows_here():
    expected = {"AVX512": 64, "AVX2": 32, "DEFAULT": 32}.get(torch.backends.cpu.get_cpu_capability())
    if expected is None:
        pytest.skip("no expectation recorded for this capability")
    assert tinygemm.packed_layout().block_rows == expected


# --- the quantizer


def test_quantizer_reproduces_q4_1_style_weights_exactly():
    # llama.cpp Q4_1: w = d * q + m per group of 32 (SmolLM2's weights are such values).
    gen = torch.Generator().manual_seed(3)
    n, k, g = 64, 256, 32
    q0 = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    q0.view(n, k // g, g)[..., 0] = 0  # every group uses the full 0..15 range, as Q4_1 groups
    q0.view(n, k // g, g)[..., 1] = 15  # made from their own min/max do
    d = (torch.rand(n, k // g, generator=gen) * 0.01 + 0.001)
    m = torch.randn(n, k // g, generator=gen) * 0.02
    w = (q0.float().view(n, k // g, g) * d.unsqueeze(-1) + m.unsqueeze(-1)).view(n, k)
    q, s, z = quantize_int4(w, g, torch.float32)
    assert torch.equal(q, q0)
    assert torch.allclose(dequantize_int4(q, s, z), w, atol=1e-6, rtol=0)


def test_quantizer_error_is_at_most_half_a_step():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(96, 192, generator=gen)
    for dtype in (torch.float32, torch.bfloat16):
        q, s, z = quantize_int4(w, 64, dtype)
        assert q.dtype == torch.uint8 and int(q.max()) <= 15
        err = (dequantize_int4(q, s, z) - w).abs().view(96, 3, 64).amax(-1)
        step = s.float()
        slack = 1e-5 if dtype == torch.float32 else 0.02 * w.abs().max()  # bf16 rounding of zero
        assert bool((err <= step / 2 + slack).all())


def test_constant_group_is_exact():
    w = torch.full((16, 64), 0.37)
    q, s, z = quantize_int4(w, 32, torch.float32)
    assert torch.equal(dequantize_int4(q, s, z), w)
    assert float(s.abs().max()) == 0.0


def test_quantizer_is_deterministic_and_block_independent():
    w = torch.randn(300, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    a = quantize_int4(w, 32, torch.bfloat16, block_rows=256)
    b = quantize_int4(w, 32, torch.bfloat16, block_rows=7)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_portable_nibbles_round_trip():
    q = torch.randint(0, 16, (48, 64), generator=torch.Generator().manual_seed(6), dtype=torch.uint8)
    p = pack_nibbles(q)
    assert p.shape == (48, 32) and int(p[0, 0]) == int(q[0, 0]) | (int(q[0, 1]) << 4)
    assert torch.equal(unpack_nibbles(p), q)


# --- vLLM's own W4A16 kernel (EDGECTL_INT4_KERNEL=vllm), where the loaded library has it


@pytest.mark.parametrize("m", MS)
def test_wna16_matches_dequantized_reference(m):
    pytest.importorskip("vllm")
    if not wna16.wna16_available():
        pytest.skip("vLLM's library on this CPU does not register cpu_gemm_wna16")
    q, s, z, _, _ = _case(96, 192, 64, torch.bfloat16)
    w = wna16.wna16_pack(q)
    assert torch.equal(wna16.wna16_unpack(w, 96), q)
    x = torch.randn(m, 192, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    out = wna16.wna16_matmul(x, w, s.t().contiguous(), z.t().float().contiguous(), 64)
    ref = x.float() @ dequantize_int4(q, s, z).t()
    assert _rel(out, ref) < 2e-2  # the kernel rounds the dequantized weight to bf16 (measured ~5e-3)
