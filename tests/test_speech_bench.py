"""The speech bench's bookkeeping, with no engine: the run order, the clips each figure is read
from, a pass's figures, the summary and the comparisons from recorded pass records, the anchors'
driver output, an anchor pass with a stand-in driver, and bad command lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from models_helpers import run_cli

from edgectl.bench.arms import BenchContext, Crashed
from edgectl.bench.grid import rotated
from edgectl.bench.speech import measure
from edgectl.bench.speech import report as speech_report
from edgectl.bench.speech.arms import ARMS, AnchorArm
from edgectl.bench.speech.runner import ClipPlan, run_grid
from edgectl.bench.stock_vllm import StockVllmArm, engine_root_cause

# -- the clips --------------------------------------------------------------------------------------


def clip_set(tmp_path: Path) -> Path:
    """A clips.json like the shipped set's: sentence clips, the 5 s and the ~30 s rtf clips."""
    rows = [{"id": f"s{i:02d}", "seconds": 3.0 + i / 10, "text": f"sentence number {i} is here", "use": "wer"}
            for i in range(1, 4)]
    rows += [{"id": "rtf-5s", "seconds": 5.0, "text": "five seconds of speech", "use": "rtf"},
             {"id": "rtf-30s", "seconds": 28.8, "text": "thirty seconds of speech", "use": "rtf"}]
    for r in rows:
        (tmp_path / f"{r['id']}.wav").write_bytes(b"RIFF")
        r.update(file=f"{r['id']}.wav", voice="en", speed=150, noise=None, sha256="0" * 64)
    path = tmp_path / "clips.json"
    path.write_text(json.dumps({"schema": "edgectl.speech-clips/1", "sample_rate": 16000, "clips": rows}))
    return path


def exact_score(triples: list[tuple[str, str, str]]) -> dict:
    """A stand-in for wer.py: the share of clips not transcribed exactly."""
    return {"wer": sum(ref != hyp for _, ref, hyp in triples) / len(triples)}


def test_each_arm_runs_once_per_pass_and_the_order_rotates() -> None:
    order = rotated(["a", "b", "c"], 3)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1), ("c", 2), ("a", 2), ("b", 2)]
    assert [n for n, i in order if i == 1][0] == "b"  # no arm always first


def test_the_figures_are_read_from_the_rtf_clips(tmp_path: Path) -> None:
    clips = measure.read_clips(clip_set(tmp_path))
    choice = measure.choose(clips)
    assert (choice.short.id, choice.window.id, choice.longest.id) == ("rtf-5s", "rtf-30s", "rtf-30s")
    assert [c.id for c in choice.together] == [f"rtf-30s#{i}" for i in range(1, 5)]
    assert {c.path for c in choice.together} == {choice.window.path}

    results = [{"id": c.id, "text": c.text, "wall_s": c.seconds / 10} for c in clips]
    results[0]["text"] = "something else"
    f = measure.figures(results, clips, choice, exact_score)
    assert f["wer"] == pytest.approx(1 / 5)
    assert f["rtf_5s"] == pytest.approx(0.1) and f["rtf_30s"] == pytest.approx(0.1)
    assert f["transcript_s"] == pytest.approx(2.88)
    with pytest.raises(measure.MeasurementFailed, match="no result for 1 clip"):
        measure.figures(results[1:], clips, choice, exact_score)
    assert measure.aggregate(choice.together, 10.0, 14.0) == pytest.approx(4 * 28.8 / 4)


# -- the summary from recorded passes ---------------------------------------------------------------


def rec(arm: str, i: int, wer: float, rtf30: float, agg: float, pss: int, status: str = "ok") -> dict:
    r = {"arm": arm, "pass": i, "status": status, "problems": [], "error": None}
    if status == "ok":
        r.update(wer=wer, rtf_5s=rtf30 * 1.5, rtf_30s=rtf30, transcript_s=rtf30 * 28.8, aggregate_audio_s_per_s=agg,
                 ready_s=10.0 + i, pss_steady_bytes=pss, pss_peak_bytes=pss * 2, processes=1,
                 together_best="batched" if arm.startswith("faster") else "requests")
    else:
        r["error"] = "the server exited with code 1 before it was ready"
    return r


def artifact_of(records: dict[str, list[dict]], passes: int) -> dict:
    a = {"provenance": {"model": "whisper-base", "passes": passes, "device_class": "x86_64-amx",
                        "probe": {"device_class": "x86_64-amx", "topology": {"usable_cpus": [0, 1]},
                                  "cpu": {"model_name": "Intel(R) Xeon(R) Processor",
                                          "signature": "family 6 model 207 stepping 2"}},
                        "clips": {"dir": "/c", "count": 24, "audio_s": 120.0, "short": "rtf-5s", "window": "rtf-30s",
                                  "longest": "rtf-30s", "together": ["rtf-30s#1"]}},
         "arms": {n: {"launcher": "anchor" if n.startswith("faster") else "worker", "passes": [], "plan": None}
                  for n in records}, "skipped": {"whisper.cpp": "no pywhispercpp"}}
    speech_report.finish(a, records, passes)
    return a


RECORDS = {
    "planned": [rec("planned", i, 0.050, r, g, 900_000_000) for i, (r, g) in enumerate([(0.040, 30.0), (0.042, 31.0),
                                                                                      (0.041, 30.5)])],
    "stock": [rec("stock", i, 0.052, r, g, 2_800_000_000) for i, (r, g) in enumerate([(0.11, 15.0), (0.12, 16.0),
                                                                                    (0.115, 15.5)])],
    "faster-whisper-int8": [rec("faster-whisper-int8", i, 0.045, r, g, 340_000_000)
                            for i, (r, g) in enumerate([(0.060, 12.0), (0.062, 12.5), (0.061, 12.2)])],
    "faster-whisper-float32": [rec("faster-whisper-float32", i, 0.044, r, g, 710_000_000)
                               for i, (r, g) in enumerate([(0.080, 9.0), (0.082, 9.5), (0.081, 9.2)])],
}


def test_a_complete_quiet_grid_is_summarised_and_compared_with_faster_whispers_best() -> None:
    a = artifact_of(RECORDS, 3)
    assert a["complete"] and a["quotable"] and a["noise"]["quiet"]
    planned = a["arms"]["planned"]
    assert planned["median"]["rtf_30s"] == pytest.approx(0.041)
    assert (planned["min"]["rtf_30s"], planned["max"]["rtf_30s"]) == (0.040, 0.042)
    vs = a["versus_faster_whisper"]
    # each figure against faster-whisper's best arm for it
    assert vs["reference_arms"] == {"wer": "faster-whisper-float32", "rtf_30s": "faster-whisper-int8",
                                    "aggregate_audio_s_per_s": "faster-whisper-int8"}
    p = vs["arms"]["planned"]
    assert p["wer_points"] == pytest.approx(0.6) and p["wer_holds"] is True
    assert p["rtf_30s_ratio"] == pytest.approx(0.041 / 0.061) and p["rtf_30s_holds"] is True
    assert p["aggregate_ratio"] == pytest.approx(30.5 / 12.2) and p["aggregate_holds"] is True
    s = vs["arms"]["stock"]
    assert s["rtf_30s_holds"] is False and s["aggregate_holds"] is False  # 15.5 / 12.2 < 1.5
    assert set(vs["arms"]) == {"planned", "stock"}  # the anchors are the reference, not compared

    text = speech_report.render_text(a, None, [])
    assert "on x86_64-amx — complete" in text
    # one class spans several CPUs: the silicon is named beside it
    assert ("machine: x86_64-amx (Intel(R) Xeon(R) Processor, family 6 model 207 stepping 2; 2 usable CPUs)"
            in text)
    assert "4.1 [4.0–4.2]" not in text and "0.041 [0.040–0.042]" in text  # RTF median [min–max]
    assert "5.0" in text  # planned's WER 5.0 %
    assert "30.5 [30.0–31.0] (requests)" in text and "12.2 [12.0–12.5] (batched)" in text
    assert "skipped whisper.cpp: no pywhispercpp" in text
    assert "WER +0.6 points (bar ≤ +1: holds)" in text


def test_a_noisy_arm_makes_the_run_not_quotable() -> None:
    noisy = {**RECORDS, "stock": [rec("stock", i, 0.052, r, 15.0, 2_800_000_000)
                                  for i, r in enumerate([0.11, 0.30, 0.115])]}
    a = artifact_of(noisy, 3)
    assert a["complete"] and not a["quotable"]
    assert a["noise"]["arms"]["stock"]["noisy"] and not a["noise"]["arms"]["planned"]["noisy"]
    assert "noisy: stock" in speech_report.render_text(a, None, [])


def test_an_incomplete_grid_has_no_comparison_and_says_why() -> None:
    broken = {**RECORDS, "planned": [*RECORDS["planned"][:2], rec("planned", 2, 0, 0, 0, 0, status="crashed")]}
    a = artifact_of(broken, 3)
    assert not a["complete"] and not a["quotable"] and a["versus_faster_whisper"] is None
    assert a["arms"]["planned"]["median"] is None
    text = speech_report.render_text(a, None, [])
    assert "INCOMPLETE" in text and "planned pass 3: crashed: the server exited" in text


def test_one_pass_is_indicative_only() -> None:
    a = artifact_of({n: r[:1] for n, r in RECORDS.items()}, 1)
    assert a["complete"] and not a["quotable"]
    assert "indicative only" in speech_report.render_text(a, None, [])


# -- the anchors' driver ----------------------------------------------------------------------------

# A stand-in for edgectl_runtime.tools.speech_anchor: its arguments, its output's fields.
FAKE_DRIVER = r"""
import json, sys
args = sys.argv[1:]
mode = args[args.index("--mode") + 1]
clips = json.load(open(args[args.index("--clips") + 1]))["clips"]
if sys.argv[0].endswith("fail.py"):
    print("error: the engine broke", file=sys.stderr)
    sys.exit(1)
print("a warning on the way", file=sys.stderr)
print(json.dumps({"schema": "edgectl.speech-anchor/1", "load_s": 0.5,
                  "total_wall_s": 2.0 if mode != "sequential" else 1.0 * len(clips),
                  "memory": {"pss_peak_bytes": 400_000_000, "pss_steady_bytes": 300_000_000,
                             "pss_end_bytes": 310_000_000},
                  "clips": [{"id": c["id"], "text": c["text"], "wall_s": c["seconds"] / 20, "worker": 0}
                            for c in clips]}, indent=1))
"""


def test_an_anchor_pass_runs_the_driver_once_per_measurement(tmp_path: Path) -> None:
    driver, failing = tmp_path / "driver.py", tmp_path / "fail.py"
    driver.write_text(FAKE_DRIVER)
    failing.write_text(FAKE_DRIVER)
    clips_json = clip_set(tmp_path)
    ctx = BenchContext(model_name="whisper-base", model_path=str(tmp_path), vocab_size=0, kv_bytes_per_token=0,
                       planned=None, planner=lambda o: None, runtime_python=sys.executable,  # type: ignore[arg-type]
                       child_env={"PATH": "/usr/bin:/bin"}, logs_dir=tmp_path / "logs", usable_cpus=2,
                       stock_plugins="", launchers={"anchor": lambda arm, port, d: [sys.executable, str(driver)]})
    arm = AnchorArm(ARMS["faster-whisper-int8"], ctx, tmp_path / "ct2")
    plan = ClipPlan(measure.read_clips(clips_json), clips_json, ctx.logs_dir, exact_score)
    records = run_grid([arm], 1, ctx, plan, progress=lambda line: None)
    (r,) = records["faster-whisper-int8"]
    assert r["status"] == "ok", r
    assert r["wer"] == 0 and r["ready_s"] == 0.5 and r["rtf_30s"] == pytest.approx(1 / 20)
    assert set(r["together"]) == {"workers", "batched"}
    assert r["aggregate_audio_s_per_s"] == pytest.approx(4 * 28.8 / 2.0)
    assert (r["pss_peak_bytes"], r["pss_steady_bytes"]) == (400_000_000, 310_000_000)  # steady: after the clip set
    cmd = r["runs"]["sequential"]["command"]
    assert cmd[cmd.index("--compute-type") + 1] == "int8" and cmd[cmd.index("--clips") + 1] == str(clips_json)
    assert cmd[cmd.index("--threads") + 1] == "2"
    workers = r["runs"]["workers"]["command"]
    assert workers[workers.index("--threads") + 1] == "1" and workers[workers.index("--concurrency") + 1] == "4"
    together = json.loads(Path(workers[workers.index("--clips") + 1]).read_text())
    assert [c["id"] for c in together["clips"]] == [f"rtf-30s#{i}" for i in range(1, 5)]
    assert {c["file"] for c in together["clips"]} == {str(tmp_path / "rtf-30s.wav")}

    ctx.launchers["anchor"] = lambda arm, port, d: [sys.executable, str(failing)]
    (failed,) = run_grid([arm], 1, ctx, plan, progress=lambda line: None)["faster-whisper-int8"]
    assert failed["status"] == "crashed" and "wer" not in failed
    assert "exited with code 1: error: the engine broke" in failed["error"]


def test_a_vllm_server_that_fails_to_start_says_its_engines_root_cause() -> None:
    log = ["(APIServer pid=1) WARNING 12-03 13:22:20 [system_utils.py:255] Found ulimit of 20000 and failed to "
           "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
           "`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
           "(VllmWorker-0 pid=2) ERROR 12-03 13:23:59 [multiproc_executor.py:953]     raise ValueError(",
           "(VllmWorker-0 pid=2) ERROR 12-03 13:23:59 [multiproc_executor.py:953] ValueError: Available memory on "
           "node 0 (10.57/16.34 GiB) on startup is less than desired CPU memory utilization (0.92, 15.03 GiB).",
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]
    assert engine_root_cause(log) == ("ValueError: Available memory on node 0 (10.57/16.34 GiB) on startup is less "
                                      "than desired CPU memory utilization (0.92, 15.03 GiB).")
    assert engine_root_cause(log[-1:]) is None

    class ExitedServer:  # what the arm reads of a server that exited before it was ready
        def returncode(self) -> int:
            return 1

        def log_tail(self, lines: int) -> list[str]:
            return log[-lines:]

    ctx = BenchContext(model_name="whisper-base", model_path="/m", vocab_size=0, kv_bytes_per_token=0,
                       planned=None, planner=lambda o: None, runtime_python=sys.executable,  # type: ignore[arg-type]
                       child_env={}, logs_dir=Path("/nonexistent"), usable_cpus=2, stock_plugins="")
    with pytest.raises(Crashed, match=r"exited with code 1 .* \(root cause: ValueError: Available memory on node 0"):
        StockVllmArm(ARMS["stock"], ctx).wait_ready(None, ExitedServer(), deadline=0)  # type: ignore[arg-type]


# -- the command line -------------------------------------------------------------------------------


def _whisper_dir(tmp_path: Path) -> Path:
    model = tmp_path / "whisper-dir"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    return model


@pytest.mark.parametrize("args, says", [
    (["--concurrency", "4"], "--concurrency: a text model's option"),
    (["--arms", "planned,bogus"], "--arms: unknown speech arm(s) bogus"),
    (["--arms", "stock,stock"], "--arms: stock given twice"),
    (["--passes", "0"], "--passes 0: at least 1"),
    (["--clips", "no-such-dir"], "--clips no-such-dir: no clips.json there"),
])
def test_bad_speech_bench_options_are_one_error_line_and_leave_nothing(tmp_path: Path, args: list[str],
                                                                      says: str) -> None:
    model = _whisper_dir(tmp_path)
    out = tmp_path / "results"
    done = run_cli(["bench", str(model), "--out", str(out), *args], env={"EDGECTL_MODEL_CACHE": str(tmp_path / "m")},
                   timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr
    assert not out.exists() and not (tmp_path / "m").exists()


def test_a_speech_option_given_for_a_text_model_is_one_error_line(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = run_cli(["bench", "smollm2-135m", "--clips", str(tmp_path), "--out", str(out)],
                   env={"EDGECTL_MODEL_CACHE": str(tmp_path / "m")}, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == "error: --clips: a speech model's option; smollm2-135m is a text model\n"
    assert not out.exists() and not (tmp_path / "m").exists()
