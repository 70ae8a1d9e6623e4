"""The warm-up's answer is checked for the look of a broken model (edgectl/contract/worker.py).

A Gemma-3 checkpoint converted wrongly warmed up answering "енененен" and was reported ready;
such an answer is flagged in the worker's log and in `edgectl status`.
"""

from __future__ import annotations

import pytest

from edgectl.contract.plan import Plan
from edgectl.contract.worker import degenerate_answer
from edgectl.status import DeploymentStatus


@pytest.mark.parametrize("answer", ["енененен", "ен ен ен ", "!!!!!!!!", "the the the the", "", "   ", "aaa"])
def test_one_piece_repeated_or_nothing_is_flagged(answer):
    assert degenerate_answer(answer) is not None


@pytest.mark.parametrize("answer", ["Hello! How can I help you today?", "Paris", "Hi", "ab", "Hello, hello."])
def test_an_ordinary_answer_is_not(answer):
    assert degenerate_answer(answer) is None


def test_status_shows_the_warning():
    from pathlib import Path

    plan = Plan.load(Path(__file__).parent / "fixtures" / "plans" / "deployed-w4a16.json")
    suspect = degenerate_answer("енененен")
    d = DeploymentStatus("chat", "edgectl-chat.service", "active", "running", "serving", 0, 10.0,
                         "http://127.0.0.1:8000", plan, None, None, warmup={"answer": "енененен", "suspect": suspect})
    text = d.render_text()
    assert "warning: the warm-up answer is 'ен' repeated" in text and "may be broken" in text
    assert d.to_dict()["warmup"]["suspect"] == suspect
    fine = DeploymentStatus("chat", "edgectl-chat.service", "active", "running", "serving", 0, 10.0,
                            "http://127.0.0.1:8000", plan, None, None, warmup={"answer": "Hello!", "suspect": None})
    assert "warning" not in fine.render_text()
