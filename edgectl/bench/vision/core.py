"""``edgectl bench`` for a vision-language model: from the options to the artifact.

The speech bench's order of work (bench/speech/core.py): check the request (nothing is started or
written for bad input), probe the host, plan the model, prepare the arms (here: llama.cpp's GGUF
pair, converted once), run the interleaved grid writing the artifact after every pass, summarise,
check the plan's memory prediction. The pieces are the text bench's: the worker and llama.cpp
arms, the server process and its tree's PSS, the provenance, the noise gate, the memory
prediction, the artifact's file; what is vision's is here (arms, images, measurements, report).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgectl.bench import report as text_report
from edgectl.bench import requantize
from edgectl.bench.arms import QUIET_S, BenchContext, Launcher, parse_thread_counts
from edgectl.bench.core import (
    ServerRuntime,
    _check_writable,
    _server_runtime,
    _usable_cpus,
    planner_for,
)
from edgectl.bench.grid import conclude, provenance, run_writing
from edgectl.bench.vision import images, measure
from edgectl.bench.vision import report as vision_report
from edgectl.bench.vision.arms import ARMS, VisionArm, parse_arm_names, prepare_arms
from edgectl.bench.vision.gguf_pair import Converter, GgufPair, gguf_pair
from edgectl.bench.vision.runner import run_grid
from edgectl.errors import EdgectlError
from edgectl.llamacpp import LlamaServer, find_llama_server, find_llama_tools, held_isa

if TYPE_CHECKING:
    from edgectl.probe.facts import HostFacts

Progress = Callable[[str], None]


@dataclass
class VisionBenchOptions:
    model: str
    arms: str | None = None
    passes: int = 3
    out: Path = Path("results")
    seed: int = 0  # of the images (images.image_seed)
    start_timeout_s: float = 1800.0
    llama_server: str | None = None
    llama_threads: str | None = None  # "1,2" (None: 1, 2 and every usable CPU: arms.thread_sweep)
    argv: list[str] | None = None
    quiet_s: float = QUIET_S


def is_vision_model(model: str, environ: Mapping[str, str]) -> bool:
    """Whether ``model`` is a vision-language model: a catalog entry of modality ``vision``, or a
    directory whose config.json names a vision-language architecture edgectl reads."""
    from edgectl.models.architectures import is_vision_language
    from edgectl.models.catalog import CATALOG

    entry = CATALOG.get(model)
    if entry is not None:
        return entry.modality == "vision"
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return False
    archs = config.get("architectures") if isinstance(config, dict) else None
    return isinstance(archs, list) and any(isinstance(a, str) and is_vision_language(a) for a in archs)


def run_vision_bench(opts: VisionBenchOptions, environ: Mapping[str, str], progress: Progress, *,
                     facts: HostFacts | None = None, launchers: Mapping[str, Launcher] | None = None,
                     pair: GgufPair | None = None) -> vision_report.VisionBenchResult:
    """Run the grid ``opts`` asks for; the result holds the artifact (written as it goes).
    ``pair``: llama.cpp's GGUF pair already made (default: converted, or kept, here)."""
    names = parse_arm_names(opts.arms)
    _check_request(opts)
    from edgectl.contract.plan import Request
    from edgectl.inputs import make_plan
    from edgectl.models.cache import resolve_model
    from edgectl.probe import probe

    model_path = resolve_model(opts.model, environ)
    started = _dt.datetime.now(_dt.timezone.utc)
    facts = facts if facts is not None else probe("/", environ=environ)
    usable = _usable_cpus(facts)
    llama_threads = parse_thread_counts(opts.llama_threads, usable)
    # every arm is sized for the four images at once; the planned arm serves what deploy would
    planned = make_plan(Request(model=opts.model, max_num_seqs=measure.CONCURRENT_IMAGES), environ, facts=facts)
    plan = planned.plan
    if plan.vision is None:
        raise EdgectlError(f"{opts.model} is planned as a text model: the vision bench needs a vision-language model")
    servers = _server_runtime(environ)
    label = text_report.class_label(facts.device_class, environ)
    path = text_report.artifact_path(opts.out, started.strftime("%Y-%m-%d"), label, f"{plan.model.name}-vision")
    llama = find_llama_server(environ, opts.llama_server, host_flags=facts.cpu.flags, held_to=held_isa(environ))
    ctx = BenchContext(
        model_name=plan.model.name, model_path=str(model_path), vocab_size=int(planned.model.vocab_size),
        kv_bytes_per_token=plan.kv_bytes_per_token, planned=plan, planner=planner_for(opts.model, environ, facts),
        runtime_python=servers.python, child_env=servers.child_env, logs_dir=path.with_suffix(".logs"),
        usable_cpus=usable, stock_plugins=servers.stock_plugins, llama_server=llama.path, llama_unavailable=None if llama.path else llama.origin,
        start_timeout_s=opts.start_timeout_s, launchers=dict(launchers or {}), quiet_s=opts.quiet_s,
        llama_threads=tuple(llama_threads))
    why_no_llama = None
    if any(ARMS[n].launcher == "llama.cpp" for n in names):
        pair, why_no_llama = _llama_pair(pair, model_path, ctx, environ, facts, progress)
    if pair is not None:
        ctx.gguf_path = str(pair.text)
        ctx.gguf_type = _file_type(pair.text)
    arms, skipped = prepare_arms(names, ctx, mmproj=pair.mmproj if pair else None, why_no_llama=why_no_llama)
    for name, why in skipped.items():
        progress(f"skipping arm {name}: {why}")
    if not arms:
        raise EdgectlError("no arm can run here: " + "; ".join(f"{n}: {w}" for n, w in skipped.items()))

    artifact = _new_artifact(opts, ctx, arms, skipped, facts, servers, llama, pair, started)

    progress(f"{len(arms)} arm(s) × {opts.passes} pass(es), interleaved, order rotated per pass; artifact {path}")
    records = run_writing(artifact, path, lambda on_pass: run_grid(arms, opts.passes, ctx, opts.seed, progress,
                                                                    on_pass=on_pass))
    vision_report.finish(artifact, records, opts.passes)
    conclude(artifact, path, opts.out)
    return vision_report.VisionBenchResult(artifact, path)


def _check_request(opts: VisionBenchOptions) -> None:
    """Refuse bad options before anything is started or written."""
    if opts.passes < 1:
        raise EdgectlError(f"--passes {opts.passes}: at least 1 (3 or more for a result worth quoting)")
    _check_writable(opts.out, "--out")




def _file_type(gguf: Path) -> str | None:
    """The GGUF's llama.cpp file type (general.file_type), None when its header cannot be read."""
    try:
        return requantize.file_type(gguf)
    except (EdgectlError, OSError, ValueError):
        return None


def _llama_pair(pair: GgufPair | None, model_path: Path, ctx: BenchContext, environ: Mapping[str, str],
                facts: HostFacts, progress: Progress) -> tuple[GgufPair | None, str | None]:
    """llama.cpp's GGUF pair of the model (given, kept or converted now), or why there is none."""
    if pair is not None:
        return pair, None
    if not ctx.llama_server:
        return None, ctx.llama_unavailable or "llama-server not found"
    from edgectl.models.cache import cache_dir

    try:
        tools = find_llama_tools(environ, host_flags=facts.cpu.flags)
        source = tools.build / "SOURCE"
        converter = Converter(script=tools.convert_script, python=ctx.runtime_python, build=tools.version,
                              source=source.read_text().strip() if source.is_file() else None)
        return gguf_pair(model_path, converter, cache_dir(environ), ctx.child_env, progress), None
    except EdgectlError as exc:
        return None, f"no GGUF pair: {exc.message}"


def _new_artifact(opts: VisionBenchOptions, ctx: BenchContext, arms: list[VisionArm], skipped: dict[str, str],
                  facts: HostFacts, servers: ServerRuntime, llama: LlamaServer, pair: GgufPair | None,
                  started: _dt.datetime) -> dict[str, Any]:
    names = [a.name for a in arms]
    return {
        "schema": vision_report.SCHEMA,
        "provenance": {
            **provenance("vision", ctx, names, opts.passes, facts, servers, opts.argv, started),
            "max_model_len": ctx.planned.max_model_len, "max_num_seqs": ctx.planned.max_num_seqs,
            "requests": {"route": "/v1/chat/completions", "stream": True, "temperature": 0, "ignore_eos": True,
                         "question": measure.QUESTION, "decode_tokens": measure.DECODE_TOKENS,
                         "concurrent_images": measure.CONCURRENT_IMAGES, "decode_pairs": measure.DECODE_PAIRS,
                         "image_px": f"{images.SIDE_PX}x{images.SIDE_PX}", "image_seed": opts.seed,
                         "images": "seeded RGB noise, PNG, a fresh one per request (images.image_seed)"},
            "llama_server": {"path": llama.path, "origin": llama.origin, "threads": list(ctx.llama_threads),
                             "gguf_pair": pair.provenance if pair else None},
        },
        "finished": False, "complete": False, "quotable": False,
        "arms": {a.name: {**a.describe(), "passes": []} for a in arms},
        "skipped": skipped, "incomplete_reasons": [], "noise": None, "versus_llama_cpp": None,
        "memory_prediction": None,
    }
