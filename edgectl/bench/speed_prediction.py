"""The plan's speed figures checked against the run: predicted decode, prefill and time to ready
vs the arm's medians.

``edgectl plan`` prints a decode and prefill rate and a time to ready from the device profile
(planner/speed.py ``predict``: the profile's figures for the plan's format and mode, moved to
the model by the bytes a token reads and its linear layers' parameters). A profile recorded before
a kernel or engine change keeps its old figures, and the plan keeps quoting them: a bench run on the
box is where that shows. Each
arm with a text plan gets its three pairs; a figure off by more than STALE_AT is named, with the
way to bring the profile up to date (``--record-profile``).
"""

from __future__ import annotations

from typing import Any

# Off by more than this fraction, a predicted figure is called out of date: the noise gate's spread
# (bench/noise.py, 1.25) is what one run may differ from another by; a profile that far off is
# describing another box, or the same box before a change.
STALE_AT = 0.25

# (what, the plan's predicted key, the arm's measured keys in order of preference, unit)
FIGURES = (
    ("decode", "decode_tok_s", ("decode_tok_s",), "tok/s"),
    ("prefill", "prefill_tok_s", ("prefill_tok_s",), "tok/s"),
    # in compiled mode the plan predicts a start that loads the saved graph: the warm start
    ("ready", "ready_s", ("ready_warm_s", "ready_s"), "s"),
)


def speed_prediction(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm with a text plan that predicts something: each figure's predicted and measured
    value and the error (measured / predicted − 1)."""
    out: dict[str, dict[str, Any]] = {}
    for name, arm in arms.items():
        plan, median = arm.get("plan"), arm.get("median") or {}
        if not isinstance(plan, dict) or plan.get("speech") or plan.get("vision"):
            continue
        predicted = plan.get("predicted") or {}
        figures = {}
        for what, key, measured_keys, unit in FIGURES:
            want = predicted.get(key)
            got = next((median[k] for k in measured_keys if median.get(k) is not None), None)
            if want and got:
                figures[what] = {"predicted": want, "measured": got, "error": got / want - 1, "unit": unit}
        if figures:
            out[name] = {"profile": (plan.get("profile") or {}).get("name"), "figures": figures,
                         "measured_on": predicted.get("measured_on")}
    return out


def stale(entry: dict[str, Any]) -> list[str]:
    """The figures of one arm's entry off by more than STALE_AT."""
    return [what for what, f in entry["figures"].items() if abs(f["error"]) > STALE_AT]
