"""The speech grid: arms × passes, interleaved with the arm order rotated each pass, every pass
fresh (a new server, or new anchor processes).

Pass states as in the text bench (``bench/runner.py``): ``ok``, ``invalid`` (a setting read back
differs from the arm's, or an answer the measurement cannot use: no number kept), ``crashed``.

A server arm's pass: the server started in its own session on a free port, with empty compile
caches of its own (``runner.compile_caches``, removed after); ready when it has answered a real
transcription of the set's shortest clip (``ready_s`` from launch); its peak PSS sampled from
launch to ready; the settings read back and checked; the clip set one by one; four clips at once;
then, after ``quiet_s`` without requests, the steady PSS of its whole process tree.

An anchor's pass: the driver run on the clip set one by one, then once per way of doing four
clips at once (the better one quoted). Its ``ready_s`` is the driver's ``load_s`` (from its start
to its model loaded and the warm-up clip transcribed, as a server's is to its first answer); its
PSS is the driver's tree's as the driver samples it with the same reader (``procmem.tree_mem``):
the peak over the whole run, and after the clip set with the model still loaded (``pss_steady``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgectl.bench import grid
from edgectl.bench.arms import BenchContext, Crashed, PreparedArm
from edgectl.bench.grid import (
    drop_measured,
    failed_line,
    new_record,
    ready_and_checked,
    run_rotated,
)
from edgectl.bench.runner import CRASHED, INVALID, OK, _loadavg, utc_now
from edgectl.bench.server import ServerProcess
from edgectl.bench.speech import measure
from edgectl.bench.speech.arms import AnchorArm, SpeechArm
from edgectl.bench.speech.measure import Choice, Clip, Score
from edgectl.client import Client, HttpFailed

Progress = Callable[[str], None]
# Numbers a pass that did not complete as specified does not keep.
MEASURED = ("wer", "rtf_5s", "rtf_30s", "transcript_s", "aggregate_audio_s_per_s", "pss_steady_bytes", "audio_s",
            "wall_s")




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
    def run_pass(arm: SpeechArm, i: int, position: int, pass_dir: Path) -> dict[str, Any]:
        if isinstance(arm, AnchorArm):
            return anchor_pass(arm, i, position, ctx, clip_plan, pass_dir)
        return server_pass(arm, i, position, ctx, clip_plan, pass_dir)
    return run_rotated(arms, passes, ctx, run_pass, pass_line, progress, on_pass)




# -- a server --------------------------------------------------------------------------------------


def server_pass(arm: PreparedArm, pass_index: int, order: int, ctx: BenchContext, clip_plan: ClipPlan,
                pass_dir: Path) -> dict[str, Any]:
    return grid.server_pass(arm, new_record(arm.name, pass_index, order), pass_dir,
                            lambda client, server, rec: _serve_and_measure(arm, client, server, ctx, clip_plan, rec),
                            MEASURED)


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
    rec["warm_up"] = {"clip": short.id, "text": first["text"]}
    ready_and_checked(arm, client, server, rec)
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
    rec = new_record(arm.name, pass_index, order)
    rec["runs"] = {}
    try:
        seq = _drive(arm, "sequential", 1, clip_plan.clips_json, pass_dir / "sequential", ctx, rec)
        memory = seq.get("memory") or {}
        rec["ready_s"] = seq["load_s"]
        rec["clips"] = [{"id": str(c["id"]), "text": c["text"], "wall_s": c["wall_s"]} for c in seq["clips"]]
        rec.update(measure.figures(rec["clips"], clip_plan.clips, clip_plan.choice, clip_plan.score))
        # the driver's tree, sampled by the driver: peak from start to its end (transcriptions included),
        # steady after the clip set (the model still loaded), as a server's is after its requests
        rec.update(pss_peak_bytes=memory.get("pss_peak_bytes"), pss_steady_bytes=memory.get("pss_end_bytes"),
                   pss_ready_bytes=memory.get("pss_steady_bytes"), processes=1)
        together: dict[str, Any] = {}
        for mode in arm.together_modes:
            run = _drive(arm, mode, measure.CONCURRENT_CLIPS, clip_plan.together_json, pass_dir / mode, ctx, rec)
            together[mode] = {"aggregate_audio_s_per_s": measure.aggregate(clip_plan.choice.together, 0.0,
                                                                           run["total_wall_s"]),
                              "wall_s": run["total_wall_s"], "load_s": run["load_s"],
                              "clips": [{k: c.get(k) for k in ("id", "text", "wall_s", "worker")} for c in run["clips"]],
                              "pss_peak_bytes": (run.get("memory") or {}).get("pss_peak_bytes")}
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
        drop_measured(rec, MEASURED)
    return rec


def _drive(arm: AnchorArm, mode: str, concurrency: int, clips_json: Path, run_dir: Path, ctx: BenchContext,
           rec: dict[str, Any]) -> dict[str, Any]:
    """One driver run to its end (its own session, so a timeout stops its workers too); its result.
    The driver prints one JSON document on stdout and logs on stderr (kept in ``driver.log``)."""
    argv = arm.command(mode, concurrency, clips_json)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "driver.log"
    rec["runs"][mode] = {"command": argv, "log": str(log)}
    with log.open("wb") as err:
        try:
            proc = subprocess.Popen(argv, env=arm.env(), stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise DriverFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        try:
            out, _ = proc.communicate(timeout=ctx.start_timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise DriverFailed(f"the {arm.engine} driver ({mode}) ran over {ctx.start_timeout_s:.0f} s "
                               "(--start-timeout): stopped") from None
    rec["runs"][mode]["exit_code"] = proc.returncode
    tail = " | ".join(ln for ln in log.read_text(errors="replace").splitlines()[-4:] if ln.strip())
    if proc.returncode != 0:
        raise DriverFailed(f"the {arm.engine} driver ({mode}) exited with code {proc.returncode}: {tail}")
    try:
        doc: dict[str, Any] = json.loads(out)
    except ValueError:
        raise DriverFailed(f"the {arm.engine} driver ({mode}) printed no JSON result: {tail}") from None
    got = [str(c.get("id")) for c in doc.get("clips") or []]
    sent = json.loads(clips_json.read_text())["clips"]
    if sorted(got) != sorted(str(c["id"]) for c in sent):
        raise measure.MeasurementFailed(f"the {arm.engine} driver ({mode}) answered for {len(got)} of "
                                        f"{len(sent)} clips")
    rec["runs"][mode]["driver"] = {k: v for k, v in doc.items() if k != "clips"}
    return doc


# -- the record ------------------------------------------------------------------------------------




def pass_line(rec: dict[str, Any]) -> str:
    failed = failed_line(rec)
    if failed is not None:
        return failed
    agg = rec.get("aggregate_audio_s_per_s")
    four = "–" if agg is None else f"{agg:.1f} audio-s/s ({rec.get('together_best')})"
    return (f"ok: ready {rec['ready_s']:.1f} s, WER {100 * rec['wer']:.1f}%, RTF 5 s {rec['rtf_5s']:.3f}, "
            f"30 s {rec['rtf_30s']:.3f}, whole transcript {rec['transcript_s']:.1f} s, four at once {four}, "
            f"PSS {_gb(rec.get('pss_steady_bytes'))} (peak {_gb(rec.get('pss_peak_bytes'))})")


def _gb(v: int | None) -> str:
    return "?" if v is None else f"{v / 1e9:.2f} GB"
