"""The vision grid: arms × passes, interleaved with the arm order rotated each pass (the speech
bench's ``rotated``), every pass a fresh server.

Pass states as in the text bench (``bench/runner.py``): ``ok``, ``invalid`` (a setting read back
differs from the arm's, or an answer the measurement cannot use: no number kept), ``crashed``.

A pass: the server started in its own session on a free port, with empty compile caches of its
own (``runner.compile_caches``, removed after); ready when it has answered a real chat completion
about an image (``ready_s`` from launch); its peak PSS sampled from launch to ready; the settings
read back and checked; one image (TTFT, decode with the image in context), the same question
text-only (decode), four images at once; then, after ``quiet_s`` without requests, the steady PSS
of its whole process tree (the text bench's ``_read_steady``). Every request has an image of its
own, seeded by the run's seed, the pass and the request (images.py).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgectl.bench.arms import BenchContext, Crashed, PreparedArm
from edgectl.bench.runner import CRASHED, INVALID, OK, _launch, _loadavg, _read_steady, compile_caches, utc_now
from edgectl.bench.server import ServerProcess
from edgectl.bench.speech.runner import rotated
from edgectl.bench.vision import images, measure
from edgectl.client import Client, HttpFailed
from edgectl.contract.effective import Effective

Progress = Callable[[str], None]
# Numbers a pass that did not complete as specified does not keep.
MEASURED = ("ttft_image_s", "decode_image_tok_s", "decode_text_tok_s", "aggregate_tok_s", "pss_steady_bytes",
            "load_peak_ratio")
# The requests of a pass, by their index in image_seed: the warm-up, one image, then the four.
WARM_UP, ONE_IMAGE, FIRST_OF_FOUR = 0, 1, 2


def run_grid(arms: list[PreparedArm], passes: int, ctx: BenchContext, seed: int, progress: Progress,
             on_pass: Callable[[dict[str, Any]], None] | None = None) -> dict[str, list[dict[str, Any]]]:
    by_name = {a.name: a for a in arms}
    order = rotated([a.name for a in arms], passes)
    records: dict[str, list[dict[str, Any]]] = {a.name: [] for a in arms}
    for position, (name, i) in enumerate(order):
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: starting")
        rec = server_pass(by_name[name], i, position, ctx, seed, ctx.logs_dir / f"{position:03d}-{name}-p{i + 1}")
        records[name].append(rec)
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: {pass_line(rec)}")
        if on_pass:
            on_pass(rec)
    return records


def server_pass(arm: PreparedArm, pass_index: int, order: int, ctx: BenchContext, seed: int,
                pass_dir: Path) -> dict[str, Any]:
    rec: dict[str, Any] = {"arm": arm.name, "pass": pass_index, "order": order, "status": None, "problems": [],
                           "error": None, "started_at": utc_now(), "loadavg_start": _loadavg(), "seed": seed}
    caches = compile_caches(pass_dir)
    server = _launch(arm, pass_dir, caches, rec)
    if server is None:
        return rec
    try:
        _serve_and_measure(arm, Client("127.0.0.1", rec["port"]), server, ctx, seed, rec)
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
            for key in MEASURED:
                rec.pop(key, None)
    return rec


def _image(seed: int, pass_index: int, request: int) -> bytes:
    return images.noise_png(images.image_seed(pass_index, request, seed))


def _serve_and_measure(arm: PreparedArm, client: Client, server: ServerProcess, ctx: BenchContext, seed: int,
                       rec: dict[str, Any]) -> None:
    deadline = time.monotonic() + ctx.start_timeout_s
    arm.wait_ready(client, server, deadline)
    p = rec["pass"]
    try:
        rec["warm_up_text"] = measure.warm_up(client, ctx.model_name, _image(seed, p, WARM_UP),
                                              timeout_s=max(60.0, deadline - time.monotonic()))
    except HttpFailed as exc:
        if not server.alive():
            raise Crashed(f"the server exited with code {server.returncode()} before its first answer: {exc}") from None
        raise
    rec["ready_s"] = server.elapsed_s()
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
    rec.update(arm.from_log(server))
    one = measure.one_image(client, ctx.model_name, _image(seed, p, ONE_IMAGE))
    text = measure.text_only(client, ctx.model_name)
    rec.update(one_image=one, text_only=text, ttft_image_s=one["ttft_s"], decode_image_tok_s=one["decode_tok_s"],
               decode_text_tok_s=text["decode_tok_s"], prompt_tokens_image=one["prompt_tokens"],
               prompt_tokens_text=text["prompt_tokens"])
    four = measure.together(client, ctx.model_name, [_image(seed, p, FIRST_OF_FOUR + i)
                                                     for i in range(measure.CONCURRENT_IMAGES)])
    rec["together"] = four
    rec["aggregate_tok_s"] = four["aggregate_tok_s"]
    _read_steady(arm, client, server, ctx, effective, rec)


def pass_line(rec: dict[str, Any]) -> str:
    if rec["status"] != OK:
        why = "; ".join(rec.get("problems") or []) or rec.get("error") or ""
        return f"{rec['status'].upper()}: {why}"
    return (f"ok: ready {rec['ready_s']:.1f} s, one image TTFT {rec['ttft_image_s']:.2f} s "
            f"({rec.get('prompt_tokens_image')} prompt tokens), decode {_f(rec['decode_image_tok_s'])} tok/s with the "
            f"image vs {_f(rec['decode_text_tok_s'])} text-only, four images at once {_f(rec['aggregate_tok_s'])} tok/s, "
            f"PSS {_gb(rec.get('pss_steady_bytes'))} (peak {_gb(rec.get('pss_peak_bytes'))})")


def _f(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f}"


def _gb(v: int | None) -> str:
    return "?" if v is None else f"{v / 1e9:.2f} GB"
