"""Eager or compiled, chosen per device class from the profile's figures for both modes; the flag
still overrides; in compiled mode the predictions, the start timeout and the memory are compiled
mode's own. Profiles are written by the test (never the shipped ones, which may be re-recorded)."""

from __future__ import annotations

import math
from pathlib import Path

from plan_helpers import (
    SMOLLM2,
    host_facts,
    make_plan,
    profile_from_yaml,
    profile_yaml,
    reasons_by_decision,
    shape,
)

from edgectl.output import MiB
from edgectl.planner.ledger import FALLBACK_COMPILE_PEAK_RATIO, MAX_HEADROOM
from edgectl.planner.service import MIN_START_S, UNMEASURED_READY_S

EAGER = ("  w4a16:\n    runs: true\n"
         "    decode_tok_s: {median: 50.0, min: 49.0, max: 52.0, passes: 3}\n"
         "    prefill_tok_s: {median: 500.0, min: 490.0, max: 510.0, passes: 3}\n")
RUNTIME = ("runtime:\n  ready_s: {median: 11.0, min: 10.0, max: 12.0, passes: 3}\n"
           "  process_bytes: {median: 800000000, min: 790000000, max: 810000000, passes: 3}\n")


def compiled_block(decode_min: float, decode_median: float, *, cold: float = 120.0, extra: int = 150_000_000) -> str:
    return ("compiled:\n  weight_format: w4a16\n"
            f"  decode_tok_s: {{median: {decode_median}, min: {decode_min}, max: {decode_median + 2}, passes: 3}}\n"
            "  prefill_tok_s: {median: 600.0, min: 590.0, max: 610.0, passes: 3}\n"
            f"  ready_cold_s: {{median: {cold}, min: {cold - 5}, max: {cold + 5}, passes: 3}}\n"
            "  ready_warm_s: {median: 9.0, min: 8.5, max: 9.5, passes: 3}\n"
            f"  extra_bytes: {{median: {extra}, min: {extra}, max: {extra}, passes: 3}}\n")


def _plan(tmp_path: Path, compiled: str = "", **request):
    prof = profile_from_yaml(tmp_path, profile_yaml(formats=EAGER, extra="compilation: eager\n" + RUNTIME + compiled))
    return make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), [prof], **request)


def test_compiled_is_chosen_where_every_compiled_pass_decodes_faster(tmp_path: Path):
    p = _plan(tmp_path, compiled_block(decode_min=80.0, decode_median=84.0))
    assert str(p.compilation) == "default"
    why = reasons_by_decision(p)["compilation"][0]
    assert why["source"] == "profile"
    # the reason cites the figures: both decodes, the cold and the warm start
    for cited in ("84 tok/s", "50 tok/s", "120 s", "9 s", "later starts load the saved graph"):
        assert cited in why["detail"], (cited, why["detail"])
    # compiled mode's own predictions: its decode, its warm start
    assert p.predicted.ready_s == 9.0
    assert p.predicted.decode_tok_s > 60
    # the first start compiles: the start timeout covers 3 × the cold figure
    assert p.timeouts.start_s >= 3 * 120
    # and its memory: the eager ledger plus what compiled mode measured over it
    eager = _plan(tmp_path, compiled_block(decode_min=80.0, decode_median=84.0), compilation="eager")
    assert p.memory.runtime_bytes - eager.memory.runtime_bytes == 150_000_000
    assert "measured over eager in compiled mode" in reasons_by_decision(p)["runtime_bytes"][0]["detail"]


def test_eager_stays_where_compiled_is_not_faster_beyond_the_spread(tmp_path: Path):
    # compiled's slowest pass (51) is within eager's range (49-52): not faster beyond the spread
    p = _plan(tmp_path, compiled_block(decode_min=51.0, decode_median=60.0))
    assert str(p.compilation) == "eager"
    why = reasons_by_decision(p)["compilation"][0]
    assert why["source"] == "profile" and why["detail"].startswith("eager: compiled mode does not decode faster")
    assert p.predicted.ready_s == 11.0


def test_the_flag_overrides_the_measured_choice(tmp_path: Path):
    block = compiled_block(decode_min=80.0, decode_median=84.0)
    eager = _plan(tmp_path, block, compilation="eager")
    assert str(eager.compilation) == "eager"
    why = reasons_by_decision(eager)["compilation"][0]
    assert why["source"] == "flag" and "84 tok/s" in why["detail"]
    slow = compiled_block(decode_min=40.0, decode_median=45.0)
    assert str(_plan(tmp_path, slow, compilation="default").compilation) == "default"


def test_without_compiled_figures_compiled_mode_gets_the_unmeasured_start(tmp_path: Path):
    p = _plan(tmp_path, compilation="default")
    assert str(p.compilation) == "default"
    assert p.timeouts.start_s == max(MIN_START_S, UNMEASURED_READY_S * 3 + 60)
    assert "compiled mode's own memory is not measured here" in reasons_by_decision(p)["runtime_bytes"][0]["detail"]
    # and the eager plan from the same profile is unchanged by any of this
    assert str(_plan(tmp_path).compilation) == "eager"


# w4a16 decodes faster eager (50) than w4a8 (45), but w4a8 was measured compiled (84): the plan
# must run a measured combination, w4a8 compiled, not w4a16 in a mode nobody measured it in.
TWO_FORMATS = EAGER + ("  w4a8:\n    runs: true\n"
                       "    decode_tok_s: {median: 45.0, min: 44.0, max: 46.0, passes: 3}\n"
                       "    prefill_tok_s: {median: 900.0, min: 890.0, max: 910.0, passes: 3}\n")


def _two(tmp_path: Path, **request):
    block = compiled_block(decode_min=80.0, decode_median=84.0).replace("weight_format: w4a16", "weight_format: w4a8")
    prof = profile_from_yaml(tmp_path, profile_yaml(formats=TWO_FORMATS, extra="compilation: eager\n" + RUNTIME + block))
    return make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), [prof], **request)


def test_compiled_mode_runs_the_format_it_was_measured_with(tmp_path: Path):
    p = _two(tmp_path)
    assert (str(p.weight_format), str(p.compilation)) == ("w4a8", "default")
    why = reasons_by_decision(p)["weight_format"][0]
    assert "84 tok/s" in why["detail"] and "in compiled mode" in why["detail"] and "w4a16 50" in why["detail"]
    assert p.predicted.decode_tok_s > 60 and p.predicted.ready_s == 9.0  # compiled w4a8's own figures
    # eager asked for: the eager ranking again (w4a16 50 > w4a8 45)
    eager = _two(tmp_path, compilation="eager")
    assert (str(eager.weight_format), str(eager.compilation)) == ("w4a16", "eager")


def test_a_format_not_measured_compiled_stays_eager_when_asked_for(tmp_path: Path):
    p = _two(tmp_path, weight_format="w4a16")
    assert (str(p.weight_format), str(p.compilation)) == ("w4a16", "eager")
    why = reasons_by_decision(p)["compilation"][0]
    assert "measured in eager mode only" in why["detail"] and "measured for w4a8" in why["detail"]
    # the format that was measured compiled, asked for by name, still gets compiled mode
    assert str(_two(tmp_path, weight_format="w4a8").compilation) == "default"


def test_the_memory_limit_holds_the_compiling_first_start(tmp_path: Path):
    """The first start of a compiled plan compiles inside the service's cgroup (inductor and
    cc1plus beside the loaded model): MemoryMax is sized by that start's measured peak when it is
    above the load peak, and by a stated fallback when the profile has no such figure."""
    runtime = RUNTIME + "  load_peak_ratio: {median: 1.02, min: 1.0, max: 1.04, passes: 3}\n"
    block = compiled_block(decode_min=80.0, decode_median=84.0) + \
        "  cold_peak_ratio: {median: 1.25, min: 1.2, max: 1.3, passes: 3}\n"

    def plan(compiled: str, **request):
        prof = profile_from_yaml(tmp_path, profile_yaml(formats=EAGER, extra="compilation: eager\n" + runtime + compiled))
        return make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), [prof], **request)

    def limit(p, ratio):
        return int(math.ceil(p.memory.total_bytes * ratio * MAX_HEADROOM / MiB) * MiB)

    compiled, eager = plan(block), plan(block, compilation="eager")
    assert str(compiled.compilation) == "default" and str(eager.compilation) == "eager"
    assert compiled.memory.limit_bytes == limit(compiled, 1.25)
    assert eager.memory.limit_bytes == limit(eager, 1.02)  # an eager start compiles nothing
    why = reasons_by_decision(compiled)["memory_limit"][0]
    assert why["source"] == "profile" and "the compiling first start's peak 1.25" in why["detail"]
    # compiled mode asked for where the profile never measured its first start: the fallback, said so
    unmeasured = plan(compiled_block(decode_min=80.0, decode_median=84.0))
    assert unmeasured.memory.limit_bytes == limit(unmeasured, FALLBACK_COMPILE_PEAK_RATIO)
    why = reasons_by_decision(unmeasured)["memory_limit"][0]
    assert why["source"] == "fallback" and "not measured here" in why["detail"]
