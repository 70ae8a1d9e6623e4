"""Which int4/int8 kernels this process can run (edgectl_runtime.tools.diagnostics.report), against the
recorded kernel matrix (tests/data/vllm_kernels.yaml) and against what the loaded vLLM library
really registers; and the micro-benchmark's plumbing (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from int4_helpers import runtime_env

from edgectl.contract.plan import WeightFormat

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from edgectl_runtime.tools.diagnostics import microbench  # noqa: E402
from edgectl_runtime.tools.diagnostics import report as kernels

MATRIX = yaml.safe_load((Path(__file__).parent / "data" / "vllm_kernels.yaml").read_text())


@pytest.fixture(scope="module")
def report():
    return kernels.kernel_report()


def _expected_library() -> str | None:
    import platform

    if platform.machine() != "x86_64":
        return None
    facts = {"avx512f": bool(torch.cpu._is_avx512_supported()),
             "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported())}
    for rule in MATRIX["selection"]:
        if all(facts[k] == v for k, v in rule["when"].items()):
            return rule["library"]
    raise AssertionError(f"no selection rule matches {facts}")


def test_matrix_is_well_formed():
    assert MATRIX["schema"] == "edgectl.vllm-kernels/1"
    for rule in MATRIX["selection"]:
        assert rule["library"] in MATRIX["libraries"]
    known = set(kernels.VLLM_OPS)
    for lib in MATRIX["libraries"].values():
        assert set(lib["ops"]) <= known
    for fmt in [*MATRIX["formats"].values(), *MATRIX["vllm_only"].values()]:
        assert set(fmt["needs_ops"]) <= known
    # the matrix's formats are the plan's, and a vLLM-only kernel is none of them
    assert set(MATRIX["formats"]) == {str(f) for f in WeightFormat}
    assert not set(MATRIX["vllm_only"]) & {str(f) for f in WeightFormat}


@pytest.mark.host
def test_vllm_loaded_the_library_the_matrix_predicts(report):
    expected = _expected_library()
    if expected is None:
        pytest.skip("the matrix records x86_64 only")
    assert report["vllm"]["library_expected"] == expected
    assert report["vllm"]["libraries_loaded"] == [expected]


@pytest.mark.host
def test_registered_ops_are_the_matrix_row(report):
    expected = _expected_library()
    if expected is None:
        pytest.skip("the matrix records x86_64 only")
    registered = {name for name, present in report["vllm"]["int4_ops"].items() if present}
    assert registered == set(MATRIX["libraries"][expected]["ops"])
    # and the report reads torch.ops._C itself, not the matrix
    assert report["vllm"]["int4_ops"]["cpu_gemm_wna16"] == hasattr(torch.ops._C, "cpu_gemm_wna16")


def test_formats_follow_registered_ops(report):
    ops = report["vllm"]["int4_ops"]
    assert report["formats"]["bf16"] is True
    assert report["formats"]["w4a16-vllm"] == ops["cpu_gemm_wna16"]
    # vLLM's W4A8-on-AMX kernel is reported as a fact about vLLM, not as a format edgectl serves
    assert "w4a8-amx" not in report["formats"]
    assert report["vllm"]["w4a8_amx_usable"] == (ops["int4_scaled_mm_cpu"] and report["torch"]["amx"])
    assert report["formats"]["w4a16"] is True  # torch's int4 kernel runs on every x86/arm build
    int4 = report["torch"]["int4"]
    assert int4["registered"] and int4["works"] and int4["rel_error"] < 1e-2


def test_cli_prints_the_report_as_json():
    done = subprocess.run([sys.executable, "-m", "edgectl_runtime.tools.diagnostics.report"], env=runtime_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["schema"] == "edgectl.kernels/1"
    assert set(out["formats"]) == {"bf16", "w4a16", "w4a16-vllm", "w4a8", "w8a8"} == {str(f) for f in WeightFormat}
    assert isinstance(out["vllm"]["w4a8_amx_usable"], bool)
    assert out["formats"]["w4a8"] is True and out["edgectl"]["isa"] in out["edgectl"]["supported_isas"]
    assert out["formats"]["w8a8"] is True


def test_microbench_rows_read_back_each_level():
    """Every arm runs and reports bytes and a rate; each edgectl arm ran at the level it names
    (the benchmark asserts the read-back level itself)."""
    from edgectl_runtime.kernels import ops

    levels = ops.supported_levels()
    rows = microbench.run([("test", "tiny", 40, 96)], [1, 3], passes=1, levels=levels, act_dtype=torch.bfloat16,
                          include={"w4a8", "w8a8", "torch-int4", "bf16"}, footprint=1 << 20, min_calls=2)
    arms = {r["arm"] for r in rows}
    assert arms == {f"w4a8/{lv}" for lv in levels} | {f"w8a8/{lv}" for lv in levels} | {"bf16"}  # N=40: no int4
    for r in rows:
        assert r["median_us"] > 0 and r["weight_bytes"] > 0 and r["m"] in (1, 3)
    w4 = next(r for r in rows if r["arm"].startswith("w4a8"))
    assert w4["weight_bytes"] == 3 * 3 * 320  # 3 tiles x 3 blocks of 320-byte records
