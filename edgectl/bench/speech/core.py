"""``edgectl bench`` for a speech model: from the options to the artifact.

The text bench's order of work (bench/core.py): check the request (nothing is started or
written for bad input), probe the host, plan the model, prepare the arms, run the interleaved
grid writing the artifact after every pass, summarise, check the plan's memory prediction.
The pieces are the text bench's: the worker arm, the server process and its tree's PSS, the
provenance, the noise gate, the memory prediction, the artifact's file; what is speech's is here
(arms, clips, measurements, report).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgectl import launch
from edgectl.bench import report as text_report
from edgectl.bench.arms import QUIET_S, BenchContext, Launcher
from edgectl.bench.core import (
    ServerRuntime,
    _check_writable,
    _server_runtime,
    planner_for,
)
from edgectl.bench.grid import conclude, provenance, run_writing
from edgectl.bench.speech import clips, measure, wer
from edgectl.bench.speech import report as speech_report
from edgectl.bench.speech.arms import (
    ARMS,
    ENGINE_MODULES,
    PACKAGES,
    SpeechArm,
    parse_arm_names,
    prepare_arms,
)
from edgectl.bench.speech.runner import ClipPlan, run_grid
from edgectl.errors import EdgectlError

if TYPE_CHECKING:
    from edgectl.probe.facts import HostFacts

Progress = Callable[[str], None]


@dataclass
class SpeechBenchOptions:
    model: str
    arms: str | None = None
    passes: int = 3
    out: Path = Path("results")
    clips: Path | None = None  # a clip set's directory (clips.json); default: the shipped set, made once
    start_timeout_s: float = 1800.0
    argv: list[str] | None = None
    quiet_s: float = QUIET_S


def is_speech_model(model: str, environ: Mapping[str, str]) -> bool:
    """Whether ``model`` is a speech model: a catalog entry of modality ``speech``, or a directory
    whose config.json is a Whisper model's."""
    from edgectl.models.catalog import CATALOG

    entry = CATALOG.get(model)
    if entry is not None:
        return entry.modality == "speech"
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "whisper"


def run_speech_bench(opts: SpeechBenchOptions, environ: Mapping[str, str], progress: Progress, *,
                     facts: HostFacts | None = None,
                     launchers: Mapping[str, Launcher] | None = None) -> speech_report.SpeechBenchResult:
    """Run the grid ``opts`` asks for; the result holds the artifact (written as it goes)."""
    names = parse_arm_names(opts.arms)
    _check_request(opts)
    from edgectl.contract.plan import Request
    from edgectl.inputs import make_plan
    from edgectl.models.cache import resolve_model
    from edgectl.probe import probe

    model_path = resolve_model(opts.model, environ)
    started = _dt.datetime.now(_dt.timezone.utc)
    facts = facts if facts is not None else probe("/", environ=environ)
    clips_json = _clip_set(opts, environ, progress)
    planned = None
    try:  # the planned arm needs edgectl's plan; the others run without one
        planned = make_plan(Request(model=opts.model, max_num_seqs=measure.CONCURRENT_CLIPS), environ, facts=facts)
    except EdgectlError as exc:
        if "planned" in names:
            raise
        progress(f"no plan for {opts.model} ({exc.message}): the arms run without one")
    servers = _server_runtime(environ)
    model_name = opts.model if not Path(opts.model).expanduser().is_dir() else model_path.name
    label = text_report.class_label(facts.device_class, environ)
    path = text_report.artifact_path(opts.out, started.strftime("%Y-%m-%d"), label, f"{model_name}-speech")
    ctx = BenchContext(
        model_name=model_name, model_path=str(model_path), vocab_size=0, kv_bytes_per_token=0,
        planned=planned.plan if planned else None,  # type: ignore[arg-type]  # only the worker arm reads it
        planner=planner_for(opts.model, environ, facts), runtime_python=servers.python, child_env=servers.child_env, logs_dir=path.with_suffix(".logs"),
        usable_cpus=len(facts.topology.usable_cpus or []) or 1, stock_plugins=servers.stock_plugins,
        start_timeout_s=opts.start_timeout_s, launchers=dict(launchers or {}), quiet_s=opts.quiet_s)
    anchor_models = _anchor_models(names, opts.model, model_path, ctx, environ, progress)
    arms, skipped = prepare_arms(names, ctx, anchor_models=anchor_models)
    for name, why in skipped.items():
        progress(f"skipping arm {name}: {why}")
    if not arms:
        raise EdgectlError("no arm can run here: " + "; ".join(f"{n}: {w}" for n, w in skipped.items()))

    clip_plan = ClipPlan(measure.read_clips(clips_json), clips_json, ctx.logs_dir,
                         score=lambda triples: wer.corpus_wer(triples).to_dict())
    artifact = _new_artifact(opts, ctx, arms, skipped, facts, servers,
                             clip_plan, started)

    progress(f"{len(arms)} arm(s) × {opts.passes} pass(es), interleaved, order rotated per pass; artifact {path}")
    records = run_writing(artifact, path, lambda on_pass: run_grid(arms, opts.passes, ctx, clip_plan, progress,
                                                                    on_pass=on_pass))
    speech_report.finish(artifact, records, opts.passes)
    conclude(artifact, path, opts.out)
    return speech_report.SpeechBenchResult(artifact, path)


def _check_request(opts: SpeechBenchOptions) -> None:
    """Refuse bad options before anything is started or written."""
    if opts.passes < 1:
        raise EdgectlError(f"--passes {opts.passes}: at least 1 (3 or more for a result worth quoting)")
    if opts.clips is not None and not (opts.clips / "clips.json").is_file():
        raise EdgectlError(f"--clips {opts.clips}: no clips.json there: give a clip set's directory, or leave "
                           "--clips out for the shipped set")
    if opts.clips is not None:
        try:
            measure.choose(measure.read_clips(opts.clips / "clips.json"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise EdgectlError(f"--clips {opts.clips}: its clips.json cannot be used: {exc}") from None
    _check_writable(opts.out, "--out")




def _clip_set(opts: SpeechBenchOptions, environ: Mapping[str, str], progress: Progress) -> Path:
    """The clips.json of the set to run: ``--clips``, else the shipped set made once into the model cache."""
    if opts.clips is not None:
        return (opts.clips / "clips.json").resolve()
    from edgectl.models.cache import cache_dir

    directory = cache_dir(environ) / "speech-clips"
    if not (directory / "clips.json").is_file():
        progress(f"making the clip set with espeak-ng and sox into {directory}")
        clips.make_clip_set(directory)
    return directory / "clips.json"


def _anchor_models(names: Collection[str], model: str, model_path: Path, ctx: BenchContext,
                   environ: Mapping[str, str], progress: Progress) -> dict[str, Path | str]:
    """Per engine an anchor arm asks for, what it reads (faster-whisper: the CTranslate2 directory the
    pull keeps; whisper.cpp: a ggml file made once from the converted directory), or why it cannot run."""
    engines = {ARMS[n].overrides["engine"] for n in names if ARMS[n].launcher == "anchor"}
    if not engines:
        return {}
    out: dict[str, Path | str] = {}
    if "anchor" not in ctx.launchers:  # a stand-in driver needs no engine
        out.update(_missing_engines(engines, ctx.runtime_python, ctx.child_env))
    from edgectl.models.cache import cache_dir, ct2_originals_dir
    from edgectl.models.catalog import CATALOG

    entry = CATALOG.get(model)
    if "faster-whisper" in engines and "faster-whisper" not in out:
        originals = ct2_originals_dir(entry, environ) if entry is not None and entry.ct2 else None
        if originals is None:
            out["faster-whisper"] = "a model directory has no CTranslate2 original: only a pulled catalog model keeps one"
        elif not (originals / "model.bin").is_file():
            out["faster-whisper"] = f"no CTranslate2 model.bin in {originals}: `edgectl models pull {model}` keeps it"
        else:
            out["faster-whisper"] = originals
    if "whisper.cpp" in engines and "whisper.cpp" not in out:
        # a catalog model's file is kept in the model cache; a directory's made for this run
        ggml = (cache_dir(environ) / "whisper.cpp" / f"{entry.name}-f16.bin" if entry is not None
                else ctx.logs_dir / "whisper.cpp" / "ggml-model-f16.bin")
        out["whisper.cpp"] = ggml if ggml.is_file() else _make_ggml(model_path, ggml, ctx, progress)
    return out


def _make_ggml(model_path: Path, ggml: Path, ctx: BenchContext, progress: Progress) -> Path | str:
    """whisper.cpp's ggml file of the converted directory, written whole or not at all; else why not."""
    progress(f"making whisper.cpp's ggml file of {model_path} (float16) into {ggml}")
    ggml.parent.mkdir(parents=True, exist_ok=True)
    partial = ggml.with_name(f".{ggml.name}.tmp-{os.getpid()}")
    argv = launch.command(ctx.runtime_python, launch.WHISPER_GGML, [str(model_path), str(partial), "--ftype", "f16"])
    try:
        done = subprocess.run(argv, env=ctx.child_env, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        partial.unlink(missing_ok=True)
        return f"its ggml file could not be made: {exc}"
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        return f"its ggml file could not be made: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    partial.replace(ggml)
    return ggml


def _missing_engines(engines: Collection[str], python: str, env: Mapping[str, str]) -> dict[str, str]:
    """Engine -> why the runtime interpreter cannot run it (its module is not installed)."""
    modules = {e: ENGINE_MODULES[e] for e in engines}
    code = ("import importlib.util, json, sys; print(json.dumps({m: importlib.util.find_spec(m) is not None "
            "for m in sys.argv[1:]}))")
    try:
        done = subprocess.run([python, "-c", code, *modules.values()], env=dict(env), capture_output=True, text=True,
                              timeout=120)
        found = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return {e: f"cannot ask {python} for {m}: {exc}" for e, m in modules.items()}
    return {e: f"the runtime interpreter {python} has no {m} (pip install {PACKAGES[e]})"
            for e, m in modules.items() if not found.get(m)}


def _new_artifact(opts: SpeechBenchOptions, ctx: BenchContext, arms: list[SpeechArm], skipped: dict[str, str],
                  facts: HostFacts, servers: ServerRuntime, clip_plan: ClipPlan,
                  started: _dt.datetime) -> dict[str, Any]:
    names = [a.name for a in arms]
    choice = clip_plan.choice
    return {
        "schema": speech_report.SCHEMA,
        "provenance": {
            **provenance("speech", ctx, names, opts.passes, facts, servers, opts.argv, started),
            "request": {"route": "/v1/audio/transcriptions", "response_format": "json", "temperature": 0,
                        "language": "en"},
            "clips": {"dir": str(clip_plan.clips_json.parent), "count": len(clip_plan.clips),
                      "audio_s": sum(c.seconds for c in clip_plan.clips), **choice.to_dict(),
                      "set": [c.to_dict() for c in clip_plan.clips]},
        },
        "finished": False, "complete": False, "quotable": False,
        "arms": {a.name: {**a.describe(), "passes": []} for a in arms},
        "skipped": skipped, "incomplete_reasons": [], "noise": None, "versus_faster_whisper": None,
        "memory_prediction": None,
    }
