"""``python -m edgectl.bench.decode_rate``: the rate a decode step reads one more byte at, from two
committed bench runs of two models on x86_64-amx; and the runs it refuses to fit."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
import yaml

from edgectl.bench.decode_rate import fit, main
from edgectl.errors import EdgectlError

RESULTS = Path(__file__).resolve().parents[1] / "results"
SMALL = RESULTS / "2026-12-07-x86_64-amx-smollm2-135m-q4_0-quiet.json"
BIG = RESULTS / "2026-12-07-x86_64-amx-gemma3-270m-q4_k_m-w5.json"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _point(doc: dict) -> tuple[float, float]:
    passes = doc["arms"]["planned"]["passes"]
    return (statistics.median(p["decode_tok_s"] for p in passes),
            statistics.median(p["weights_bytes_per_token"] for p in passes))


def test_the_slope_between_the_two_medians_and_its_pass_pairs():
    small, big = _load(SMALL), _load(BIG)
    (d_s, b_s), (d_b, b_b) = _point(small), _point(big)
    want = (b_b - b_s) / (1 / d_b - 1 / d_s) / 1e9
    got = fit(big, small)  # either order
    assert got["figure"]["median"] == pytest.approx(want, abs=0.01)
    assert got["figure"]["min"] <= got["figure"]["median"] <= got["figure"]["max"]
    assert got["figure"]["passes"] == 3
    assert got["weight_format"] == "w4a8" and got["compilation"] == "default"
    assert set(got["models"]) == {"smollm2-135m", "gemma3-270m"}
    # what does not read weights, on the smaller model: its time a token minus its bytes at the rate
    assert got["fixed_ms"] == pytest.approx(1e3 * (1 / d_s - b_s / (want * 1e9)), abs=0.01)


def test_runs_that_cannot_make_a_rate_are_refused():
    small, big = _load(SMALL), _load(BIG)
    with pytest.raises(EdgectlError, match="less than 1.5× apart"):
        fit(small, copy.deepcopy(small))
    other = copy.deepcopy(big)
    other["arms"]["planned"]["plan"]["compilation"] = "eager"
    with pytest.raises(EdgectlError, match="differ in compilation"):
        fit(small, other)
    faster = copy.deepcopy(big)
    for p in faster["arms"]["planned"]["passes"]:
        p["decode_tok_s"] = 1000.0
    with pytest.raises(EdgectlError, match="the host changed between the runs"):
        fit(small, faster)
    with pytest.raises(EdgectlError, match="no arm 'eager'"):
        fit(small, big, arm="eager")


def test_the_command_prints_the_figure_or_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main([str(SMALL), str(BIG)]) == 0
    out = capsys.readouterr().out
    figure = yaml.safe_load(out)["decode_weight_gbps"]
    assert figure == fit(_load(SMALL), _load(BIG))["figure"]
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert main([str(SMALL), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: not a readable bench artifact") and err.count("\n") == 1
