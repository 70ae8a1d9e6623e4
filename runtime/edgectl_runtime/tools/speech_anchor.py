"""The speech bench's anchors: faster-whisper and whisper.cpp transcribing a clip set, timed.

``python -m edgectl_runtime.tools.speech_anchor --engine faster-whisper|whisper.cpp --model M
--clips CLIPS [--compute-type T] [--threads N] [--mode sequential|workers|batched]
[--concurrency K] [--clip ID ...] [--warmup WAV]`` prints one JSON document on stdout (schema
:data:`SCHEMA`; logs go to stderr).

- ``--model``: the CTranslate2 directory for faster-whisper (``model.bin``, ``config.json``,
  ``tokenizer.json``, ``vocabulary.txt``, as the pull keeps them); the ggml file for whisper.cpp
  (``edgectl_runtime.tools.whisper_ggml`` makes it from the converted directory).
- ``--compute-type``: CTranslate2's (int8, int8_float32, int16, float32 on this CPU class) for
  faster-whisper; for whisper.cpp the float type the ggml file holds (float16 or float32), checked.
- ``--threads``: threads of one model instance (CTranslate2's ``cpu_threads``, whisper.cpp's
  ``n_threads``); in ``workers`` mode every worker has that many.
- ``--mode``: ``sequential`` one model, one clip after another (``--concurrency`` 1);
  ``workers`` K child processes each holding its own model, taking the next clip when free;
  ``batched`` (faster-whisper only) one model decoding K clips at once through its
  ``BatchedInferencePipeline`` (the clips of a batch are laid end to end and each given as one
  ``clip_timestamps`` span, which is how that pipeline batches the 30 s windows of one audio).

Decoding, the same for every engine and as close as each allows to vLLM's greedy: language
"en", task transcribe, no timestamps, beam 1 / best-of 1, temperature 0 and no fallback to higher
temperatures, no voice-activity filter, no conditioning on previous text, and nothing skipped as
"no speech" (faster-whisper's no-speech, log-probability and compression thresholds off). Each
engine keeps its own token suppression defaults (listed under ``decoding`` in the output).

Timing: ``load_s`` is from this program's start to ready (engine imported, model loaded, the
warm-up clip transcribed once; in ``workers`` mode, every worker ready), the analogue of a
service's time to READY. Clips are decoded from WAV to float32 before the clock starts;
``wall_s`` of a clip is its transcription (in ``batched`` mode, its batch's); ``total_wall_s``
from the first clip started to the last one done.

Memory: the PSS of this process's whole tree (``edgectl.contract.procmem.tree_mem``, so the
workers are counted), sampled every :data:`SAMPLE_INTERVAL_S` from start to end: the peak, the
value once ready before any clip (steady after load) and the value after the last clip, the
models still loaded.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgectl.contract.procmem import tree_mem
from edgectl.contract.speech_clips import SAMPLE_RATE, WARMUP_WAV, read_clip_set
from edgectl_runtime.tools.whisper_ggml import read_ftype

SCHEMA = "edgectl.speech-anchor/1"
ENGINES = ("faster-whisper", "whisper.cpp")
MODES = ("sequential", "workers", "batched")
SAMPLE_INTERVAL_S = 0.2
LANGUAGE = "en"
_GGML_COMPUTE = {"float16": "f16", "float32": "f32"}  # --compute-type -> the ggml file's float type


def process_age_s(proc: Path = Path("/proc")) -> float:
    """Seconds since this process started (the kernel's start time; interpreter start-up included)."""
    stat = (proc / "self" / "stat").read_text()
    start_ticks = int(stat[stat.rfind(")") + 2:].split()[19])  # field 22, starttime, after comm
    uptime_s = float((proc / "uptime").read_text().split()[0])
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")


def read_wav(path: Path) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV as float32 in [-1, 1) (what both engines take)."""
    with wave.open(str(path), "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (SAMPLE_RATE, 1, 2):
            raise ValueError(f"{path}: not {SAMPLE_RATE} Hz mono 16-bit")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


# -- the engines, one class each behind the same two calls -----------------------------------------


class FasterWhisper:
    """faster-whisper on CTranslate2 files."""

    def __init__(self, model: Path, compute_type: str, threads: int) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self._model = WhisperModel(str(model), device="cpu", compute_type=compute_type, cpu_threads=threads,
                                   num_workers=1, local_files_only=True)
        self._batched = BatchedInferencePipeline(self._model)

    # no fallback (one temperature), nothing skipped as silence, no VAD, no timestamps
    _OPTIONS: dict[str, Any] = dict(language=LANGUAGE, task="transcribe", beam_size=1, best_of=1, temperature=0.0,
                                    without_timestamps=True, vad_filter=False, condition_on_previous_text=False,
                                    no_speech_threshold=None, log_prob_threshold=None,
                                    compression_ratio_threshold=None)

    @staticmethod
    def versions() -> dict[str, str]:
        import ctranslate2
        import faster_whisper

        return {"faster-whisper": faster_whisper.__version__, "ctranslate2": ctranslate2.__version__}

    @classmethod
    def decoding(cls) -> dict[str, Any]:
        return {**cls._OPTIONS, "suppress_blank": True, "suppress_tokens": "[-1] (non-speech symbols)"}

    def transcribe(self, audio: np.ndarray) -> str:
        segments, _info = self._model.transcribe(audio, **self._OPTIONS)
        return " ".join(s.text.strip() for s in segments).strip()

    def transcribe_batch(self, audios: Sequence[np.ndarray]) -> list[str]:
        # the pipeline turns seconds back into samples with int(s * rate): a quarter sample past
        # each boundary keeps float rounding from moving it one sample back into the clip before
        spans, start = [], 0
        for a in audios:
            spans.append({"start": (start + 0.25) / SAMPLE_RATE, "end": (start + len(a) + 0.25) / SAMPLE_RATE})
            start += len(a)
        segments, _info = self._batched.transcribe(np.concatenate(audios), clip_timestamps=spans,
                                                   batch_size=len(audios), **self._OPTIONS)
        texts: list[list[str]] = [[] for _ in audios]
        for s in segments:  # each segment starts at its clip's offset (no timestamps: one per clip)
            index = max(i for i, span in enumerate(spans) if span["start"] <= s.start + 1e-3)
            texts[index].append(s.text.strip())
        return [" ".join(t).strip() for t in texts]


class WhisperCpp:
    """whisper.cpp through pywhispercpp on a ggml file."""

    def __init__(self, model: Path, compute_type: str, threads: int) -> None:
        from pywhispercpp.model import Model

        held = read_ftype(model)
        if held != _GGML_COMPUTE[compute_type]:
            raise ValueError(f"{model} holds {held}, not {compute_type} (whisper.cpp runs the file's float type; "
                             f"make one with python -m edgectl_runtime.tools.whisper_ggml --ftype)")
        self._model = Model(str(model), n_threads=threads, redirect_whispercpp_logs_to=False, **self._OPTIONS)

    _OPTIONS: dict[str, Any] = dict(language=LANGUAGE, translate=False, no_timestamps=True, no_context=True,
                                    temperature=0.0, temperature_inc=0.0, greedy={"best_of": 1},
                                    print_progress=False, print_realtime=False)

    @staticmethod
    def versions() -> dict[str, str]:
        from importlib.metadata import version

        return {"pywhispercpp": version("pywhispercpp")}

    @classmethod
    def decoding(cls) -> dict[str, Any]:
        return {**cls._OPTIONS, "suppress_blank": True, "suppress_nst": False}

    def transcribe(self, audio: np.ndarray) -> str:
        return " ".join(s.text.strip() for s in self._model.transcribe(audio)).strip()

    def transcribe_batch(self, audios: Sequence[np.ndarray]) -> list[str]:
        raise ValueError("whisper.cpp has no batched mode here: use --mode workers")


ENGINE_CLASSES: dict[str, type[FasterWhisper] | type[WhisperCpp]] = {
    "faster-whisper": FasterWhisper, "whisper.cpp": WhisperCpp}


@dataclass(frozen=True)
class EngineSpec:
    engine: str
    model: Path
    compute_type: str
    threads: int

    def load(self, warmup: Path | None) -> tuple[FasterWhisper | WhisperCpp, float]:
        """The loaded engine and the seconds its warm-up transcription took (0 without one)."""
        engine = ENGINE_CLASSES[self.engine](self.model, self.compute_type, self.threads)
        if warmup is None:
            return engine, 0.0
        audio = read_wav(warmup)
        t0 = time.perf_counter()
        engine.transcribe(audio)
        return engine, time.perf_counter() - t0


# -- memory -----------------------------------------------------------------------------------------


class TreeSampler:
    """The PSS of this process's tree, sampled on a thread; ``mark()`` takes one sample now."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()  # mark() runs on the sampling thread and the main one
        self.peak_bytes = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def mark(self) -> int:
        pss = tree_mem(os.getpid()).pss_bytes
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, pss)
            self.samples += 1
        return pss

    def _run(self) -> None:
        while not self._stop.is_set():
            self.mark()
            self._stop.wait(self._interval_s)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the modes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClipResult:
    id: str
    text: str
    wall_s: float
    started_s: float  # since the first clip started
    worker: int


def run_in_process(spec: EngineSpec, mode: str, concurrency: int, clips: list[tuple[str, np.ndarray]],
                   warmup: Path | None, sampler: TreeSampler) -> dict[str, Any]:
    engine, warmup_s = spec.load(warmup)
    ready_s = process_age_s()
    steady = sampler.mark()
    results: list[ClipResult] = []
    first = time.perf_counter()
    step = concurrency if mode == "batched" else 1
    for i in range(0, len(clips), step):
        group = clips[i:i + step]
        t0 = time.perf_counter()
        texts = engine.transcribe_batch([a for _, a in group]) if mode == "batched" else [
            engine.transcribe(group[0][1])]
        wall = time.perf_counter() - t0
        results += [ClipResult(cid, text, wall, t0 - first, 0) for (cid, _), text in zip(group, texts)]
    total = time.perf_counter() - first
    return {"load_s": ready_s, "warmup_s": [warmup_s], "clips": results, "total_wall_s": total,
            "pss_steady_bytes": steady, "pss_end_bytes": sampler.mark()}


def _worker(index: int, spec: EngineSpec, warmup: Path | None, clips: dict[str, np.ndarray],
            tasks: Any, results: Any, go: Any, finish: Any) -> None:
    """A worker process: load, say ready, transcribe clip ids from ``tasks`` until None, then
    hold the model until ``finish`` (so the last memory sample still sees it)."""
    try:
        engine, warmup_s = spec.load(warmup)
    except Exception as exc:  # reported to the parent, which fails the run with it
        results.put(("error", index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", index, warmup_s))
    go.wait()
    while (clip_id := tasks.get()) is not None:
        t0 = time.perf_counter()
        text = engine.transcribe(clips[clip_id])
        results.put(("done", index, (clip_id, text, time.perf_counter() - t0, time.time())))
    finish.wait()


def run_workers(spec: EngineSpec, concurrency: int, clips: list[tuple[str, np.ndarray]],
                warmup: Path | None, sampler: TreeSampler) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # a clean interpreter per worker: no engine state forked
    tasks, results, go, finish = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    audio = dict(clips)
    procs = [ctx.Process(target=_worker, args=(i, spec, warmup, audio, tasks, results, go, finish), daemon=True)
             for i in range(concurrency)]
    for p in procs:
        p.start()
    warmups: list[float] = []
    try:
        while len(warmups) < concurrency:
            kind, index, payload = _get(results, procs)
            if kind == "error":
                raise RuntimeError(f"worker {index} failed to load: {payload}")
            warmups.append(payload)
        ready_s = process_age_s()
        steady = sampler.mark()
        for clip_id, _ in clips:
            tasks.put(clip_id)
        for _ in procs:
            tasks.put(None)
        first, first_wall = time.perf_counter(), time.time()
        go.set()
        done: list[ClipResult] = []
        while len(done) < len(clips):
            _kind, index, (clip_id, text, wall, ended) = _get(results, procs)
            done.append(ClipResult(clip_id, text, wall, ended - wall - first_wall, index))
        total = time.perf_counter() - first
        end = sampler.mark()
    finally:
        finish.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    order = {cid: i for i, (cid, _) in enumerate(clips)}
    done.sort(key=lambda r: order[r.id])
    return {"load_s": ready_s, "warmup_s": warmups, "clips": done, "total_wall_s": total,
            "pss_steady_bytes": steady, "pss_end_bytes": end}


def _get(results: Any, procs: list[Any]) -> tuple[str, int, Any]:
    """The next message from the workers; fails if one died without a word."""
    while True:
        try:
            return results.get(timeout=1.0)  # type: ignore[no-any-return]
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"worker {dead[0]} exited with {procs[dead[0]].exitcode}") from None


# -- the program --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    clip_set = read_clip_set(args.clips)
    chosen = [c for c in clip_set.clips if not args.clip or c.id in args.clip]
    unknown = sorted(set(args.clip or ()) - {c.id for c in clip_set.clips})
    if unknown:
        raise ValueError(f"{args.clips} has no clip {', '.join(unknown)}")
    clips = [(c.id, read_wav(clip_set.path(c))) for c in chosen]
    seconds = {c.id: c.seconds for c in chosen}
    spec = EngineSpec(args.engine, args.model, args.compute_type, args.threads)
    with TreeSampler() as sampler:
        if args.mode == "workers":
            out = run_workers(spec, args.concurrency, clips, args.warmup, sampler)
        else:
            out = run_in_process(spec, args.mode, args.concurrency, clips, args.warmup, sampler)
    engine = ENGINE_CLASSES[args.engine]
    return {
        "schema": SCHEMA, "engine": args.engine, "model": str(args.model), "compute_type": args.compute_type,
        "threads": args.threads, "mode": args.mode, "concurrency": args.concurrency,
        "versions": engine.versions(), "decoding": engine.decoding(),
        "warmup": None if args.warmup is None else str(args.warmup),
        "load_s": out["load_s"], "warmup_s": out["warmup_s"],
        "clips": [{"id": r.id, "text": r.text, "wall_s": r.wall_s, "started_s": r.started_s, "worker": r.worker,
                   "seconds": seconds[r.id]} for r in out["clips"]],
        "audio_s": sum(seconds.values()), "total_wall_s": out["total_wall_s"],
        "memory": {"pss_peak_bytes": sampler.peak_bytes, "pss_steady_bytes": out["pss_steady_bytes"],
                   "pss_end_bytes": out["pss_end_bytes"], "samples": sampler.samples, "interval_s": SAMPLE_INTERVAL_S,
                   "what": "PSS of the driver's process tree (workers included), /proc/PID/smaps_rollup"},
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.speech_anchor",
                                description="Transcribe a clip set with faster-whisper or whisper.cpp, timed.")
    p.add_argument("--engine", choices=ENGINES, required=True)
    p.add_argument("--model", type=Path, required=True,
                   help="the CTranslate2 directory (faster-whisper) or the ggml file (whisper.cpp)")
    p.add_argument("--clips", type=Path, required=True, help="a clip set's clips.json or its directory")
    p.add_argument("--compute-type", default="int8",
                   help="faster-whisper: CTranslate2's compute type (int8, float32, ...); "
                        "whisper.cpp: the ggml file's float type (float16, float32)")
    p.add_argument("--threads", type=int, default=1, help="threads of one model instance")
    p.add_argument("--mode", choices=MODES, default="sequential")
    p.add_argument("--concurrency", type=int, default=1, help="workers, or clips per batch")
    p.add_argument("--clip", action="append", help="only this clip id (repeatable; default: every clip)")
    p.add_argument("--warmup", type=Path, default=WARMUP_WAV,
                   help="a clip transcribed once before ready (default: edgectl's warm-up clip)")
    p.add_argument("--no-warmup", dest="warmup", action="store_const", const=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    problems = []
    if args.threads < 1 or args.concurrency < 1:
        problems.append("--threads and --concurrency must be at least 1")
    if args.mode == "sequential" and args.concurrency != 1:
        problems.append("--mode sequential runs one clip at a time: --concurrency 1 (or --mode workers/batched)")
    if args.mode == "batched" and args.engine != "faster-whisper":
        problems.append(f"--mode batched is faster-whisper's BatchedInferencePipeline; {args.engine} has none: "
                        f"use --mode workers")
    if args.engine == "whisper.cpp" and args.compute_type not in _GGML_COMPUTE:
        problems.append(f"whisper.cpp runs the ggml file's float type: --compute-type {' or '.join(_GGML_COMPUTE)}")
    want = "is_file" if args.engine == "whisper.cpp" else "is_dir"
    if not getattr(args.model, want)():
        problems.append(f"--model {args.model} is not a {'file' if want == 'is_file' else 'directory'}")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    try:
        doc = run(args)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
