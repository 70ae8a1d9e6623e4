"""``edgectl status`` says where the running worker's compiled graph came from (the worker's
read-back, ``runtime/edgectl_runtime/vllm_plugin/compile_cache.py``), and says nothing of it for an eager plan."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from edgectl.contract.plan import Compilation, Plan
from edgectl.status import DeploymentStatus

PLAN = Path(__file__).parent / "fixtures" / "plans" / "deployed-w4a16.json"


def _status(compilation: Compilation, compile_facts: dict | None) -> DeploymentStatus:
    plan = replace(Plan.from_dict(json.loads(PLAN.read_text())), compilation=compilation)
    return DeploymentStatus("x", "edgectl-x.service", "active", "running", "serving", 1, 12.0,
                            "http://127.0.0.1:8000", plan, None, None, None, compile=compile_facts)


def test_a_graph_loaded_from_the_cache():
    s = _status(Compilation.DEFAULT, {"source": "cache", "load_s": 2.345, "compile_s": None,
                                      "artifact": "/var/cache/edgectl/x/vllm/a/model", "load_failure": None})
    assert s.to_dict()["compiled_graph"]["source"] == "cache"
    assert "compiled graph: loaded from the cache in 2.3 s" in s.render_text()


def test_a_graph_compiled_at_this_start_says_why():
    first = _status(Compilation.DEFAULT, {"source": "compiled", "compile_s": 41.0, "load_failure": None})
    assert first.to_dict()["compiled_graph"]["source"] == "compiled"
    assert "compiled at this start in 41 s (none was cached for these settings)" in first.render_text()
    failed = _status(Compilation.DEFAULT, {"source": "compiled", "compile_s": 41.0,
                                           "load_failure": "AttributeError: boom"})
    assert "the cached one failed to load: AttributeError: boom" in failed.render_text()


def test_eager_or_unknown_says_nothing_of_a_graph():
    eager = _status(Compilation.EAGER, {"source": None})
    assert eager.to_dict()["compiled_graph"] is None and "compiled graph" not in eager.render_text()
    unknown = _status(Compilation.DEFAULT, None)  # the worker did not answer
    assert unknown.to_dict()["compiled_graph"] is None and "compiled graph" not in unknown.render_text()
