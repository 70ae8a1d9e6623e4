"""The plan's speeds (planner/speed.py): a profile's figures moved to another model — decode by the
bytes a token reads at the profile's measured rate (or by the bytes alone without one), prefill by the
linear layers' parameters (or by the bytes where the source does not record them). Every expected
figure is worked by hand in the test's docstring."""

from __future__ import annotations

from pathlib import Path

import pytest
from plan_helpers import (
    MEASURED_SOURCE,
    QWEN25_05B,
    host_facts,
    make_plan,
    profile_from_yaml,
    reasons_by_decision,
    shape,
    shipped_profiles,
)

from edgectl.contract.plan import Compilation, WeightFormat
from edgectl.planner.speed import fixed_step_s, predict, prefill_at

MB = 1_000_000
SOURCE = (MEASURED_SOURCE.replace('    edgectl_commit: "0165d14"\n', '    edgectl_commit: "0165d14"\n'
                                  '    model: small\n    model_weights_bytes: 100000000\n')
          + "    {params}")


def _profile(tmp_path: Path, *, rate: float | None = 40.0, params: int | None = 100_000_000):
    """A profile measured on a 100 MB model (100M linear parameters): eager w4a8 decode 150 tok/s,
    compiled 200 tok/s, prefill 1000 (eager) and 2000 (compiled); the rate as given."""
    source = SOURCE.format(params=f"model_linear_params: {params}\n" if params else "\n")
    text = (f"schema: edgectl.profile/1\nname: t\ndevice_class: x86_64-avx512\nkind: measured\n"
            f"match:\n  arch: x86_64\n  isa_all: [avx512f]\n{source}"
            "formats:\n  w4a8:\n    runs: true\n"
            "    decode_tok_s: {median: 150.0, min: 140.0, max: 160.0, passes: 3}\n"
            "    prefill_tok_s: {median: 1000.0, min: 900.0, max: 1100.0, passes: 3}\n"
            "runtime:\n  ready_s: {median: 11.0, passes: 3}\n"
            "compiled:\n  weight_format: w4a8\n"
            "  decode_tok_s: {median: 200.0, min: 190.0, max: 210.0, passes: 3}\n"
            "  prefill_tok_s: {median: 2000.0, min: 1900.0, max: 2100.0, passes: 3}\n"
            "  ready_warm_s: {median: 9.0, passes: 3}\n"
            + (f"  decode_weight_gbps: {{median: {rate}, min: {rate - 5}, max: {rate + 5}, passes: 3}}\n" if rate else ""))
    return profile_from_yaml(tmp_path, text)


def test_decode_moves_by_the_bytes_at_the_measured_rate(tmp_path: Path):
    """200 tok/s on 100 MB is 5 ms a token, 2.5 ms of it 100 MB at 40 GB/s: 2.5 ms do not read weights.
    A 300 MB model: 2.5 + 7.5 = 10 ms → 100 tok/s (by the bytes alone it would be 200 / 3 = 66.7)."""
    prof = _profile(tmp_path)
    assert fixed_step_s(200.0, 100 * MB, 40.0) == pytest.approx(0.0025)
    got = predict(prof, WeightFormat.W4A8, 300 * MB, 100_000_000, Compilation.DEFAULT)
    assert got.value.decode_tok_s == pytest.approx(100.0)
    (reason,) = got.reasons
    assert reason.decision == "predicted" and reason.value["decode_tok_s"] == pytest.approx(100.0)
    assert got.value.measured_on == "small"  # the profile's model, which the report names beside a miss
    for cited in ("10.00 ms a token", "2.50 ms of it not reading weights", "300.0 MB at 40 GB/s", "on small"):
        assert cited in reason.detail, (cited, reason.detail)
    # a smaller model: 2.5 + 1.25 = 3.75 ms → 266.67 tok/s; the measured model itself: its figure
    assert predict(prof, WeightFormat.W4A8, 50 * MB, None, Compilation.DEFAULT).value.decode_tok_s == pytest.approx(266.67)
    assert predict(prof, WeightFormat.W4A8, 100 * MB, None, Compilation.DEFAULT).value.decode_tok_s == 200.0


def test_without_a_rate_decode_is_scaled_by_the_bytes_and_says_it_is_a_floor(tmp_path: Path):
    got = predict(_profile(tmp_path, rate=None), WeightFormat.W4A8, 300 * MB, None, Compilation.DEFAULT)
    assert got.value.decode_tok_s == pytest.approx(66.67)  # 200 × 100 / 300
    assert "scaled by weight bytes" in got.reasons[0].detail and "a floor" in got.reasons[0].detail


def test_a_rate_the_decode_figure_contradicts_is_not_used(tmp_path: Path):
    """100 MB at 10 GB/s is 10 ms, more than the 5 ms a token measured: no part of the step is left for
    the rest, so the rate cannot describe that run; the bytes scale the figure."""
    assert fixed_step_s(200.0, 100 * MB, 10.0) < 0
    got = predict(_profile(tmp_path, rate=10.0), WeightFormat.W4A8, 300 * MB, None, Compilation.DEFAULT)
    assert got.value.decode_tok_s == pytest.approx(66.67)


def test_the_rate_is_compiled_modes_and_eager_figures_scale_by_bytes(tmp_path: Path):
    got = predict(_profile(tmp_path), WeightFormat.W4A8, 300 * MB, None, Compilation.EAGER)
    assert got.value.decode_tok_s == pytest.approx(50.0)  # 150 × 100 / 300
    assert got.value.ready_s == 11.0


def test_prefill_moves_by_the_linear_parameters_where_recorded(tmp_path: Path):
    """Compiled prefill 2000 tok/s on 100M parameters: a model with 250M → 800 tok/s, whatever its bytes
    (its LM head is read once per sequence). Without the source's parameters: by the bytes,
    2000 × 100 / 400 = 500."""
    got = predict(_profile(tmp_path), WeightFormat.W4A8, 400 * MB, 250_000_000, Compilation.DEFAULT)
    assert got.value.prefill_tok_s == pytest.approx(800.0)
    assert "parameters but the LM head (100.0M → 250.0M)" in got.reasons[0].detail
    assert prefill_at(1900.0, _profile(tmp_path).compiled.prefill_tok_s, 400 * MB, 250_000_000) == pytest.approx(760.0)
    bare = predict(_profile(tmp_path, params=None), WeightFormat.W4A8, 400 * MB, 250_000_000, Compilation.DEFAULT)
    assert bare.value.prefill_tok_s == pytest.approx(500.0)
    assert "scaled by weight bytes (100.0 → 400.0 MB)" in bare.reasons[0].detail


def test_a_non_positive_rate_is_refused(tmp_path: Path):
    with pytest.raises(Exception, match="decode_weight_gbps.*not a rate"):
        _profile(tmp_path, rate=-1.0)


def test_the_shipped_amx_profile_moves_its_decode_at_its_rate():
    """The shipped x86_64-amx profile and a Qwen2.5-0.5B shape: decode is the profile's SmolLM2 figure moved
    at the profile's rate (its figures disagree nowhere: the part that does not read weights is positive),
    prefill scaled by the two models' linear parameters; recomputed here from the profile's own figures."""
    model = shape(QWEN25_05B)
    (prof,) = (x for x in shipped_profiles() if x.name == "x86_64-amx")
    compiled = prof.compiled
    assert compiled is not None and compiled.decode_tok_s and compiled.prefill_tok_s and compiled.decode_weight_gbps
    weights = 500 * MB
    got = predict(prof, compiled.weight_format, weights, model.linear_params, Compilation.DEFAULT).value
    ref_bytes = compiled.decode_tok_s.source.model_weights_bytes
    rate = compiled.decode_weight_gbps.median * 1e9
    assert ref_bytes and 1 / compiled.decode_tok_s.median - ref_bytes / rate > 0
    step = 1 / compiled.decode_tok_s.median - ref_bytes / rate + weights / rate
    assert got.decode_tok_s == pytest.approx(1 / step, abs=0.01)
    params = compiled.prefill_tok_s.source.model_linear_params
    assert params and model.linear_params and params != model.linear_params
    assert got.prefill_tok_s == pytest.approx(compiled.prefill_tok_s.median * params / model.linear_params, abs=0.01)


def test_every_text_plan_says_how_its_speeds_were_predicted():
    """The published x86_64-amx profile (a 2-socket Sapphire Rapids fixture): its figures name no model
    size, so the plan quotes them as they are and says so."""
    p = make_plan(host_facts("xeon-spr-amx-2s"), shape(QWEN25_05B), shipped_profiles())
    assert p.profile.name == "x86_64-amx-spr"
    (reason,) = reasons_by_decision(p)["predicted"]
    assert reason["value"] == {"decode_tok_s": p.predicted.decode_tok_s, "prefill_tok_s": p.predicted.prefill_tok_s,
                               "ready_s": p.predicted.ready_s}
    assert reason["detail"].startswith(f"decode the profile's {p.predicted.decode_tok_s:g} tok/s")
    assert "scaled" not in reason["detail"]
