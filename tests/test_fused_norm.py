"""edgectl's fused RMSNorm as a provider of vLLM's norm IR ops (runtime/edgectl_runtime/vllm_plugin/fused_norm.py):
what vLLM's dispatch picks with edgectl's priority, its results against vLLM's native
implementation, and the fallback to native for calls the op does not support."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm import ir  # noqa: E402

from edgectl_runtime.vllm_plugin import fused_norm  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert fused_norm.register() == ["rms_norm", "fused_add_rms_norm"]
    assert fused_norm.register() == ["rms_norm", "fused_add_rms_norm"]  # once per process


def _inputs(dtype, rows=4, hidden=576):
    gen = torch.Generator().manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    res = torch.randn(rows, hidden, generator=gen).to(dtype)
    w = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    return x, res, w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_priority_selects_edgectl_and_matches_native(dtype):
    x, res, w = _inputs(dtype)
    op = ir.ops.fused_add_rms_norm
    with op.set_priority(["edgectl", "native"]):
        assert op.dispatch(x, res, w, 1e-5).provider == "edgectl"
        out, new_res = op(x, res, w, 1e-5)
    ref_out, ref_res = op.impls["native"].impl_fn(x, res, w, 1e-5)
    assert torch.equal(new_res, ref_res)
    rtol = 2 ** -6 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=rtol, atol=rtol)
    with ir.ops.rms_norm.set_priority(["edgectl", "native"]):
        assert ir.ops.rms_norm.dispatch(x, w, 1e-5).provider == "edgectl"
        torch.testing.assert_close(ir.ops.rms_norm(x, w, 1e-5).float(),
                                   ir.ops.rms_norm.impls["native"].impl_fn(x, w, 1e-5).float(), rtol=rtol, atol=rtol)


def test_unsupported_calls_fall_back_to_native():
    x, res, w = _inputs(torch.bfloat16)
    op = ir.ops.fused_add_rms_norm
    with op.set_priority(["edgectl", "native"]):
        assert op.dispatch(x, res, w.float(), 1e-5).provider == "native"  # weight in another dtype
        assert op.dispatch(x, res, None, 1e-5).provider == "native"
        assert op.dispatch(x, res, w, 1e-5, 256).provider == "native"  # variance over a prefix
    with ir.ops.rms_norm.set_priority(["edgectl", "native"]):
        assert ir.ops.rms_norm.dispatch(x, w, 1e-5, 100).provider == "native"


def test_priority_is_what_vllm_accepts():
    from vllm.config.kernel import IrOpPriorityConfig

    cfg = IrOpPriorityConfig(**fused_norm.priority())
    assert cfg.fused_add_rms_norm == ["edgectl"] and cfg.rms_norm == ["edgectl"]
    assert ir.ops.fused_add_rms_norm._filter_priority_impls(cfg.fused_add_rms_norm + ["native"])
