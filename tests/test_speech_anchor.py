"""The speech bench's anchor driver (runtime/edgectl_runtime/tools/speech_anchor.py).

Its refusals and readers are checked everywhere; the runs need the real whisper-base, as the pull
keeps it (``<model cache>/ct2/whisper-base`` for faster-whisper, the converted
``<model cache>/whisper-base`` for whisper.cpp's ggml file), pulled once by conftest's fixture. They transcribe the shipped warm-up clip, started as the bench starts them
(edgectl/launch.py, the runtime interpreter). The int8 sequential run is the short one; the
workers, batched and whisper.cpp runs take tens of seconds each and are marked ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from installed import RUNTIME_PYTHON

from edgectl import launch
from edgectl.bench.speech.wer import word_errors
from edgectl.contract.speech_clips import (
    WARMUP_WAV,
    ClipSet,
    warmup_clip,
    write_clip_set,
)
from edgectl.models.cache import cache_dir

pytest.importorskip("safetensors.numpy")
from edgectl_runtime.tools import speech_anchor  # noqa: E402

MiB = 1 << 20


def test_the_driver_is_a_runtime_entry_point() -> None:
    assert launch.command("py", launch.SPEECH_ANCHOR, ["--engine", "faster-whisper"]) == [
        "py", "-P", "-m", "edgectl_runtime.tools.speech_anchor", "--engine", "faster-whisper"]
    assert launch.WHISPER_GGML in launch.ENTRY_POINTS


@pytest.mark.parametrize(("args", "says"), [
    (["--engine", "faster-whisper", "--concurrency", "2"], "--mode sequential runs one clip at a time"),
    (["--engine", "whisper.cpp", "--mode", "batched", "--concurrency", "2", "--compute-type", "float16"],
     "whisper.cpp has none: use --mode workers"),
    (["--engine", "whisper.cpp", "--compute-type", "int8"], "whisper.cpp runs the ggml file's float type"),
    (["--engine", "faster-whisper", "--threads", "0"], "must be at least 1"),
])
def test_bad_arguments_are_refused_one_line_each(args: list[str], says: str, tmp_path: Path, capsys) -> None:
    model = tmp_path / ("m.bin" if "whisper.cpp" in args else "m")
    model.touch() if "whisper.cpp" in args else model.mkdir()
    assert speech_anchor.main([*args, "--model", str(model), "--clips", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert says in err and all(line.startswith("error: ") for line in err.splitlines())


def test_process_age_reads_the_kernels_start_time(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    # pid (comm with spaces) state, then fields 4..; starttime is field 22
    fields = ["S"] + ["0"] * 18 + [str(100 * os.sysconf("SC_CLK_TCK"))] + ["0"] * 10
    (tmp_path / "self" / "stat").write_text("42 (a (b) c) " + " ".join(fields) + "\n")
    (tmp_path / "uptime").write_text("112.50 200.00\n")
    assert speech_anchor.process_age_s(tmp_path) == pytest.approx(12.5)
    assert 0 < speech_anchor.process_age_s() < 3600


def test_read_wav_gives_float32_in_unit_range() -> None:
    audio = speech_anchor.read_wav(WARMUP_WAV)
    assert audio.dtype.name == "float32" and len(audio) / 16000 == pytest.approx(warmup_clip().seconds, abs=1e-4)
    assert 0.1 < abs(audio).max() < 1.0


# -- runs on the real weights -------------------------------------------------------------------


@pytest.fixture(scope="module")
def warmup_set(tmp_path_factory) -> Path:
    """A clip set of the warm-up clip, twice (two ids, one file), so workers and batches have two."""
    d = tmp_path_factory.mktemp("clips")
    shutil.copyfile(WARMUP_WAV, d / WARMUP_WAV.name)
    clip = warmup_clip()
    twice = (clip, type(clip)(**{**clip.__dict__, "id": "warmup-2"}))
    write_clip_set(ClipSet(d, twice, {}))
    return d


@pytest.fixture(scope="module")
def ct2_whisper_base(pulled_whisper_base: Path) -> Path:
    """The CTranslate2 originals the pull keeps (conftest's fixture pulls whisper-base once)."""
    pytest.importorskip("faster_whisper")
    return cache_dir(os.environ) / "ct2" / "whisper-base"


def run_anchor(args: list[str]) -> dict:
    cmd = launch.command(RUNTIME_PYTHON, launch.SPEECH_ANCHOR, args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=launch.environment(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def check_transcripts(doc: dict, ids: list[str]) -> None:
    assert [c["id"] for c in doc["clips"]] == ids
    for c in doc["clips"]:
        assert word_errors(warmup_clip().text, c["text"]).wer <= 0.3, c["text"]
        assert c["wall_s"] > 0
    mem = doc["memory"]
    assert mem["pss_peak_bytes"] >= mem["pss_steady_bytes"] > 50 * MiB and mem["samples"] >= 2
    assert doc["load_s"] > 0 and doc["total_wall_s"] > 0


def test_faster_whisper_int8_transcribes_the_warmup_clip(ct2_whisper_base: Path, warmup_set: Path) -> None:
    doc = run_anchor(["--engine", "faster-whisper", "--model", str(ct2_whisper_base), "--clips", str(warmup_set),
                      "--compute-type", "int8", "--threads", "1", "--clip", "warmup"])
    assert doc["schema"] == "edgectl.speech-anchor/1" and doc["decoding"]["beam_size"] == 1
    check_transcripts(doc, ["warmup"])


@pytest.mark.slow  # tens of seconds on a real model
def test_faster_whisper_workers_are_counted_in_the_tree(ct2_whisper_base: Path, warmup_set: Path) -> None:
    doc = run_anchor(["--engine", "faster-whisper", "--model", str(ct2_whisper_base), "--clips", str(warmup_set),
                      "--compute-type", "int8", "--mode", "workers", "--concurrency", "2", "--no-warmup"])
    check_transcripts(doc, ["warmup", "warmup-2"])
    assert len(doc["warmup_s"]) == 2
    # two models in two processes: more than one int8 whisper-base (~74 MB of weights) each
    assert doc["memory"]["pss_steady_bytes"] > 2 * 100 * MiB


@pytest.mark.slow  # tens of seconds on a real model
def test_faster_whisper_batched_gives_the_sequential_text(ct2_whisper_base: Path, warmup_set: Path) -> None:
    common = ["--engine", "faster-whisper", "--model", str(ct2_whisper_base), "--clips", str(warmup_set),
              "--compute-type", "int8", "--no-warmup"]
    batched = run_anchor([*common, "--mode", "batched", "--concurrency", "2"])
    check_transcripts(batched, ["warmup", "warmup-2"])
    sequential = run_anchor([*common, "--clip", "warmup"])
    # the batched pipeline pads each clip's log-mel as transcribe() does: the same greedy text
    assert {c["text"] for c in batched["clips"]} == {sequential["clips"][0]["text"]}


@pytest.mark.slow  # tens of seconds on a real model
def test_whisper_cpp_transcribes_the_warmup_clip(warmup_set: Path, tmp_path: Path, pulled_whisper_base: Path) -> None:
    hf = pulled_whisper_base
    pytest.importorskip("pywhispercpp")
    ggml = tmp_path / "ggml-whisper-base.bin"
    done = subprocess.run(launch.command(RUNTIME_PYTHON, launch.WHISPER_GGML, [str(hf), str(ggml)]),
                          capture_output=True, text=True, timeout=600, env=launch.environment(os.environ))
    assert done.returncode == 0, done.stderr
    doc = run_anchor(["--engine", "whisper.cpp", "--model", str(ggml), "--clips", str(warmup_set),
                      "--compute-type", "float16", "--threads", "1", "--clip", "warmup", "--no-warmup"])
    check_transcripts(doc, ["warmup"])
