"""The plan's speed figures checked against a run (edgectl/bench/speed_prediction.py) and how the
report says a profile is out of date: on a committed artifact and on small made-up ones."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from edgectl.bench import report
from edgectl.bench.speed_prediction import STALE_AT, speed_prediction, stale

REPO = Path(__file__).resolve().parent.parent
# a run on x86_64-amx whose plan still quoted the profile recorded on 2026-12-01
ARTIFACT = REPO / "results" / "2026-12-06-x86_64-amx-smollm2-135m-8-streams-q4_0-noisy-2.json"


def _run(predicted: dict, median: dict, **plan: object) -> dict:
    arm = {"launcher": "worker", "plan": {"predicted": predicted, "profile": {"name": "x86_64-test"}, **plan},
           "median": median, "passes": []}
    return {"complete": True, "provenance": {"model": "m", "passes": 3, "max_model_len": 1024, "probe": {}},
            "arms": {"planned": arm}, "fidelity": {}}


def test_each_figure_of_a_committed_run_is_its_median_against_the_plans_prediction():
    a = json.loads(ARTIFACT.read_text())
    checked = speed_prediction(a["arms"])
    assert set(checked) == {"planned"}  # llama.cpp's arms have no plan
    arm = a["arms"]["planned"]
    predicted, median = arm["plan"]["predicted"], arm["median"]
    figures = checked["planned"]["figures"]
    assert figures["decode"]["error"] == pytest.approx(median["decode_tok_s"] / predicted["decode_tok_s"] - 1)
    assert figures["prefill"]["error"] == pytest.approx(median["prefill_tok_s"] / predicted["prefill_tok_s"] - 1)
    # compiled mode: the plan predicts the start that loads the saved graph
    assert arm["plan"]["compilation"] == "default"
    assert figures["ready"]["measured"] == median["ready_warm_s"]
    assert stale(checked["planned"]) == [w for w, f in figures.items() if abs(f["error"]) > STALE_AT]
    text = report.render_text(a, None, [])
    line = next(ln for ln in text.splitlines() if ln.startswith("speed, the plan's prediction"))
    assert f"decode {predicted['decode_tok_s']:.4g} vs {median['decode_tok_s']:.4g} tok/s" in line
    if stale(checked["planned"]):
        assert "--record-profile" in text and "no longer describes this box" in text


def test_figures_within_the_bound_are_printed_without_a_warning():
    a = _run({"decode_tok_s": 100.0, "prefill_tok_s": 1000.0, "ready_s": 10.0},
             {"decode_tok_s": 110.0, "prefill_tok_s": 800.0, "ready_s": 12.0})
    checked = speed_prediction(a["arms"])["planned"]["figures"]
    assert {w: round(f["error"], 3) for w, f in checked.items()} == {"decode": 0.1, "prefill": -0.2, "ready": 0.2}
    text = report.render_text(a, None, [])
    assert "decode 100 vs 110 tok/s (+10%)" in text and "ready 10 vs 12 s (+20%)" in text
    assert "off by more than" not in text


def test_a_figure_off_by_more_than_the_bound_names_the_profile_and_the_way_to_measure_it_again():
    a = _run({"decode_tok_s": 100.0, "prefill_tok_s": 1000.0}, {"decode_tok_s": 126.0, "prefill_tok_s": 1000.0})
    text = report.render_text(a, None, [])
    assert "off by more than 25%: planned decode — the profile (x86_64-test)" in text
    assert "`edgectl bench m --record-profile`" in text


def test_nothing_is_checked_without_a_prediction_a_text_plan_or_a_complete_run():
    base = _run({"decode_tok_s": 100.0}, {"decode_tok_s": 300.0})
    speech = copy.deepcopy(base)
    speech["arms"]["planned"]["plan"]["speech"] = {"model": "whisper"}
    unpredicted = _run({"decode_tok_s": None}, {"decode_tok_s": 300.0})
    incomplete = {**copy.deepcopy(base), "complete": False, "incomplete_reasons": ["interrupted"]}
    assert speed_prediction(speech["arms"]) == {} and speed_prediction(unpredicted["arms"]) == {}
    for a in (speech, unpredicted, incomplete):
        assert "speed, the plan's prediction" not in report.render_text(a, None, [])
    assert "speed, the plan's prediction" in report.render_text(base, None, [])


def test_a_miss_on_another_model_than_the_profiles_is_named_the_rules():
    """The plan's figures were measured on the profile's model and moved to this one (planner/speed.py):
    the report says so and points at the decode rate's fit, not at recording the profile from this model."""
    a = _run({"decode_tok_s": 100.0, "prefill_tok_s": 1000.0, "measured_on": "smollm2-135m"},
             {"decode_tok_s": 140.0, "prefill_tok_s": 1000.0})
    assert speed_prediction(a["arms"])["planned"]["measured_on"] == "smollm2-135m"
    text = report.render_text(a, None, [])
    line = next(ln for ln in text.splitlines() if "off by more than" in ln)
    assert "planned decode — figures measured on smollm2-135m, moved to m by the planner's rule" in line
    assert "python -m edgectl.bench.decode_rate" in line and "--record-profile" not in line
    # measured on this very model: the profile's age, as before
    same = _run({"decode_tok_s": 100.0, "measured_on": "m"}, {"decode_tok_s": 140.0})
    assert "--record-profile` measures it again" in report.render_text(same, None, [])
