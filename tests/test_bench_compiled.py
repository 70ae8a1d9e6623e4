"""`edgectl bench`: a compiled arm reports its cold start (empty compile cache) and its warm start
(the cache the cold one left) separately, and a warm start that compiled again is not quoted.

The servers are ``tests/fake_server.py`` (real processes on real ports; in compiled mode it
"compiles" into ``VLLM_CACHE_ROOT`` at its first start and reads back ``cache`` at the next, or
compiles at every start with ``--sabotage recompile``). These test the harness's rules, not a
measurement; nothing here asserts a timing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import HOST, bench, tiny_model

from edgectl.probe import probe


@pytest.fixture(scope="module")
def facts():
    return probe(str(HOST), environ={})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path)


def test_a_compiled_arm_starts_cold_then_warm_in_every_pass(tmp_path, model_dir, facts) -> None:
    result = bench(tmp_path, model_dir, facts, "planned,compiled", passes=3)
    a = result.to_dict()
    assert a["complete"] is True, a["incomplete_reasons"]
    compiled = a["arms"]["compiled"]
    for p in compiled["passes"]:
        assert p["status"] == "ok"
        assert p["cold"]["graph"] == "compiled" and p["effective"]["compile"]["source"] == "cache"
        assert p["ready_cold_s"] == p["cold"]["ready_s"] and p["ready_warm_s"] == p["ready_s"]
        assert p["decode_cold_tok_s"] == p["cold"]["decode_tok_s"] is not None
        # two processes, two logs: the cold start's in its own directory
        assert Path(p["cold"]["log"]).is_file() and Path(p["log"]).is_file() and p["cold"]["log"] != p["log"]
        # the pass's compile cache is removed after it
        assert not (Path(p["log"]).parent / "compile-cache").exists()
    for key in ("ready_cold_s", "ready_warm_s", "decode_cold_tok_s"):
        values = [p[key] for p in compiled["passes"]]
        assert compiled["median"][key] == sorted(values)[1]
    # an eager arm starts once per pass and has no cold/warm figures
    planned = a["arms"]["planned"]
    assert all("cold" not in p and "ready_cold_s" not in p for p in planned["passes"])
    assert planned["median"]["ready_cold_s"] is None
    text = result.render_text()
    assert "compiled: compiled mode, two starts per pass: cold (empty compile cache)" in text
    assert " cold / " in text and " warm" in text


def test_every_pass_starts_from_an_empty_cache(tmp_path, model_dir, facts) -> None:
    """Passes do not share a cache: each pass's cold start compiles (else the pass is invalid)."""
    a = bench(tmp_path, model_dir, facts, "compiled", passes=2).to_dict()
    assert [p["cold"]["graph"] for p in a["arms"]["compiled"]["passes"]] == ["compiled", "compiled"]


def test_a_warm_start_that_compiled_again_is_invalid(tmp_path, model_dir, facts) -> None:
    result = bench(tmp_path, model_dir, facts, "planned,compiled", passes=3,
                   options={"compiled": ["--sabotage", "recompile"]})
    a = result.to_dict()
    assert a["complete"] is False
    passes = a["arms"]["compiled"]["passes"]
    assert [p["status"] for p in passes] == ["invalid"] * 3
    assert all("the warm start's graph came from 'compiled'" in p["problems"][0] for p in passes)
    assert all("decode_tok_s" not in p and "ready_warm_s" not in p for p in passes)
    assert a["arms"]["compiled"]["median"] is None
    assert "INCOMPLETE" in result.render_text()
