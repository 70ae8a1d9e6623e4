"""The watchdog and start timeouts: the rule (pure), and what the plan says about where its figures
came from.

The worker pings systemd per engine step and while idle (runtime/edgectl_runtime/vllm_plugin/inproc.py), so the
watchdog only has to outlast the longest single step the plan allows: one prefill chunk of
``max_num_batched_tokens`` at the slowest measured prefill rate. Expected values are worked out by
hand in the comments.
"""

from __future__ import annotations

from pathlib import Path

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

from edgectl.contract.plan import Source
from edgectl.planner.service import (
    UNMEASURED_STEP_S,
    longest_step_s,
    start_for_ready,
    watchdog_for_step,
)
from edgectl.profiles import select_profile


def test_the_watchdog_rule():
    # max(30, ceil(3 × step + 10)), at most 600
    assert watchdog_for_step(0.1) == 30  # 10.3 → the floor
    assert watchdog_for_step(6.0) == 30  # 28 → the floor
    assert watchdog_for_step(7.0) == 31  # 31
    assert watchdog_for_step(25.6) == 87  # 76.8 + 10 = 86.8 → 87
    assert watchdog_for_step(UNMEASURED_STEP_S) == 370  # 360 + 10
    assert watchdog_for_step(1000) == 600  # capped


def test_the_longest_step_is_one_chunk_at_the_given_rate():
    assert longest_step_s(512, 256.0) == 2.0
    assert longest_step_s(2048, 256.0) == 8.0
    assert longest_step_s(512, None) == UNMEASURED_STEP_S


def test_the_start_rule():
    # max(180, ceil(3 × ready + 60)), at most 1800; 300 s when not measured
    assert start_for_ready(16.8) == 180  # 110.4 → the floor
    assert start_for_ready(60) == 240
    assert start_for_ready(None) == 960
    assert start_for_ready(1000) == 1800


def test_the_avx2_box_measured_by_edgectl_gets_30_s_and_180_s():
    """The shipped x86_64-avx2 profile was recorded by `edgectl bench --record-profile` on a real
    AVX2 box: 512 tokens at its slowest prefill pass (192.21 tok/s, on SmolLM2 itself: this config-only
    shape has its linear layers, so the figure is not moved) = 2.7 s → watchdog 30 (the floor); ready in
    16.8 s → start 180 (the floor). Planned in w4a16, the format that box's own figures are of (by
    default the plan takes w4a8 from the emulated AVX2 profile: tests/test_plan_emulated_formats.py)."""
    facts = host_facts("kvm-epyc-avx2-2c")
    p = make_plan(facts, shape(SMOLLM2), shipped_profiles(), weight_format="w4a16")
    assert p.profile.name == "x86_64-avx2" and str(p.profile.kind) == "measured"
    assert (p.timeouts.watchdog_s, p.timeouts.start_s) == (30, 180)
    (reason,) = reasons_by_decision(p)["timeouts"]
    assert reason["source"] == Source.PROFILE
    assert "2.7 s at the slowest prefill rate 192 tok/s (200.65 tok/s (median, 3 passes, range 192.21–210.14" in reason["detail"]
    assert "scaled" not in reason["detail"]
    assert "measured with edgectl bench on AMD EPYC" in reason["detail"]
    assert "ready in 16.8 s" in reason["detail"]


SLOW = """\
  w4a16:
    runs: true
    prefill_tok_s: {median: 40.0, min: 20.0, max: 41.0, passes: 3}
"""


def test_the_slowest_pass_and_the_chunk_size_set_the_watchdog(tmp_path: Path):
    """A slow measured box: the slowest pass prefills 20 tok/s (median 40). 512 tokens: 25.6 s →
    ceil(76.8 + 10) = 87 s (the median would give 49); with 1024-token chunks 51.2 s → 164 s."""
    prof = profile_from_yaml(tmp_path, profile_yaml(formats=SLOW, extra="runtime:\n  ready_s: {median: 60, passes: 3}\n"))
    facts = host_facts("kvm-xeon-avx512-2c")
    assert select_profile([prof], facts)[0] is prof
    p = make_plan(facts, shape(SMOLLM2), [prof], weight_format="w4a16")
    assert p.max_num_batched_tokens == 512
    assert p.timeouts.watchdog_s == 87
    assert p.timeouts.start_s == 240  # 3 × 60 + 60
    (reason,) = reasons_by_decision(p)["timeouts"]
    assert "25.6 s at the slowest prefill rate 20 tok/s" in reason["detail"]


def test_a_flag_wins_and_says_so():
    p = make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2), shipped_profiles(), watchdog_s=12)
    assert p.timeouts.watchdog_s == 12
    (reason,) = reasons_by_decision(p)["timeouts"]
    assert reason["source"] == Source.FLAG and "--watchdog-sec" in reason["detail"]


def test_an_external_figure_is_named_external():
    """This development box's class (x86_64-amx) has only published figures from another machine."""
    p = make_plan(host_facts("xeon-spr-amx-2s"), shape(SMOLLM2), shipped_profiles())
    assert str(p.profile.kind) == "external"
    (reason,) = reasons_by_decision(p)["timeouts"]
    assert "an external figure, not measured with edgectl" in reason["detail"]
    assert "no measured time to ready" in reason["detail"]


def test_a_class_nobody_measured_says_it_guessed():
    p = make_plan(host_facts("arm64-board"), shape(SMOLLM2), shipped_profiles())
    assert str(p.profile.kind) == "fallback"
    (reason,) = reasons_by_decision(p)["timeouts"]
    assert reason["source"] == Source.FALLBACK
    assert f"taken as {UNMEASURED_STEP_S:.0f} s" in reason["detail"]
    assert p.timeouts.watchdog_s == 370


EMULATED = "x86_64-avx2 emulated on x86_64-amx: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
AVX2_MATCH = "  arch: x86_64\n  isa_all: [avx2, fma]\n  isa_none: [avx512f]\n"
FAST = "  w4a16:\n    runs: true\n    prefill_tok_s: {median: 900.0, min: 800.0, max: 950.0, passes: 3}\n"


@pytest.mark.parametrize("order", ["emulated first", "real first"])
def test_an_emulated_profile_is_labelled_and_loses_to_a_real_one(tmp_path: Path, order: str):
    emulated = profile_from_yaml(tmp_path, profile_yaml(name="avx2-emulated", device_class="x86_64-avx2",
                                                        match=AVX2_MATCH, formats=FAST,
                                                        extra=f"emulated: '{EMULATED}'\n"), "e.yaml")
    real = profile_from_yaml(tmp_path, profile_yaml(name="avx2-real", device_class="x86_64-avx2",
                                                    match=AVX2_MATCH, formats=SLOW), "r.yaml")
    assert emulated.emulated == EMULATED and real.emulated is None
    facts = host_facts("kvm-epyc-avx2-2c")
    both = [emulated, real] if order == "emulated first" else [real, emulated]
    assert select_profile(both, facts)[0] is real
    # alone, the emulated one is used, and every reason that rests on it says so
    p = make_plan(facts, shape(SMOLLM2), [emulated], weight_format="w4a16")
    by = reasons_by_decision(p)
    assert "emulated ISA" in by["profile"][0]["detail"]
    assert f"on an emulated ISA ({EMULATED})" in by["timeouts"][0]["detail"]


def test_only_a_measured_profile_can_be_emulated(tmp_path: Path):
    from edgectl.errors import EdgectlError

    text = profile_yaml(extra=f"emulated: '{EMULATED}'\n").replace("kind: measured", "kind: external")
    text = text.replace('    edgectl_commit: "0165d14"\n',
                        '    edgectl_commit: "0165d14"\n    external: true\n    reference: "somewhere"\n')
    with pytest.raises(EdgectlError, match="only a measured profile can be emulated"):
        profile_from_yaml(tmp_path, text)
