"""``edgectl status`` says how much audio a speech worker transcribed (its count, read from
``GET /edgectl/effective``: runtime/edgectl_runtime/service/audio_guard.py), and nothing of audio for a
worker that serves none."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.contract.effective import Effective
from edgectl.contract.plan import Plan
from edgectl.status import DeploymentStatus, audio_of

PLAN = Path(__file__).parent / "fixtures" / "plans" / "deployed-w4a16.json"


def _status(report: dict) -> DeploymentStatus:
    plan = Plan.from_dict(json.loads(PLAN.read_text()))
    return DeploymentStatus("x", "edgectl-x.service", "active", "running", "serving", 0, 12.0,
                            "http://127.0.0.1:8000", plan, None, None,
                            audio_transcribed=audio_of(Effective.from_dict(report)))


def test_a_speech_worker_s_count_is_shown():
    s = _status({"phase": "serving", "audio_seconds": 754.25, "transcriptions": 31})
    assert "  audio transcribed: 754.2 s in 31 requests" in s.render_text().splitlines()
    assert s.to_dict()["audio_transcribed"] == {"seconds": 754.25, "requests": 31}
    fresh = _status({"phase": "serving", "audio_seconds": 0.0, "transcriptions": 0})
    assert "audio transcribed: 0.0 s in 0 requests" in fresh.render_text()


def test_a_text_worker_or_an_older_one_says_nothing_of_audio():
    for report in ({"phase": "serving", "audio_seconds": None, "transcriptions": None}, {"phase": "serving"}):
        s = _status(report)
        assert "audio" not in s.render_text() and s.to_dict()["audio_transcribed"] is None
    assert audio_of(None) is None
