"""The vision grid: arms × passes, interleaved with the arm order rotated each pass, every pass a
fresh server (bench/grid.py: the speech bench's grid, its pass states and launch).

A pass: ready when it has answered a real chat completion
about an image (``ready_s`` from launch); its peak PSS sampled from launch to ready; the settings
read back and checked; one image (TTFT, decode with the image in context), the same question
text-only (decode), and more such pairs (measure.decode_pairs); four images at once; then, after
``quiet_s`` without requests, the steady PSS of its whole process tree (the text bench's ``_read_steady``). Every request has an image of its
own, seeded by the run's seed, the pass and the request (images.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgectl.bench.arms import BenchContext, Crashed, PreparedArm
from edgectl.bench.grid import (
    failed_line,
    new_record,
    ready_and_checked,
    run_rotated,
    server_pass,
)
from edgectl.bench.runner import _read_steady
from edgectl.bench.server import ServerProcess
from edgectl.bench.vision import images, measure
from edgectl.client import Client, HttpFailed

Progress = Callable[[str], None]
# Numbers a pass that did not complete as specified does not keep.
MEASURED = ("ttft_image_s", "decode_image_tok_s", "decode_text_tok_s", "image_text_decode_ratio", "aggregate_tok_s",
            "pss_steady_bytes", "load_peak_ratio")
# The requests of a pass, by their index in image_seed: the warm-up, one image, the four, then the
# images of the further decode pairs.
WARM_UP, ONE_IMAGE, FIRST_OF_FOUR = 0, 1, 2
FIRST_DECODE_PAIR = FIRST_OF_FOUR + measure.CONCURRENT_IMAGES


def run_grid(arms: list[PreparedArm], passes: int, ctx: BenchContext, seed: int, progress: Progress,
             on_pass: Callable[[dict[str, Any]], None] | None = None) -> dict[str, list[dict[str, Any]]]:
    def run_pass(arm: PreparedArm, i: int, position: int, pass_dir: Path) -> dict[str, Any]:
        rec = {**new_record(arm.name, i, position), "seed": seed}
        return server_pass(arm, rec, pass_dir, lambda client, server, r: _serve_and_measure(arm, client, server, ctx,
                                                                                           seed, r), MEASURED)
    return run_rotated(arms, passes, ctx, run_pass, pass_line, progress, on_pass)


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
    effective = ready_and_checked(arm, client, server, rec)
    rec.update(arm.from_log(server))
    one = measure.one_image(client, ctx.model_name, _image(seed, p, ONE_IMAGE))
    pairs = measure.decode_pairs(client, ctx.model_name, one, [_image(seed, p, FIRST_DECODE_PAIR + k)
                                                               for k in range(measure.DECODE_PAIRS - 1)])
    text = pairs["pairs"][0]["text"]
    rec.update(one_image=one, text_only=text, decode_pairs=pairs, ttft_image_s=one["ttft_s"],
               decode_image_tok_s=pairs["decode_image_tok_s"], decode_text_tok_s=pairs["decode_text_tok_s"],
               image_text_decode_ratio=pairs["image_text_decode_ratio"], prompt_tokens_image=one["prompt_tokens"],
               prompt_tokens_text=text["prompt_tokens"])
    four = measure.together(client, ctx.model_name, [_image(seed, p, FIRST_OF_FOUR + i)
                                                     for i in range(measure.CONCURRENT_IMAGES)])
    rec["together"] = four
    rec["aggregate_tok_s"] = four["aggregate_tok_s"]
    _read_steady(arm, client, server, ctx, effective, rec)


def pass_line(rec: dict[str, Any]) -> str:
    failed = failed_line(rec)
    if failed is not None:
        return failed
    return (f"ok: ready {rec['ready_s']:.1f} s, one image TTFT {rec['ttft_image_s']:.2f} s "
            f"({rec.get('prompt_tokens_image')} prompt tokens), decode {_f(rec['decode_image_tok_s'])} tok/s with the "
            f"image vs {_f(rec['decode_text_tok_s'])} text-only ({_f(rec.get('image_text_decode_ratio'), 2)}×), "
            f"four images at once {_f(rec['aggregate_tok_s'])} tok/s, "
            f"PSS {_gb(rec.get('pss_steady_bytes'))} (peak {_gb(rec.get('pss_peak_bytes'))})")


def _f(v: float | None, digits: int = 1) -> str:
    return "?" if v is None else f"{v:.{digits}f}"


def _gb(v: int | None) -> str:
    return "?" if v is None else f"{v / 1e9:.2f} GB"
