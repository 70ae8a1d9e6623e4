"""The set-up leaves the worker nothing to compile: every module a start imports has its
up-to-date ``.opt-2.pyc`` (the worker runs under ``python -OO``; the service cannot write them).

Checked in the installed runtime with ``PYTHONDONTWRITEBYTECODE=1``, as the service sees it:
the check itself must not write what it checks. Before scripts/setup.sh ran its pre-compile
without that variable, all ~4400 modules of the worker's import were compiled at every start.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from installed import RUNTIME_PYTHON, runtime_missing

pytestmark = pytest.mark.runtime

# What a start imports at the top (as scripts/setup.sh's own import step), and some of what it
# imports only during the engine's start (the loader, the model's quantization helpers, the
# server's middleware), which only the whole-venv compile covers.
IMPORTS = (
    "edgectl_runtime.service.worker", "edgectl_runtime.vllm_plugin.inproc", "edgectl_runtime.vllm_plugin.compile_cache",
    "vllm.entrypoints.launchers.api_server.entry", "vllm.entrypoints.launchers.app",
    "vllm.model_executor.models.llama", "vllm.v1.worker.cpu_worker",
    "vllm.model_executor.model_loader.default_loader", "compressed_tensors", "uvicorn.protocols.http.httptools_impl",
)

CHECK = r"""
import importlib.util, json, os, struct, sys
for n in ("opentelemetry", "cv2", "accelerate"):  # as the worker (levers.optional_imports)
    sys.modules[n] = None
for name in sys.argv[1:]:
    __import__(name)
missing, stale, checked = [], [], 0
for name, mod in list(sys.modules.items()):
    spec = getattr(mod, "__spec__", None)
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py") or not os.path.exists(origin):
        continue
    checked += 1
    pyc = importlib.util.cache_from_source(origin, optimization=2)
    try:
        with open(pyc, "rb") as f:
            head = f.read(16)
    except OSError:
        missing.append(name)
        continue
    st = os.stat(origin)
    flags, mtime, size = struct.unpack("<III", head[4:16])
    if flags == 0 and (mtime != int(st.st_mtime) & 0xFFFFFFFF or size != st.st_size & 0xFFFFFFFF):
        stale.append(name)
print(json.dumps({"optimize": sys.flags.optimize, "checked": checked, "missing": missing, "stale": stale}))
"""


def test_every_module_a_start_imports_is_precompiled_for_python_OO(tmp_path):
    why = runtime_missing()
    if why:
        pytest.skip(why)
    # the installed copy, as the service runs it: no checkout ahead of it on the path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    done = subprocess.run([RUNTIME_PYTHON, "-OO", "-c", CHECK, *IMPORTS], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["optimize"] == 2
    assert got["checked"] > 1000, got["checked"]  # the import really pulled vLLM in
    assert not got["missing"], (f"{len(got['missing'])} of {got['checked']} modules have no .opt-2.pyc "
                                f"(scripts/setup.sh compiles them): {got['missing'][:20]}")
    assert not got["stale"], f"{len(got['stale'])} .opt-2.pyc older than their source: {got['stale'][:20]}"
