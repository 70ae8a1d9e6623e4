"""Helpers for the bench tests: the bench run against the stand-in server (tests/fake_server.py).

The launchers are replaced through run_bench's ``launchers`` seam: each arm's real command line
is handed to the fake server after ``--`` (the worker's plan file, vLLM's arguments,
llama-server's flags), so the harness's rules are tested with real processes on real ports.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from models_helpers import REPO, llama_tensors, make_model, tiny_config

from edgectl.bench import report
from edgectl.bench.core import BenchOptions, run_bench
from edgectl.launch import worker_command

FAKE = str(Path(__file__).resolve().parent / "fake_server.py")
HOST = REPO / "tests" / "fixtures" / "hosts" / "kvm-xeon-avx512-2c"
# A small Llama with a real-sized vocabulary (random prefill prompts need > 768 ids).
SHAPE = {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "vocab": 4096}


def tiny_model(root: Path) -> Path:
    return make_model(root / "tiny-llama", tiny_config(vocab_size=SHAPE["vocab"]), llama_tensors(**SHAPE))


def environ(tmp_path: Path) -> dict[str, str]:
    """The bench's environment: private profiles and cache; this checkout first on the path, so the
    fake server reads its plan with this checkout's edgectl."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGECTL_")}
    env.update(EDGECTL_PROFILES_DIR=str(tmp_path / "profiles"), EDGECTL_MODEL_CACHE=str(tmp_path / "cache"),
               EDGECTL_RUNTIME_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "runtime"), env.get("PYTHONPATH", "")])
    return env


def fake_launchers(options: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Launchers replaced by the fake server; ``options[arm]`` are its misbehaviour flags (``arm``: the
    arm as run, e.g. ``llama.cpp-t2``, or as declared, ``llama.cpp``, for all its thread counts)."""
    options = options or {}

    def worker(arm, port, pass_dir):
        # the optimization flag as the worker's own command line has it (python -OO)
        flags = [f for f in worker_command(sys.executable, "PLAN", arm.plan.levers.python_optimize) if f.startswith("-O")]
        return [sys.executable, *flags, FAKE, *options.get(arm.name, []), "--", "--plan", str(pass_dir / "plan.json")]

    def vllm(arm, port, pass_dir):
        return [sys.executable, FAKE, *options.get(arm.name, []), "--", "--vllm", *arm.server_args(port)]

    def llama(arm, port, pass_dir):
        flags = options.get(arm.name, options.get(arm.spec.name, []))
        return [sys.executable, FAKE, *flags, "--", "--llama", *arm.server_args(port)]

    return {"worker": worker, "vllm": vllm, "vllm-defaults": vllm, "llama.cpp": llama}


def bench(tmp_path: Path, model_dir: Path, facts, arms: str, passes: int = 3,
          options: dict[str, list[str]] | None = None, **kw: Any) -> report.BenchResult:
    opts = BenchOptions(model=str(model_dir), arms=arms, passes=passes, out=tmp_path / "results",
                        max_model_len=1024, start_timeout_s=60, argv=["edgectl", "bench", "test"],
                        **{"quiet_s": 0.0, **kw})  # the fake server has no idle trim to wait for
    lines: list[str] = []
    result = run_bench(opts, environ(tmp_path), lines.append, facts=facts, launchers=fake_launchers(options))
    result.messages.extend(lines)
    return result
