"""A speech plan's memory prediction is checked against the figures it used: the profile's ``speech``
section, solved from the named rows of scripts/speech_memory.sh's JSON lines (edgectl/bench/prediction.py),
not the text figures. On the committed whisper-base bench run (x86_64-amx) and the committed profile."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.bench.prediction import HELD_OUT, REPEAT, check_label, memory_prediction

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "results" / "2026-12-03-x86_64-amx-whisper-base-speech.json"


def test_a_speech_run_is_a_repeat_or_held_out_against_the_speech_figures(tmp_path):
    arms = json.loads(RUN.read_text())["arms"]
    copy = tmp_path / RUN.name  # another run: not the file any figure was solved from
    out = memory_prediction(arms, copy, [REPO])["arms"]
    figures = {s["figure"] for s in out["planned"]["calibration"]["sources"]}
    assert figures == {"speech.process_bytes", "speech.per_transcription_bytes"}
    # bf16, 4 at once, eager: a configuration the figures were solved from (bf16-s4)
    assert out["planned"]["check"] == REPEAT, out["planned"]
    assert out["planned-float16"]["check"] == HELD_OUT
    assert {k for d in out["planned-float16"]["differs"].values() for k in d} == {"dtype"}
    assert out["planned-w4a8"]["check"] == HELD_OUT
    assert {k for d in out["planned-w4a8"]["differs"].values() for k in d} == {"weight_format"}
    assert check_label(out["planned-w4a8"]) == "held out, differs in weight_format"


def test_a_plan_whose_head_is_the_int8_scan_is_held_out(tmp_path):
    """The speech figures were solved from servers with the dense head (rows written before the scan):
    a plan with the int8 scan differs in what the ledger models (the copy, no packed table)."""
    arms = json.loads(RUN.read_text())["arms"]
    arms["planned"]["plan"]["speech"]["head"] = "w8-scan"
    out = memory_prediction(arms, tmp_path / RUN.name, [REPO])["arms"]
    assert out["planned"]["check"] == HELD_OUT
    assert {k for d in out["planned"]["differs"].values() for k in d} == {"speech_head"}
