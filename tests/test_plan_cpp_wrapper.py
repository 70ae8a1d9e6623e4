"""Whether a compiled plan's graph has inductor's wrapper in C++ (levers.cpp_wrapper), decided from the
profile's ``compiled.cpp_wrapper`` figures (planner/engine.py ``cpp_wrapper_default``): on where the C++
wrapper decoded above the Python wrapper's range in one run on the class, and then the plan is predicted,
timed and limited by the C++ wrapper's own figures; off where it did not pay, was not measured, or the
plan is eager. Every expected figure is worked by hand in the test's docstring."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_helpers import (
    MEASURED_SOURCE,
    host_facts,
    make_plan,
    profile_from_yaml,
    reasons_by_decision,
    shape,
)

from edgectl.errors import EdgectlError

SMOLLM2 = "smollm2-135m"


def _profile(tmp_path: Path, *, cpp: float | None = 230.0, control_source: str = "bench"):
    """Compiled w4a8 at 200 tok/s (the Python wrapper, first start 40 s, its peak 1.6x the steady PSS);
    the C++ wrapper at ``cpp`` tok/s against 200 [190-210] in one run, its first start 60 s at 2.0x."""
    block = ("" if cpp is None else
             "  cpp_wrapper:\n"
             f"    decode_tok_s: {{median: {cpp}, min: {cpp - 5}, max: {cpp + 5}, passes: 3}}\n"
             f"    control_decode_tok_s: {{median: 200.0, min: 190.0, max: 210.0, passes: 3, source: {control_source}}}\n"
             "    ready_cold_s: {median: 60.0, passes: 3}\n"
             "    cold_peak_ratio: {median: 2.0, passes: 3}\n")
    other = MEASURED_SOURCE.replace("sources:\n  bench:", "  other:")
    text = ("schema: edgectl.profile/1\nname: t\ndevice_class: x86_64-avx512\nkind: measured\n"
            f"match:\n  arch: x86_64\n  isa_all: [avx512f]\n{MEASURED_SOURCE}{other}"
            "formats:\n  w4a8:\n    runs: true\n"
            "    decode_tok_s: {median: 150.0, passes: 3, source: bench}\n"
            "    prefill_tok_s: {median: 1000.0, passes: 3, source: bench}\n"
            "runtime:\n  ready_s: {median: 11.0, passes: 3, source: bench}\n"
            "compilation: default\n"
            "compiled:\n  weight_format: w4a8\n"
            "  decode_tok_s: {median: 200.0, min: 190.0, max: 210.0, passes: 3, source: bench}\n"
            "  prefill_tok_s: {median: 2000.0, passes: 3, source: bench}\n"
            "  ready_cold_s: {median: 40.0, passes: 3, source: bench}\n"
            "  ready_warm_s: {median: 9.0, passes: 3, source: bench}\n"
            "  cold_peak_ratio: {median: 1.6, passes: 3, source: bench}\n"
            + block.replace("passes: 3}", "passes: 3, source: bench}"))
    return profile_from_yaml(tmp_path, text)


def _plan(tmp_path: Path, **kwargs):
    request = {k: kwargs.pop(k) for k in ("cpp_wrapper", "compilation") if k in kwargs}
    return make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), [_profile(tmp_path, **kwargs)],
                     weight_format="w4a8", **request)


def test_on_where_the_profile_measured_it_paying_and_planned_by_its_figures(tmp_path: Path):
    """230 tok/s against the Python wrapper's 200 [190-210]: above its range, so on; the plan predicts the
    C++ wrapper's decode (SmolLM2 is the profile's own shape: no bytes moved), waits 3 x 60 + 60 = 240 s
    for the compiling start, and its MemoryMax is the steady total x 2.0 x 1.25 (not x 1.6)."""
    p = _plan(tmp_path)
    assert p.levers.cpp_wrapper is True
    assert p.env["TORCHINDUCTOR_CPP_WRAPPER"] == "1" and p.env["VLLM_USE_LAYERNAME"] == "0"
    why = reasons_by_decision(p)["cpp_wrapper"][0]
    assert why["source"] == "default" and why["detail"].startswith("on: ")
    for cited in ("230 tok/s", "200 tok/s", "60 s", "2 x"):
        assert cited in why["detail"], (cited, why["detail"])
    assert p.predicted.decode_tok_s == pytest.approx(230.0, rel=0.02)
    assert p.timeouts.start_s == 240
    assert p.memory.limit_bytes == pytest.approx(p.memory.total_bytes * 2.0 * 1.25, rel=0.001)


def test_asked_off_where_it_pays_keeps_the_python_wrappers_figures(tmp_path: Path):
    """Asked off: the Python wrapper's 200 tok/s, 3 x 40 + 60 = 180 s, MemoryMax x 1.6 x 1.25."""
    p = _plan(tmp_path, cpp_wrapper=False)
    assert p.levers.cpp_wrapper is False and "TORCHINDUCTOR_CPP_WRAPPER" not in p.env
    assert reasons_by_decision(p)["cpp_wrapper"][0]["source"] == "flag"
    assert p.predicted.decode_tok_s == pytest.approx(200.0, rel=0.02)
    assert p.timeouts.start_s == 180
    assert p.memory.limit_bytes == pytest.approx(p.memory.total_bytes * 1.6 * 1.25, rel=0.001)


def test_off_where_it_did_not_clear_the_python_wrappers_range(tmp_path: Path):
    """208 tok/s is inside the Python wrapper's 190-210: off, and the reason quotes both figures."""
    p = _plan(tmp_path, cpp=208.0)
    assert p.levers.cpp_wrapper is False
    detail = reasons_by_decision(p)["cpp_wrapper"][0]["detail"]
    assert detail.startswith("off: ") and "208 tok/s" in detail and "not above" in detail
    assert p.predicted.decode_tok_s == pytest.approx(200.0, rel=0.02)


def test_off_where_not_measured_and_in_eager_mode(tmp_path: Path):
    p = _plan(tmp_path, cpp=None)
    assert p.levers.cpp_wrapper is False
    assert reasons_by_decision(p)["cpp_wrapper"][0]["detail"].startswith("not measured on t;")
    eager = _plan(tmp_path / "eager", compilation="eager")
    assert eager.levers.cpp_wrapper is False
    assert "eager mode" in reasons_by_decision(eager)["cpp_wrapper"][0]["detail"]


def test_the_two_wrappers_are_compared_within_one_run(tmp_path: Path):
    with pytest.raises(EdgectlError, match="compared within one run"):
        _profile(tmp_path, control_source="other")
