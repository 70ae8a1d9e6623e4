"""`edgectl bench` with the real engines: ONE small run, unmodified vLLM and edgectl's plan, 1 pass each.

It checks that the read-back works against the real servers (vLLM's own server through
/v1/models, /metrics and the read-back worker extension; edgectl's worker through
/edgectl/effective), that the levers show in what is read back, and that the artifact is
complete. Never a timing: the numbers of a 1-pass run on a shared machine mean nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from models_helpers import run_cli

from edgectl.contract.effective import head_family

pytestmark = pytest.mark.engine


def test_stock_and_planned_read_back_their_settings(tmp_path: Path, pulled_smollm2: Path) -> None:
    out = tmp_path / "results"
    env = {"EDGECTL_RUNTIME_PYTHON": os.environ.get("EDGECTL_RUNTIME_PYTHON", sys.executable),
           "EDGECTL_PROFILES_DIR": str(tmp_path / "profiles")}
    done = run_cli(["bench", "smollm2-135m", "--arms", "stock,planned", "--passes", "1", "--max-model-len", "1024",
                    "--out", str(out), "--json"], env=env, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    a = json.loads(done.stdout)
    assert a["complete"], a["incomplete_reasons"]
    (stock,) = a["arms"]["stock"]["passes"]
    (planned,) = a["arms"]["planned"]["passes"]
    plan = a["arms"]["planned"]["plan"]

    # the control: unmodified vLLM with the plan's KV bytes and context, edgectl's plugin kept out
    assert stock["effective"]["kv_cache_bytes"] == plan["kv_cache_bytes"]
    assert stock["effective"]["max_model_len"] == 1024
    assert set(stock["effective"]["rope_rows"].values()) == {8192}  # vLLM's uncapped table
    assert all(not f.startswith("cpu_int4") for f in stock["effective"]["linear_formats"].values())
    assert "edgectl_cpu_int4" in a["provenance"]["environment"]["stock_plugins_excluded"]
    assert "--enforce-eager" not in stock["command"]  # vLLM's default compilation
    assert stock["processes"] >= 2  # vLLM's own topology: API server, engine core, worker

    # edgectl's plan, as read back from its worker
    assert planned["effective"]["kv_cache_bytes"] == plan["kv_cache_bytes"]
    assert set(planned["effective"]["rope_rows"].values()) == {1024}
    # the output head the plan asks for (the default format differs per device class: a bf16 tied
    # head with w4a16, edgectl's int8 blocks with w4a8), and the mode, read back from the worker
    if plan["weight_format"] == "w4a8":
        assert head_family(planned["effective"]["lm_head_format"]) == "int8"
    else:
        assert planned["effective"]["lm_head_format"] == "bf16-tied-embedding"
    assert planned["effective"]["enforce_eager"] == (plan["compilation"] == "eager")
    assert planned["processes"] == 1

    # every pass measured something, from the whole tree; fidelity against the bf16 control
    for p in (stock, planned):
        assert p["decode"]["tokens"] == 128 and p["prefill"]["tokens"] == 512
        assert p["pss_steady_bytes"] == sum(m["pss_bytes"] for m in p["process_tree"])
    assert a["fidelity"]["reference_arm"] == "stock"
    assert stock["fidelity"]["top1_agreement"] == 1.0
    assert 0.5 <= planned["fidelity"]["top1_agreement"] <= 1.0 and planned["fidelity"]["positions"] > 100
    assert a["ratios"]["planned"]["median"]["pss_steady_bytes"] > 0
    assert Path(stock["log"]).is_file() and Path(stock["log"]).is_relative_to(out)
