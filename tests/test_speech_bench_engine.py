"""`edgectl bench whisper-base` with the real engines: ONE small run, edgectl's plan and faster-whisper
int8, 1 pass each, on a subset of the shipped clips (the ~5 s and ~30 s clips and four sentences).

It checks that the speech bench runs end to end against the real servers and drivers: the worker's
settings read back, each figure measured, the artifact complete and written. Never a timing: the
numbers of a 1-pass run on a shared machine mean nothing. whisper-base is pulled once by conftest's
fixture.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from models_helpers import run_cli

pytestmark = pytest.mark.engine

SUBSET = ("s01-clean", "s05-white20", "s07-pink10", "s12-clean", "rtf-5s", "rtf-30s")


def clip_subset(tmp_path: Path) -> Path:
    """The shipped clip set made into ``tmp_path``, and a set of SUBSET's clips beside it."""
    from edgectl.bench.speech.clips import make_clip_set

    full = tmp_path / "clips"
    make_clip_set(full)
    data = json.loads((full / "clips.json").read_text())
    subset = tmp_path / "subset"
    subset.mkdir()
    data["clips"] = [{**c, "file": str(full / c["file"])} for c in data["clips"] if c["id"] in SUBSET]
    (subset / "clips.json").write_text(json.dumps(data))
    return subset


def test_planned_and_faster_whisper_measure_every_figure(tmp_path: Path, pulled_whisper_base: Path) -> None:
    out = tmp_path / "results"
    env = {"EDGECTL_RUNTIME_PYTHON": os.environ.get("EDGECTL_RUNTIME_PYTHON", sys.executable),
           "EDGECTL_PROFILES_DIR": str(tmp_path / "profiles")}
    done = run_cli(["bench", "whisper-base", "--arms", "planned,faster-whisper-int8", "--passes", "1",
                    "--clips", str(clip_subset(tmp_path)), "--out", str(out), "--json"], env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    a = json.loads(done.stdout)
    assert a["schema"] == "edgectl.bench.speech/1"
    assert a["complete"], a["incomplete_reasons"]
    assert not a["quotable"]  # one pass: indicative only
    assert a["provenance"]["clips"]["count"] == len(SUBSET)
    (planned,) = a["arms"]["planned"]["passes"]
    (fw,) = a["arms"]["faster-whisper-int8"]["passes"]

    # edgectl's plan, read back from its worker: a speech plan, serving
    plan = a["arms"]["planned"]["plan"]
    assert plan["speech"] is not None
    assert planned["effective"]["phase"] == "serving"
    assert planned["effective"]["max_num_seqs"] == plan["max_num_seqs"]

    for p in (planned, fw):
        assert 0 <= p["wer"] < 0.5  # the model hears the clips (espeak-ng's voices, some with noise)
        assert p["rtf_5s"] > 0 and p["rtf_30s"] > 0 and p["transcript_s"] > 0
        assert p["aggregate_audio_s_per_s"] > 0
        assert p["pss_steady_bytes"] > 0 and p["ready_s"] > 0
        assert {c["id"] for c in p["clips"]} == set(SUBSET)
    assert set(fw["together"]) == {"workers", "batched"}
    assert a["memory_prediction"]["arms"]["planned"]["measured_bytes"] == planned["pss_steady_bytes"]
    assert Path(a["arms"]["planned"]["passes"][0]["log"]).is_file()
