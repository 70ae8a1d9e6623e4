"""edgectl's kernel library (runtime/edgectl_runtime/kernels/ops) against its plain-PyTorch reference
(ops/reference.py), at every ISA level this CPU can run (each test names the level it ran; a
level the CPU cannot run is skipped and says so). No timing here: speed is the
micro-benchmark's job (python -m edgectl_runtime.tools.diagnostics.microbench)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_levels import skip_reason  # noqa: E402

from edgectl_runtime.formats import blocks  # noqa: E402
from edgectl_runtime.kernels import ops  # noqa: E402
from edgectl_runtime.kernels.ops import reference  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (n, k): N not a multiple of the 16-row tile, K not a multiple of 32 ("odd K") or of 128.
SHAPES = ((16, 32), (40, 100), (33, 200), (96, 576), (48, 7), (130, 1536))
MS = (1, 2, 3, 5, 8, 17, 64)


@pytest.fixture(scope="module", autouse=True)
def library():
    ok, why = ops.available()
    assert ok, why  # a missing or stale build is a failure, not a skip: scripts/setup.sh builds it


@pytest.fixture(params=ops.LEVELS)
def level(request):
    """The integer kernels at each level (the dense large-batch path is tested on its own); in the AVX2 tier
    nothing above AVX2 (tests/kernel_levels.py)."""
    why = skip_reason(request.param)
    if why:
        pytest.skip(why)
    with ops.use_level(request.param), ops.dense_from(0):
        assert ops.active_level() == request.param
        yield request.param


def _x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * 3
    if m > 1:
        x[1, : min(k, 32)] = 0  # an all-zero block
    return x.to(dtype)


def _w(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * 0.05 + 0.01


def _w5(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W5 values as a GGUF's Q5_0 gives them (nothing quantizes to W5): q in 0..31, fp16 d."""
    gen = torch.Generator().manual_seed(seed)
    kb = -(-k // 32)
    q = torch.randint(0, 32, (n, kb * 32), generator=gen, dtype=torch.uint8)
    q[:, k:] = 16  # padding columns hold w = 0
    return q, (torch.rand(n, kb, generator=gen) * 0.01 + 1e-4).to(torch.float16)


def _close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    # fp32 accumulation in the kernel vs float64 in the reference; then one rounding to dtype.
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
    scale = float(ref.float().abs().max()) or 1.0
    torch.testing.assert_close(y.float(), ref.float(), rtol=rtol, atol=rtol * scale * 0.05)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 32), (3, 100), (17, 576), (2, 7), (64, 1536)])
def test_activation_quantizer_is_bit_exact(level, dtype, m, k):
    x = _x(m, k, dtype, seed=m * 1000 + k)
    q, d, s = torch.ops.edgectl.quantize_activations(x)
    rq, rd, rs = reference.quantize_activations(x)
    assert torch.equal(q, rq) and torch.equal(d, rd) and torch.equal(s, rs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", MS)
def test_linear_w4a8_matches_the_reference(level, dtype, m, n, k):
    q, d, mn = blocks.quantize_w4(_w(n, k, seed=n + k))
    packed = blocks.pack_w4(q, d, mn)
    x = _x(m, k, dtype, seed=m + 7 * k)
    y = torch.ops.edgectl.linear_w4a8(x, packed, n, k)
    assert y.shape == (m, n) and y.dtype == dtype
    _close(y, reference.linear_w4a8(x, q, d, mn), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", MS)
def test_linear_w8a8_matches_the_reference(level, dtype, m, n, k):
    q, d = blocks.quantize_w8(_w(n, k, seed=3 * n + k))
    packed = blocks.pack_w8(q, d)
    x = _x(m, k, dtype, seed=m + 11 * k)
    y = torch.ops.edgectl.linear_w8a8(x, packed, n, k)
    assert y.shape == (m, n) and y.dtype == dtype
    _close(y, reference.linear_w8a8(x, q, d), dtype)


@pytest.mark.isa_avx2  # the AVX2 tier runs it again held to AVX2 (~2 s)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", (1, 2, 5, 8, 17))
def test_linear_w5a8_matches_the_reference(level, dtype, m, n, k):
    """The W5 tile: the fifth bits merged into W4's nibbles, the -16 s term exact in int32; m covers a
    partial and a whole row group at both vector widths (four rows on AVX2, eight on AVX-512)."""
    q, d = _w5(n, k, seed=5 * n + k)
    x = _x(m, k, dtype, seed=m + 13 * k)
    y = torch.ops.edgectl.linear_w5a8(x, blocks.pack_w5(q, d), n, k)
    assert y.shape == (m, n) and y.dtype == dtype
    _close(y, reference.linear_w5a8(x, q, d), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(40, 100), (130, 1536)])
def test_dequantize_is_exact(level, dtype, n, k):
    w = _w(n, k, seed=n)
    q, d, mn = blocks.quantize_w4(w)
    got = torch.ops.edgectl.dequantize(blocks.pack_w4(q, d, mn), n, k, 4, dtype)
    assert torch.equal(got, blocks.dequantize_w4(q, d, mn, k).to(dtype))
    q8, d8 = blocks.quantize_w8(w)
    got8 = torch.ops.edgectl.dequantize(blocks.pack_w8(q8, d8), n, k, 8, dtype)
    assert torch.equal(got8, blocks.dequantize_w8(q8, d8, k).to(dtype))
    q5, d5 = _w5(n, k, seed=n + 1)
    got5 = torch.ops.edgectl.dequantize(blocks.pack_w5(q5, d5), n, k, 5, dtype)
    assert torch.equal(got5, blocks.dequantize_w5(q5, d5, k).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 17, 64, 129])
def test_large_batches_take_the_dense_path(level, dtype, m):
    """From dense_from_m rows on: the dequantized weight times PyTorch's GEMM (activations kept
    in their dtype, so the reference is x @ W^T with the dequantized W)."""
    n, k = 200, 100  # a scratch chunk boundary is not crossed here; the 1536-column case below is
    q, d, mn = blocks.quantize_w4(_w(n, k, seed=3))
    x = _x(m, k, dtype, seed=4)
    with ops.dense_from(1):
        y = torch.ops.edgectl.linear_w4a8(x, blocks.pack_w4(q, d, mn), n, k)
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}[dtype]
    ref = reference.linear_dense(x, blocks.dequantize_w4(q, d, mn, k))
    torch.testing.assert_close(y.float(), ref.float(), rtol=rtol, atol=rtol * float(ref.float().abs().max()))
    n, k = 3000, 1536  # several scratch chunks
    q8, d8 = blocks.quantize_w8(_w(n, k, seed=5))
    x = _x(m, k, dtype, seed=6)
    with ops.dense_from(1):
        y = torch.ops.edgectl.linear_w8a8(x, blocks.pack_w8(q8, d8), n, k)
    ref = reference.linear_dense(x, blocks.dequantize_w8(q8, d8, k))
    torch.testing.assert_close(y.float(), ref.float(), rtol=rtol, atol=rtol * float(ref.float().abs().max()))
    q5, d5 = _w5(n, k, seed=7)
    with ops.dense_from(1):
        y = torch.ops.edgectl.linear_w5a8(x, blocks.pack_w5(q5, d5), n, k)
    ref = reference.linear_dense(x, blocks.dequantize_w5(q5, d5, k))
    torch.testing.assert_close(y.float(), ref.float(), rtol=rtol, atol=rtol * float(ref.float().abs().max()))


def test_dense_rows_bound_the_gemm_shapes():
    """The dense path pads m rows up to few sizes (oneDNN keeps a compiled primitive per shape):
    never fewer rows, at most a quarter more, and a handful of sizes per octave."""
    rows = [torch.ops.edgectl.dense_rows(m) for m in range(1, 4097)]
    assert rows[:16] == list(range(1, 17))
    for m, r in enumerate(rows, start=1):
        assert m <= r <= m + m // 4, (m, r)
    assert rows == sorted(rows)
    assert len(set(rows[127:512])) <= 13  # the 128..512 rows a default plan's prefill chunks have
    assert len(set(rows[16:4096])) <= 4 * 8 + 1


def test_linear_accepts_leading_dims_and_strided_rows(level):
    n, k = 48, 96
    q, d, mn = blocks.quantize_w4(_w(n, k, seed=1))
    packed = blocks.pack_w4(q, d, mn)
    x = _x(6, 2 * k, torch.float32, seed=2)[:, :k]  # rows strided by 2k
    assert not x.is_contiguous()
    _close(torch.ops.edgectl.linear_w4a8(x, packed, n, k), reference.linear_w4a8(x.contiguous(), q, d, mn),
           torch.float32)
    y3 = torch.ops.edgectl.linear_w4a8(x.contiguous().reshape(2, 3, k), packed, n, k)
    assert y3.shape == (2, 3, n)
    _close(y3.reshape(6, n), reference.linear_w4a8(x.contiguous(), q, d, mn), torch.float32)
    assert torch.ops.edgectl.linear_w4a8(x[:0], packed, n, k).shape == (0, n)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_rows_are_exact(level, bits, dtype):
    n, k = 70, 100
    w = _w(n, k, seed=5)
    ids = torch.tensor([[0, 69, 17], [16, 15, 3]])
    if bits == 4:
        q, d, mn = blocks.quantize_w4(w)
        got = torch.ops.edgectl.embedding_w4(ids, blocks.pack_w4(q, d, mn), n, k, dtype)
        want = reference.embedding_w4(ids, q, d, mn, k, dtype)
    else:
        q, d = blocks.quantize_w8(w)
        got = torch.ops.edgectl.embedding_w8(ids, blocks.pack_w8(q, d), n, k, dtype)
        want = reference.embedding_w8(ids, q, d, k, dtype)
    assert got.shape == (2, 3, k) and torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (5, 100), (64, 2048), (3, 7)])
def test_add_rms_norm_matches_vllms_formula(level, dtype, rows, hidden):
    gen = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    res = torch.randn(rows, hidden, generator=gen).to(dtype)
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    out, new_res = torch.ops.edgectl.add_rms_norm(x, res, weight, 1e-5)
    ref_out, ref_res = reference.add_rms_norm(x, res, weight, 1e-5)
    assert torch.equal(new_res, ref_res)  # one fp32 add, one rounding: exact
    # the mean square is summed in another order; a 1-ulp change of the normalized value can
    # move the product by one ulp of the dtype
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}[dtype]
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=rtol, atol=rtol)
    torch.testing.assert_close(torch.ops.edgectl.rms_norm(x, weight, 1e-5).float(),
                               reference.rms_norm(x, weight, 1e-5).float(), rtol=rtol, atol=rtol)
    assert torch.equal(x, x.clone())  # inputs untouched (functional op)


def test_ops_stay_one_call_under_torch_compile():
    """fullgraph: no graph break; every edgectl op is one node the compiler does not look into."""
    n, k = 64, 96
    q, d, mn = blocks.quantize_w4(_w(n, k, seed=9))
    w4 = blocks.pack_w4(q, d, mn)
    q8, d8 = blocks.quantize_w8(_w(n, k, seed=10))
    w8 = blocks.pack_w8(q8, d8)
    w5 = blocks.pack_w5(*_w5(n, k, seed=11))
    norm_w = torch.ones(k)
    seen: list[str] = []

    def counting_backend(gm, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    def f(x, res, ids):
        h, res2 = torch.ops.edgectl.add_rms_norm(x, res, norm_w, 1e-6)
        y = torch.ops.edgectl.linear_w4a8(h, w4, n, k)
        e = torch.ops.edgectl.embedding_w8(ids, w8, n, k, torch.float32)
        y5 = torch.ops.edgectl.linear_w5a8(h, w5, n, k)
        return torch.ops.edgectl.linear_w8a8(e, w8, n, k) + y[:, :1] + y5[:, :1], res2

    x, res, ids = _x(3, k, torch.float32, 1), _x(3, k, torch.float32, 2), torch.tensor([1, 5, 63])
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=counting_backend, fullgraph=True)
    got = compiled(x, res, ids)
    ops_called = sorted(t.removesuffix(".default") for t in seen if t.startswith("edgectl."))
    assert ops_called == ["edgectl.add_rms_norm", "edgectl.embedding_w8", "edgectl.linear_w4a8",
                          "edgectl.linear_w5a8", "edgectl.linear_w8a8"], seen
    want = f(x, res, ids)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # and with inductor, the op runs as an extern call with the same result
    torch._dynamo.reset()
    out = torch.compile(lambda a: torch.ops.edgectl.linear_w4a8(a * 2, w4, n, k) + 1, fullgraph=True)(x)
    torch.testing.assert_close(out, torch.ops.edgectl.linear_w4a8(x * 2, w4, n, k) + 1)


@pytest.mark.parametrize("call,message", [
    (lambda w, x: torch.ops.edgectl.linear_w4a8(x, w, 64, 100), "must have shape [4, 4, 320]"),
    (lambda w, x: torch.ops.edgectl.linear_w4a8(x[:, :90], w, 64, 96), "x must have 96 columns"),
    (lambda w, x: torch.ops.edgectl.linear_w4a8(x.to(torch.int32), w, 64, 96), "must be float32, bfloat16 or float16"),
    (lambda w, x: torch.ops.edgectl.linear_w8a8(x, w, 64, 96), "must have shape [4, 3, 544]"),
    (lambda w, x: torch.ops.edgectl.embedding_w4(torch.tensor([64]), w, 64, 96, torch.float32), "ids must be in [0, 64)"),
    (lambda w, x: torch.ops.edgectl.add_rms_norm(x, x[:, :5], torch.ones(96), 1e-6), "residual must match x"),
])
def test_bad_input_is_a_clear_error(call, message):
    q, d, mn = blocks.quantize_w4(_w(64, 96, seed=1))
    w = blocks.pack_w4(q, d, mn)
    with pytest.raises(RuntimeError) as err:
        call(w, _x(2, 96, torch.float32, 1))
    assert message in str(err.value)


def test_the_crossover_per_level_is_the_measured_one():
    """docs/kernels.md: the integer kernel at every batch on AVX2 (its fp32 GEMM never wins up to
    512 rows); the bf16 GEMM from 128 rows where AMX / AVX512-BF16 make it fast; BLAS from 16 rows
    behind the scalar kernels."""
    expected = {"scalar": 16, "avx2": 0, "avxvnni": 0}
    for lv in ops.supported_levels():
        with ops.use_level(lv):
            got = torch.ops.edgectl.set_dense_from_m(-1)
            bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
            assert got == expected.get(lv, 128 if bf16 else 0), (lv, got)


def test_auto_takes_the_best_level_under_pytorchs_ceiling():
    """Pure logic (no CPU dependence): EDGECTL_KERNEL_ISA=auto picks the highest supported level at
    or below ATEN_CPU_CAPABILITY's; an explicit level ignores the ceiling; an unsupported one is refused."""
    every = ["scalar", "avx2", "avxvnni", "avx512vnni"]
    assert ops.choose_level("auto", every) == "avx512vnni"
    # ATen has no level between AVX2 and AVX-512: an AVX-VNNI CPU without AVX-512 runs ATen at AVX2
    assert ops.choose_level("auto", every, "avx2") == "avxvnni"
    assert ops.choose_level("auto", ["scalar", "avx2", "avx512vnni"], "avx2") == "avx2"
    assert ops.choose_level("auto", every, "AVX512") == "avx512vnni"
    assert ops.choose_level("auto", every, "default") == "scalar"
    assert ops.choose_level("auto", every, "zvector") == "avx512vnni"
    assert ops.choose_level("auto", ["scalar", "avx2"], "avx512") == "avx2"
    assert ops.choose_level("avx512vnni", every, "avx2") == "avx512vnni"
    with pytest.raises(ops.KernelLibraryError, match="allow scalar, avx2"):
        ops.choose_level("avx512vnni", ["scalar", "avx2"])


def test_the_process_level_follows_the_environment():
    """load() with ATEN_CPU_CAPABILITY=avx2 on this CPU: its best level at or below AVX-VNNI (AVX2
    and VEX, no AVX-512), else scalar."""
    before = ops.active_level()
    try:
        got = ops.load({"ATEN_CPU_CAPABILITY": "avx2"})
        below = [lv for lv in ("avxvnni", "avx2") if lv in ops.supported_levels()]
        assert got == (below[0] if below else "scalar")
        assert ops.load({"EDGECTL_KERNEL_ISA": "scalar"}) == "scalar"
    finally:
        torch.ops.edgectl.set_kernel_isa(before)
