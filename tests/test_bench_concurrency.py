"""`edgectl bench --concurrency N` and the memory prediction checked on runs it was not fitted to.

The servers are ``tests/fake_server.py`` (real processes on real ports, see test_bench.py): these
tests check the harness's rules — N streams at once, a server that queues them is caught, every
arm is planned for N sequences and llama-server gets ``-np N``, the artifact carries the figures
and the plan's memory prediction against the measured PSS, held out or not. Nothing asserts a timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import HOST, bench, tiny_model

from edgectl.bench.measure import MIN_OVERLAP
from edgectl.bench.prediction import memory_prediction
from edgectl.bench.report import render_text
from edgectl.errors import EdgectlError
from edgectl.probe import probe


@pytest.fixture(scope="module")
def facts():
    return probe(str(HOST), environ={})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path)


# Streams long enough (128 tokens × 20 ms) that threads starting a little apart on a loaded 2-core
# machine still decode together: the overlap rule is what one test checks, not the others' luck.
SLOW = ["--decode-ms", "20"]


def _llama(tmp_path: Path) -> str:
    # the llama.cpp arm needs a binary and a GGUF to be prepared; the fake server stands in for both
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return str(exe)


def test_n_streams_at_once_give_an_aggregate_per_arm(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned", passes=2, concurrency=3,
              options={"stock": SLOW, "planned": SLOW}).to_dict()
    assert a["complete"], a["incomplete_reasons"]
    assert a["concurrency"] == 3
    for name in ("stock", "planned"):
        arm = a["arms"][name]
        assert arm["plan"]["max_num_seqs"] == 3  # every arm is planned for the streams it serves
        for p in arm["passes"]:
            c = p["concurrent_decode"]
            assert c["streams"] == 3 and len(c["stream_decode_tok_s"]) == 3
            assert p["aggregate_decode_tok_s"] == pytest.approx(sum(c["stream_decode_tok_s"]))
            assert c["min_overlap"] >= MIN_OVERLAP
            assert c["tokens"] == 3 * p["decode"]["tokens"]
            assert "t_first" not in p["decode"]  # clock readings of the bench's process stay out
        assert arm["median"]["aggregate_decode_tok_s"] is not None
        # the single-stream figure is still measured alone
        assert arm["median"]["decode_tok_s"] is not None


def test_a_server_that_queues_the_streams_is_not_quoted(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned", passes=1, concurrency=3,
              options={"planned": ["--serial-streams", *SLOW], "stock": SLOW}).to_dict()
    assert not a["complete"]
    rec = a["arms"]["planned"]["passes"][0]
    assert rec["status"] == "invalid"
    assert "did not decode together" in rec["error"]
    assert "aggregate_decode_tok_s" not in rec
    assert a["arms"]["stock"]["passes"][0]["status"] == "ok"


def test_without_concurrency_no_stream_is_added(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "planned", passes=1).to_dict()
    assert a["concurrency"] == 1
    rec = a["arms"]["planned"]["passes"][0]
    assert "concurrent_decode" not in rec and rec["status"] == "ok"
    assert a["arms"]["planned"]["median"]["aggregate_decode_tok_s"] is None


def test_llama_server_gets_one_slot_per_stream(tmp_path, model_dir, facts) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    from bench_helpers import environ, fake_launchers

    from edgectl.bench.core import BenchOptions, run_bench

    opts = BenchOptions(model=str(model_dir), arms="planned,llama.cpp", passes=1, out=tmp_path / "results",
                        max_model_len=1024, start_timeout_s=60, llama_server=_llama(tmp_path), concurrency=4,
                        llama_threads="2",
                        argv=["edgectl", "bench", "test"])
    import edgectl.bench.core as core

    orig = core._gguf_for
    core._gguf_for = lambda model, env: gguf
    try:
        a = run_bench(opts, environ(tmp_path), lambda _m: None, facts=facts,
                      launchers=fake_launchers({"planned": SLOW, "llama.cpp": SLOW})).to_dict()
    finally:
        core._gguf_for = orig
    assert a["complete"], a["incomplete_reasons"]
    cmd = a["arms"]["llama.cpp-t2"]["passes"][0]["command"]
    assert cmd[cmd.index("-np") + 1] == "4" and cmd[cmd.index("-c") + 1] == str(4 * 1024)
    versus = a["versus_llama_cpp"]
    best = versus["against"]["arm"]
    ratio = versus["arms"]["planned"]
    assert ratio["aggregate_decode"] == pytest.approx(
        a["arms"]["planned"]["median"]["aggregate_decode_tok_s"] / a["arms"][best]["median"]["aggregate_decode_tok_s"])


def test_concurrency_below_one_is_refused(tmp_path, model_dir, facts) -> None:
    with pytest.raises(EdgectlError, match="--concurrency 0: at least 1"):
        bench(tmp_path, model_dir, facts, "planned", passes=1, concurrency=0)
    assert not (tmp_path / "results").exists()


# -- the memory prediction -----------------------------------------------------------------------------


def test_the_prediction_is_checked_on_a_run_the_calibration_did_not_see(tmp_path, model_dir, facts) -> None:
    # run 1 records the profile (the calibration); run 2, at another concurrency, is held out
    first = bench(tmp_path, model_dir, facts, "planned", passes=3, record_profile=True)
    assert first.to_dict()["complete"]
    second = bench(tmp_path, model_dir, facts, "stock,planned", passes=1, concurrency=2,
                   options={"stock": SLOW, "planned": SLOW}).to_dict()
    assert second["complete"], second["incomplete_reasons"]
    mp = second["memory_prediction"]["arms"]
    planned = mp["planned"]
    plan = second["arms"]["planned"]["plan"]
    assert plan["profile"]["file"].startswith(str(tmp_path / "profiles"))  # planned from the recorded profile
    assert planned["predicted_bytes"] == plan["memory"]["total_bytes"]
    assert planned["measured_bytes"] == second["arms"]["planned"]["median"]["pss_steady_bytes"]
    assert planned["error"] == pytest.approx(planned["measured_bytes"] / planned["predicted_bytes"] - 1)
    assert planned["check"] == "held_out" and planned["held_out"] is True
    (src,) = [s for s in planned["calibration"]["sources"] if s["figure"] == "runtime.process_bytes"]
    assert src["artifact"] == first.path.name and src["arm"] == "planned"
    # what differs from the configuration the figure was solved from
    assert planned["differs"]["runtime.process_bytes"]["max_num_seqs"] == {"calibration": 1, "here": 2}
    assert "stock" in mp  # unmodified vLLM's plan is a prediction too
    # the text report says which kind of check each error is, and what differs
    (line,) = [ln for ln in render_text(second, None, []).splitlines() if ln.startswith("memory, ")]
    assert "GB (" in line and "held out, differs in " in line and "max_num_seqs" in line


def test_the_calibration_run_is_not_held_out_nor_is_a_repeat_of_its_configuration(tmp_path) -> None:
    profile = tmp_path / "p.yaml"
    artifact = tmp_path / "run.json"
    shipped = Path(__file__).resolve().parents[1] / "profiles" / "x86_64-amx-measured.yaml"
    text = shipped.read_text()
    recorded = "results/2026-12-01-x86_64-amx-smollm2-135m-w4a8-compiled.json"
    assert recorded in text
    profile.write_text(text.replace(recorded, artifact.name))
    plan = {"model": {"name": "m"}, "profile": {"file": str(profile)}, "compilation": "eager",
            "max_model_len": 4096, "max_num_seqs": 1, "memory": {"total_bytes": 1000}}
    arms = {"planned": {"launcher": "worker", "median": {"pss_steady_bytes": 1100}, "plan": plan},
            "llama.cpp": {"launcher": "llama.cpp", "median": {"pss_steady_bytes": 10}, "plan": None}}
    artifact.write_text(json.dumps({"arms": arms}))
    mp = memory_prediction(arms, artifact, roots=[tmp_path])
    assert set(mp["arms"]) == {"planned"}  # llama.cpp has no plan to check
    entry = mp["arms"]["planned"]
    assert entry["check"] == "calibration" and entry["held_out"] is False and entry["error"] == pytest.approx(0.1)
    # the same configuration, another run: a repeat (the old field says only "not the calibration run")
    other = tmp_path / "other.json"
    other.write_text("{}")
    entry = memory_prediction(arms, other, roots=[tmp_path])["arms"]["planned"]
    assert entry["check"] == "repeat" and entry["held_out"] is True
    assert entry["differs"] == {"runtime.process_bytes": {}}
    # another context: held out, saying in what it differs
    longer = {"planned": {**arms["planned"], "plan": {**plan, "max_model_len": 8192}}}
    entry = memory_prediction(longer, other, roots=[tmp_path])["arms"]["planned"]
    assert entry["check"] == "held_out"
    assert entry["differs"] == {"runtime.process_bytes": {"max_model_len": {"calibration": 4096, "here": 8192}}}
    # another configuration in the calibration run itself: no figure was solved from it, held out too
    entry = memory_prediction({**arms, **longer}, artifact, roots=[tmp_path])["arms"]["planned"]
    assert entry["check"] == "held_out" and entry["held_out"] is False  # the old field: "the calibration run"
    # the calibration's artifact cannot be read (not under the roots): unknown, never held out
    entry = memory_prediction(longer, other, roots=[tmp_path / "elsewhere"])["arms"]["planned"]
    assert entry["check"] == "unknown" and "differs" not in entry


def test_the_check_runs_on_an_artifact_from_before_the_bench_made_it(tmp_path, capsys) -> None:
    from edgectl.bench.prediction import main

    artifact = tmp_path / "old.json"
    plan = {"model": {"name": "m"}, "profile": {"file": str(tmp_path / "gone.yaml")}, "compilation": "eager",
            "max_model_len": 2048, "max_num_seqs": 2, "weight_format": "w4a16", "topology": "single-process",
            "memory": {"total_bytes": 1000 << 20}}
    artifact.write_text(json.dumps({"arms": {"planned": {"launcher": "worker", "plan": plan,
                                                         "median": {"pss_steady_bytes": 900 << 20}}}}))
    assert main([str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "old.json planned: m 2048 tok × 2 seq, w4a16, eager, single-process: predicted 1000 MiB, measured 900 MiB, -10.0% (calibration unknown)" in out
    assert main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


# -- the soak ---------------------------------------------------------------------------------------


def test_the_soak_sends_every_kind_of_request_and_sees_a_leak_as_drift(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned", passes=1, soak_s=10,
              options={"planned": ["--leak-kb-per-request", "512"]}).to_dict()
    assert a["complete"], a["incomplete_reasons"]
    assert a["soak_s"] == 10
    leaky, clean = (a["arms"][n]["passes"][0]["soak"] for n in ("planned", "stock"))
    for s in (leaky, clean):
        assert s["errors"] == 0
        assert all(s["requests"][k] > 0 for k in ("chat", "completion", "stream", "fresh-prompt", "dropped-stream"))
        assert len(s["pss_samples"]) >= 20
    # 512 KiB per request over hundreds of requests: the leaking server's PSS grows from settled to final
    assert leaky["pss_final_bytes"] - leaky["pss_settled_bytes"] > 4 << 20
    assert leaky["pss_drift"] > clean["pss_drift"]
    assert a["arms"]["planned"]["median"]["soak_pss_drift"] == leaky["pss_drift"]


def test_a_soak_too_short_to_mean_anything_is_refused(tmp_path, model_dir, facts) -> None:
    with pytest.raises(EdgectlError, match="--soak 3: at least 10 seconds"):
        bench(tmp_path, model_dir, facts, "planned", passes=1, soak_s=3)
