"""``edgectl status`` says how many images a vision worker served (its count, read from
``GET /edgectl/effective``: runtime/edgectl_runtime/service/image_guard.py), and nothing of images for a
worker that serves a text or speech plan."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.contract.effective import Effective
from edgectl.contract.plan import Plan
from edgectl.status import DeploymentStatus, images_of

PLAN = Path(__file__).parent / "fixtures" / "plans" / "deployed-w4a16.json"


def _status(report: dict) -> DeploymentStatus:
    plan = Plan.from_dict(json.loads(PLAN.read_text()))
    return DeploymentStatus("x", "edgectl-x.service", "active", "running", "serving", 0, 12.0,
                            "http://127.0.0.1:8000", plan, None, None,
                            images_served=images_of(Effective.from_dict(report)))


def test_a_vision_worker_s_count_is_shown():
    s = _status({"phase": "serving", "images_served": 42, "image_requests": 31})
    assert "  images served: 42 in 31 requests" in s.render_text().splitlines()
    assert s.to_dict()["images_served"] == {"images": 42, "requests": 31}
    fresh = _status({"phase": "serving", "images_served": 0, "image_requests": 0})
    assert "images served: 0 in 0 requests" in fresh.render_text()


def test_a_text_worker_or_an_older_one_says_nothing_of_images():
    for report in ({"phase": "serving", "images_served": None, "image_requests": None}, {"phase": "serving"},
                   {"phase": "serving", "audio_seconds": 3.0, "transcriptions": 1}):
        s = _status(report)
        assert "image" not in s.render_text() and s.to_dict()["images_served"] is None
    assert images_of(None) is None
