"""The speech grid: arms × passes, interleaved with the arm order rotated each pass, every pass
fresh (a new server, or new anchor processes).

Pass states as in the text bench (``bench/runner.py``): ``ok``, ``invalid`` (a setting read back
differs from the arm's, or an answer the measurement cannot use: no number kept), ``crashed``.

A server arm's pass: the server started in its own session on a free port, with empty compile
caches of its own (``runner.compile_caches``, removed after); ready when it has answered a real
transcription of the set's shortest clip (``ready_s`` from launch); its peak PSS sampled from
launch to ready; the settings read back and checked; the clip set one by one; four clips at once;
then, after ``quiet_s`` without requests, the steady PSS of its whole process tree.

An anchor's pass: the driver run on the clip set one by one (the model's load time is its
``ready_s``; the bench samples the tree's PSS over the run, the driver reports its own steady
PSS after the load), then once per way of doing four clips at once (the better one quoted).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgectl.bench.arms import BenchContext, Crashed, PreparedArm
from edgectl.bench.runner import CRASHED, INVALID, OK, _loadavg, compile_caches, utc_now
from edgectl.bench.server import ServerProcess, free_port
from edgectl.bench.speech import measure
from edgectl.bench.speech.arms import AnchorArm, SpeechArm
from edgectl.bench.speech.measure import Choice, Clip, Score
from edgectl.client import Client, HttpFailed
from edgectl.contract.effective import Effective

Progress = Callable[[str], None]
# Numbers a pass that did not complete as specified does not keep.
MEASURED = ("wer", "rtf_5s", "rtf_30s", "transcript_s", "aggregate_audio_s_per_s", "pss_steady_bytes", "audio_s",
            "wall_s")


def rotated(names: Sequence[str], passes: int) -> list[tuple[str, int]]:
    """(arm, pass index) in run order: every arm's pass i before any arm's pass i + 1, and pass i
    starting i arms further on (A B C, B C A, C A B, …), so no arm always runs first or after the same one."""
    n = len(names)
    return [(names[(i + k) % n], i) for i in range(passes) for k in range(n)]


class ClipPlan:
    """The clip set and what each measurement uses of it, with the driver's clip files written once."""

    def __init__(self, clips: list[Clip], clips_json: Path, work_dir: Path, score: Score) -> None:
        self.clips = clips
        self.clips_json = clips_json
        self.choice: Choice = measure.choose(clips)
        self.score = score
        # the drivers read the four as a clip set of their own: the set's clips.json with its
        # ~30 s clip's entry four times, under ids of their own, naming the same file
        work_dir.mkdir(parents=True, exist_ok=True)
        source = json.loads(clips_json.read_text())
        entry = next(e for e in source["clips"] if str(e["id"]) == self.choice.window.id)
        self.together_json = work_dir / "clips-together.json"
        self.together_json.write_text(json.dumps({**source, "clips": [
            {**entry, "id": c.id, "file": str(c.path)} for c in self.choice.together]}, indent=1))


def run_grid(arms: list[SpeechArm], passes: int, ctx: BenchContext, clip_plan: ClipPlan, progress: Progress,
             on_pass: Callable[[dict[str, Any]], None] | None = None) -> dict[str, list[dict[str, Any]]]:
    by_name = {a.name: a for a in arms}
    order = rotated([a.name for a in arms], passes)
    records: dict[str, list[dict[str, Any]]] = {a.name: [] for a in arms}
    for position, (name, i) in enumerate(order):
        arm = by_name[name]
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: starting")
        pass_dir = ctx.logs_dir / f"{position:03d}-{name}-p{i + 1}"
        if isinstance(arm, AnchorArm):
            rec = anchor_pass(arm, i, position, ctx, clip_plan, pass_dir)
        else:
            rec = server_pass(arm, i, position, ctx, clip_plan, pass_dir)
        records[name].append(rec)
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: {pass_line(rec)}")
        if on_pass:
            on_pass(rec)
    return records


def _new_record(name: str, pass_index: int, order: int) -> dict[str, Any]:
    return {"arm": name, "pass": pass_index, "order": order, "status": None, "problems": [], "error": None,
            "started_at": utc_now(), "loadavg_start": _loadavg()}


# -- a server --------------------------------------------------------------------------------------


def server_pass(arm: PreparedArm, pass_index: int, order: int, ctx: BenchContext, clip_plan: ClipPlan,
                pass_dir: Path) -> dict[str, Any]:
    rec = _new_record(arm.name, pass_index, order)
    caches = compile_caches(pass_dir)
    port = free_port()
    argv = arm.command(port, pass_dir)
    rec.update(command=argv, port=port, log=str(pass_dir / "server.log"))
    try:
        server = ServerProcess(argv, {**arm.env(), **caches}, pass_dir / "server.log")
    except OSError as exc:
        rec.update(status=CRASHED, error=f"cannot start {argv[0]}: {exc.strerror or exc}", ended_at=utc_now())
        return rec
    rec["pid"] = server.pid
    client = Client("127.0.0.1", port)
    try:
        _serve_and_measure(arm, client, server, ctx, clip_plan, rec)
        rec["status"] = OK
    except Crashed as exc:
        rec.update(status=INVALID if exc.invalid else CRASHED, error=str(exc))
        if exc.invalid:
            rec["problems"] = [str(exc)]
    except measure.MeasurementFailed as exc:
        rec.update(status=INVALID, error=str(exc), problems=[str(exc)])
    except HttpFailed as exc:
        state = "the server had exited" if not server.alive() else "the server still ran"
        rec.update(status=CRASHED, error=f"{exc} ({state})")
    finally:
        if "pss_peak_bytes" not in rec:  # the pass ended before ready: the sampler still runs
            rec["pss_peak_bytes"] = server.stop_sampling() or None
        rec["exit_code"] = server.stop()
        rec["ended_at"] = utc_now()
        rec["loadavg_end"] = _loadavg()
        shutil.rmtree(Path(caches["VLLM_CACHE_ROOT"]).parent, ignore_errors=True)
        if rec["status"] != OK:
            rec["log_tail"] = server.log_tail(12)
            _drop_measured(rec)
    return rec


def _serve_and_measure(arm: PreparedArm, client: Client, server: ServerProcess, ctx: BenchContext,
                       clip_plan: ClipPlan, rec: dict[str, Any]) -> None:
    deadline = time.monotonic() + ctx.start_timeout_s
    arm.wait_ready(client, server, deadline)
    short = clip_plan.choice.short
    try:
        first = measure.transcribe(client, ctx.model_name, short, timeout_s=max(60.0, deadline - time.monotonic()))
    except HttpFailed as exc:
        if not server.alive():
            raise Crashed(f"the server exited with code {server.returncode()} before its first transcription: "
                          f"{exc}") from None
        raise
    rec["ready_s"] = server.elapsed_s()
    rec["warm_up"] = {"clip": short.id, "text": first["text"]}
    rec["pss_peak_bytes"] = server.stop_sampling()
    rec["pss_peak_samples"] = server.samples
    ready_mem = server.memory()
    rec["pss_ready_bytes"] = ready_mem.pss_bytes
    rec["effective"] = arm.readback(client, server)
    effective, problems = Effective.read(rec["effective"])
    if effective is not None:
        problems = arm.check(effective, len(ready_mem.processes))
    if problems or effective is None:
        raise Crashed("; ".join(problems) or "the read-back could not be read", invalid=True)
    rec["clips"] = measure.one_by_one(client, ctx.model_name, clip_plan.clips)
    rec.update(measure.figures(rec["clips"], clip_plan.clips, clip_plan.choice, clip_plan.score))
    four = measure.together(client, ctx.model_name, clip_plan.choice.together)
    rec["together"] = {"requests": four}
    rec["together_best"] = "requests"
    rec["aggregate_audio_s_per_s"] = four["aggregate_audio_s_per_s"]
    time.sleep(ctx.quiet_s)  # the steady state is a server at rest, as in the text bench (arms.QUIET_S)
    steady = server.memory()
    if not server.alive():
        raise Crashed(f"the server exited with code {server.returncode()} during the measurements")
    rec.update(pss_steady_bytes=steady.pss_bytes, pss_anon_steady_bytes=steady.pss_anon_bytes,
               pss_file_steady_bytes=steady.pss_file_bytes, processes=len(steady.processes),
               process_tree=[{"pid": m.pid, "name": m.name, "pss_bytes": m.pss_bytes} for m in steady.processes])


# -- an anchor -------------------------------------------------------------------------------------


class DriverFailed(Exception):
    """The anchor's driver exited with an error, or printed no result."""


def anchor_pass(arm: AnchorArm, pass_index: int, order: int, ctx: BenchContext, clip_plan: ClipPlan,
                pass_dir: Path) -> dict[str, Any]:
    rec = _new_record(arm.name, pass_index, order)
    rec["runs"] = {}
    try:
        seq = _drive(arm, "sequential", 1, clip_plan.clips_json, pass_dir / "sequential", ctx, rec)
        rec["ready_s"] = seq["load_s"]
        rec["clips"] = [{"id": str(c["id"]), "text": c["text"], "wall_s": c["wall_s"]} for c in seq["clips"]]
        rec.update(measure.figures(rec["clips"], clip_plan.clips, clip_plan.choice, clip_plan.score))
        rec.update(pss_peak_bytes=seq["tree_pss_peak_bytes"], pss_steady_bytes=seq["pss_steady_bytes"],
                   processes=seq["processes"])
        together: dict[str, Any] = {}
        for mode in arm.together_modes:
            run = _drive(arm, mode, measure.CONCURRENT_CLIPS, clip_plan.together_json, pass_dir / mode, ctx, rec)
            together[mode] = {"aggregate_audio_s_per_s": measure.aggregate(clip_plan.choice.together, 0.0,
                                                                           run["total_wall_s"]),
                              "wall_s": run["total_wall_s"], "clips": run["clips"],
                              "pss_peak_bytes": run["tree_pss_peak_bytes"]}
        rec["together"] = together
        if together:
            best = max(together, key=lambda m: together[m]["aggregate_audio_s_per_s"] or 0.0)
            rec["together_best"] = best
            rec["aggregate_audio_s_per_s"] = together[best]["aggregate_audio_s_per_s"]
        rec["status"] = OK
    except DriverFailed as exc:
        rec.update(status=CRASHED, error=str(exc))
    except measure.MeasurementFailed as exc:
        rec.update(status=INVALID, error=str(exc), problems=[str(exc)])
    rec["ended_at"] = utc_now()
    rec["loadavg_end"] = _loadavg()
    if rec["status"] != OK:
        _drop_measured(rec)
    return rec


def _drive(arm: AnchorArm, mode: str, concurrency: int, clips_json: Path, run_dir: Path, ctx: BenchContext,
           rec: dict[str, Any]) -> dict[str, Any]:
    """One driver run to its end: its result (``parse_driver_output``) with the tree's sampled peak PSS."""
    argv = arm.command(mode, concurrency, clips_json)
    log = run_dir / "driver.log"
    rec["runs"][mode] = {"command": argv, "log": str(log)}
    try:
        proc = ServerProcess(argv, arm.env(), log)
    except OSError as exc:
        raise DriverFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
    deadline = time.monotonic() + ctx.start_timeout_s
    while proc.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    peak = proc.stop_sampling()
    code = proc.stop(timeout_s=10)
    rec["runs"][mode].update(exit_code=code, tree_pss_peak_bytes=peak or None)
    if code != 0:
        tail = " | ".join(proc.log_tail(4))
        raise DriverFailed(f"the {arm.engine} driver ({mode}) exited with code {code}"
                           + (" (--start-timeout)" if time.monotonic() >= deadline else "") + f": {tail}")
    doc = parse_driver_output(log.read_text(encoding="utf-8", errors="replace"))
    if doc is None:
        raise DriverFailed(f"the {arm.engine} driver ({mode}) printed no result: " + " | ".join(proc.log_tail(4)))
    got = {str(c.get("id")) for c in doc["clips"]}
    sent = json.loads(clips_json.read_text())
    want = {str(c["id"]) for c in (sent["clips"] if isinstance(sent, dict) else sent)}
    if got != want:
        raise measure.MeasurementFailed(f"the {arm.engine} driver ({mode}) answered for {len(got & want)} of "
                                        f"{len(want)} clips")
    rec["runs"][mode]["driver"] = {k: v for k, v in doc.items() if k != "clips"}
    return {**doc, "tree_pss_peak_bytes": peak or None}


def parse_driver_output(text: str) -> dict[str, Any] | None:
    """The driver's result: the last JSON object in its output that has ``clips`` (its log may hold
    warnings before and after it), its fields under the names the bench uses:
    ``load_s``, ``total_wall_s``, ``pss_peak_bytes``, ``pss_steady_bytes``, ``processes``, ``clips``."""
    decoder = json.JSONDecoder()
    found = None
    for i in (j for j, ch in enumerate(text) if ch == "{" and (j == 0 or text[j - 1] == "\n")):
        try:
            doc, _ = decoder.raw_decode(text, i)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("clips"), list):
            found = doc
    if found is None:
        return None
    pss = found.get("pss") if isinstance(found.get("pss"), dict) else {}
    return {**found,
            "load_s": _first(found, "load_s", "load_seconds"),
            "total_wall_s": _first(found, "total_wall_s", "wall_s", "total_s"),
            "pss_peak_bytes": _first(found, "pss_peak_bytes") or _first(pss, "peak_bytes", "peak"),
            "pss_steady_bytes": _first(found, "pss_steady_bytes") or _first(pss, "steady_bytes", "steady"),
            "processes": found.get("processes", 1)}


def _first(doc: dict[str, Any], *keys: str) -> Any:
    return next((doc[k] for k in keys if doc.get(k) is not None), None)


# -- the record ------------------------------------------------------------------------------------


def _drop_measured(rec: dict[str, Any]) -> None:
    for key in MEASURED:
        rec.pop(key, None)


def pass_line(rec: dict[str, Any]) -> str:
    if rec["status"] != OK:
        why = "; ".join(rec.get("problems") or []) or rec.get("error") or ""
        return f"{rec['status'].upper()}: {why}"
    agg = rec.get("aggregate_audio_s_per_s")
    four = "–" if agg is None else f"{agg:.1f} audio-s/s ({rec.get('together_best')})"
    return (f"ok: ready {rec['ready_s']:.1f} s, WER {100 * rec['wer']:.1f}%, RTF 5 s {rec['rtf_5s']:.3f}, "
            f"30 s {rec['rtf_30s']:.3f}, whole transcript {rec['transcript_s']:.1f} s, four at once {four}, "
            f"PSS {_gb(rec.get('pss_steady_bytes'))} (peak {_gb(rec.get('pss_peak_bytes'))})")


def _gb(v: int | None) -> str:
    return "?" if v is None else f"{v / 1e9:.2f} GB"
