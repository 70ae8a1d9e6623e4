"""A format the class's own profile never measured, taken from an emulated profile of the class
(edgectl/planner/profile.py ``with_emulated_formats``): scaled by a format both measured, named
"emulated" wherever it is cited, never taken over the class's own figure."""

from __future__ import annotations

import pytest
from plan_helpers import (
    SMOLLM2,
    host_facts,
    make_plan,
    profile_from_yaml,
    profile_yaml,
    reasons_by_decision,
    shape,
    shipped_profiles,
)

from edgectl.contract.plan import WeightFormat
from edgectl.planner.profile import emulated_companion, with_emulated_formats

AVX2_HOST = "kvm-epyc-avx2-2c"
AVX2_MATCH = "  arch: x86_64\n  isa_all: [avx2, fma]\n  isa_none: [avx512f]\n"


def _format(name: str, decode: float, prefill: float, ratio: float | None = None) -> str:
    text = (f"  {name}:\n    runs: true\n    decode_tok_s: {{median: {decode}, min: {decode * 0.9}, max: {decode * 1.1}, "
            f"passes: 3}}\n    prefill_tok_s: {{median: {prefill}, passes: 3}}\n")
    if ratio is not None:
        text += f"    weights_bytes_ratio: {{median: {ratio}, passes: 3}}\n"
    return text


@pytest.fixture()
def profiles(tmp_path):
    """The class's own profile (w4a16 and bf16 measured) and an emulated one of the class that measured
    w4a16 and w4a8 in one run (both 4x faster: a bigger CPU)."""
    own = profile_from_yaml(tmp_path, profile_yaml(
        name="own-avx2", device_class="x86_64-avx2", match=AVX2_MATCH,
        formats=_format("w4a16", 25.0, 200.0) + _format("bf16", 20.0, 80.0)), "own.yaml")
    emulated = profile_from_yaml(tmp_path, profile_yaml(
        name="avx2-emulated", device_class="x86_64-avx2", match=AVX2_MATCH,
        formats=_format("w4a16", 100.0, 400.0) + _format("w4a8", 150.0, 1000.0, ratio=1.02),
        extra="emulated: 'x86_64-avx2 emulated on x86_64-amx: ATEN_CPU_CAPABILITY=avx2'\n"), "emulated.yaml")
    return own, emulated


def test_a_format_only_the_emulation_measured_is_scaled_by_one_both_measured(profiles):
    own, emulated = profiles
    facts = host_facts(AVX2_HOST)
    assert emulated_companion(own, [own, emulated], facts) is emulated
    completed, said = with_emulated_formats(own, [own, emulated], facts)
    w4a8 = completed.formats[WeightFormat.W4A8]
    assert w4a8.decode_tok_s.median == pytest.approx(150.0 * 25.0 / 100.0)  # its own figure x ours / theirs (w4a16)
    assert w4a8.decode_tok_s.min == pytest.approx(135.0 * 0.25) and w4a8.decode_tok_s.max == pytest.approx(165.0 * 0.25)
    assert w4a8.prefill_tok_s.median == pytest.approx(1000.0 * 200.0 / 400.0)
    assert w4a8.weights_bytes_ratio.median == pytest.approx(1.02)  # bytes: as the emulation measured them
    assert "(emulated)" in w4a8.decode_tok_s.source.key and "emulated on" in w4a8.decode_tok_s.source.notes
    assert completed.formats[WeightFormat.W4A16] == own.formats[WeightFormat.W4A16]  # ours kept as they are
    assert "w4a8" in said and "avx2-emulated" in said and "re-measure" in said


def test_the_plan_ranks_the_scaled_figure_and_names_the_emulation(profiles):
    own, emulated = profiles
    p = make_plan(host_facts(AVX2_HOST), shape(SMOLLM2), [own, emulated], max_model_len=2048)
    assert p.weight_format is WeightFormat.W4A8  # 37.5 (scaled) against the class's own 25.0
    why = reasons_by_decision(p)
    assert "(emulated)" in why["weight_format"][0]["detail"]
    assert "taken from avx2-emulated" in why["profile"][0]["detail"]
    assert p.predicted.decode_tok_s == pytest.approx(37.5)


def test_without_the_emulated_profile_nothing_changes(profiles):
    own, _ = profiles
    p = make_plan(host_facts(AVX2_HOST), shape(SMOLLM2), [own], max_model_len=2048)
    assert p.weight_format is WeightFormat.W4A16  # w4a8 is measured-only: not measured, not planned
    assert "w4a8" in reasons_by_decision(p)["formats_not_runnable"][0]["detail"]


def test_the_class_own_figure_wins_over_an_emulated_one(tmp_path, profiles):
    _, emulated = profiles
    own = profile_from_yaml(tmp_path, profile_yaml(
        name="own-avx2", device_class="x86_64-avx2", match=AVX2_MATCH,
        formats=_format("w4a16", 25.0, 200.0) + _format("w4a8", 20.0, 300.0)), "own2.yaml")
    completed, said = with_emulated_formats(own, [own, emulated], host_facts(AVX2_HOST))
    assert completed is own and said == ""
    assert make_plan(host_facts(AVX2_HOST), shape(SMOLLM2), [own, emulated],
                     max_model_len=2048).weight_format is WeightFormat.W4A16


def test_no_shared_format_or_another_class_borrows_nothing(tmp_path, profiles):
    own, _ = profiles
    lonely = profile_from_yaml(tmp_path, profile_yaml(
        name="lonely", device_class="x86_64-avx2", match=AVX2_MATCH, formats=_format("w4a8", 150.0, 1000.0),
        extra="emulated: 'held down'\n"), "lonely.yaml")
    assert with_emulated_formats(own, [own, lonely], host_facts(AVX2_HOST)) == (own, "")
    other = profile_from_yaml(tmp_path, profile_yaml(
        name="other-class", device_class="x86_64-avx512", match="  arch: x86_64\n  isa_all: [avx2]\n",
        formats=_format("w4a16", 100.0, 400.0) + _format("w4a8", 150.0, 1000.0), extra="emulated: 'held down'\n"),
        "other.yaml")
    assert with_emulated_formats(own, [own, other], host_facts(AVX2_HOST)) == (own, "")


def test_an_avx2_box_is_planned_edgectls_kernels_from_the_shipped_profiles():
    """What `edgectl plan` gives a real AVX2 box: the shipped emulated profile's w4a8 (and its compiled
    mode), scaled by the class's own w4a16 (each figure read from the shipped files, not restated here)."""
    facts, shipped = host_facts(AVX2_HOST), list(shipped_profiles())
    p = make_plan(facts, shape(SMOLLM2), shipped, max_model_len=2048)
    own = next(x for x in shipped if x.name == p.profile.name)
    assert not own.emulated and WeightFormat.W4A8 not in own.formats
    companion = emulated_companion(own, shipped, facts)
    assert companion is not None
    completed, said = with_emulated_formats(own, shipped, facts)
    assert said and said in reasons_by_decision(p)["profile"][0]["detail"]
    compiled = completed.compiled
    best = (compiled.decode_tok_s if str(p.compilation) == "default" and compiled is not None
            else completed.formats[p.weight_format].decode_tok_s)
    assert p.predicted.decode_tok_s == pytest.approx(best.median)
    scale = own.formats[WeightFormat.W4A16].decode_tok_s.median / companion.formats[WeightFormat.W4A16].decode_tok_s.median
    w4a8_eager = companion.formats[WeightFormat.W4A8].decode_tok_s.median * scale
    assert completed.formats[WeightFormat.W4A8].decode_tok_s.median == pytest.approx(w4a8_eager, abs=0.006)
    if w4a8_eager > own.formats[WeightFormat.W4A16].decode_tok_s.median:
        assert p.weight_format is WeightFormat.W4A8
        assert "(emulated)" in reasons_by_decision(p)["weight_format"][0]["detail"]
