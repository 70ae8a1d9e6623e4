"""The ISA a run holds the runtime to, read back at every layer: PyTorch, oneDNN, vLLM's C
library, and inside the engine (vLLM's attention kernel, PyTorch's capability, the level of
edgectl's kernels, the plan).

Run twice by ``sh scripts/test.sh``: on this machine's own ISA, and in the AVX2 tier
(``EDGECTL_TEST_ISA=avx2``, tests/isa_helpers.py). In the tier each layer must read back AVX2:
an environment that did not take (a variable dropped on the way to a subprocess, a
sitecustomize that no longer patches, a vLLM that asks something else) fails here, rather than
letting the tier's other tests pass on AVX-512. Natively each layer must read back what
``edgectl probe`` finds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import isa_helpers
import pytest
from installed import RUNTIME_PYTHON
from int4_helpers import REPO, read_json_line, runtime_env

from edgectl.deploy import QUESTION
from edgectl.launch import worker_command

pytestmark = pytest.mark.isa_avx2

_READ_ISA = r"""
import json, os, sys
import torch
# oneDNN prints the ISA it dispatches to (ONEDNN_MAX_CPU_ISA applied) with its first primitive
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
    torch._C._nn.mkldnn_linear(torch.randn(8, 64).to_mkldnn(), torch.randn(32, 64).to_mkldnn())
import vllm._custom_ops  # noqa: F401  (loads vLLM's C library for this CPU: vllm/platforms/cpu.py)
libs = sorted({os.path.basename(line.rsplit(" ", 1)[-1]).split(".", 1)[0]
               for line in open("/proc/self/maps").read().splitlines()
               if "/vllm/" in line and line.endswith(".so") and os.path.basename(line.rsplit(" ", 1)[-1]).startswith("_C")})
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "avx512": bool(torch.cpu._is_avx512_supported()),
    "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
    "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
    "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    "vllm_libraries": libs,
}))
"""


@pytest.fixture(scope="module")
def runtime_isa() -> tuple[dict, str]:
    """What a runtime process of this run reads back: torch's answers, vLLM's library, and
    oneDNN's own ``isa:`` line."""
    pytest.importorskip("torch")
    done = subprocess.run([RUNTIME_PYTHON, "-c", _READ_ISA], env=runtime_env(), capture_output=True, text=True,
                          timeout=300, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    onednn = [line.split("isa:", 1)[1].strip() for line in done.stdout.splitlines()
              if line.startswith("onednn_verbose") and ",cpu,isa:" in line]
    assert len(onednn) == 1, done.stdout[-3000:]
    return read_json_line(done.stdout), onednn[0]


def test_the_tier_is_one_there_is():
    """A mistyped tier must not run as the native one."""
    assert isa_helpers.TIER in (None, *isa_helpers.TIERS), isa_helpers.TIER
    if isa_helpers.TIER == "avx2":
        # what scripts/test.sh sets for the tier; a runtime process inherits it (int4_helpers.runtime_env)
        env = runtime_env()
        assert env.get("ATEN_CPU_CAPABILITY") == "avx2" and env.get("ONEDNN_MAX_CPU_ISA") == "AVX2", env
        assert str(REPO / "tests" / "isa_avx2") in env["PYTHONPATH"].split(os.pathsep), env["PYTHONPATH"]


@pytest.mark.runtime
def test_torch_answers_for_the_runs_isa(runtime_isa):
    """PyTorch's dispatch level and the ISA questions vLLM asks it (``torch.cpu._is_*``)."""
    got, _ = runtime_isa
    isa = isa_helpers.host_isa()
    assert got["capability"] == isa_helpers.expected_torch_capability(isa), (got, isa)
    assert got["avx512"] == isa_helpers.avx512(isa), (got, isa)
    assert got["avx512_bf16"] == bool(isa["avx512_bf16"]), (got, isa)
    assert got["amx_tile"] == bool(isa["amx_tile"]), (got, isa)
    if isa_helpers.TIER == "avx2":
        assert (got["capability"], got["avx512"]) == ("AVX2", False), got


@pytest.mark.runtime
def test_onednn_dispatches_at_the_runs_isa(runtime_isa):
    """oneDNN's own report (ONEDNN_MAX_CPU_ISA applied), and whether it builds bf16 matmuls: only
    with AVX-512 (core) or more."""
    got, onednn = runtime_isa
    isa = isa_helpers.host_isa()
    if isa_helpers.TIER == "avx2":
        assert onednn == "Intel AVX2", onednn
        assert got["onednn_bf16"] is False, got
    elif isa_helpers.avx512(isa):
        assert any(s in onednn for s in ("AVX-512", "AVX512", "AVX10")), onednn
        assert got["onednn_bf16"] is True, got
    else:
        assert "AVX-512" not in onednn and "AVX10" not in onednn, onednn


@pytest.mark.runtime
def test_vllm_loads_the_library_of_the_runs_isa(runtime_isa):
    got, _ = runtime_isa
    if os.uname().machine != "x86_64":
        pytest.skip("the library rule is vLLM's x86-64 one")
    expected = isa_helpers.expected_vllm_library(isa_helpers.host_isa())
    assert got["vllm_libraries"] == [expected], got
    if isa_helpers.TIER == "avx2":
        assert got["vllm_libraries"] == ["_C_AVX2"], got


# --- inside the engine: the plan an AVX2 user gets, served at AVX2

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.engine
def test_the_engine_serves_the_runs_plan_at_the_runs_isa(tmp_path, pulled_smollm2):
    """The planner is told the run's ISA (in the tier: this host as an AVX2 machine, device class
    x86_64-avx2); the worker serves only once the engine's read-back matches that plan; the engine
    reads back PyTorch's capability and vLLM's attention kernel for the run's ISA; and it answers."""
    isa = isa_helpers.host_isa()
    env = runtime_env()
    # eager: a compile costs minutes on 2 cores (compiled mode is the deploy test's and the bench's)
    out = subprocess.run([sys.executable, "-m", "edgectl", "plan", "smollm2-135m", "--max-model-len", "1024",
                          "--compilation", "eager", "--json", *isa_helpers.plan_args(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    if isa_helpers.TIER == "avx2":
        assert plan["device_class"] == "x86_64-avx2", plan["device_class"]
    port = _free_port()
    plan["serve"]["port"] = port
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in env.items() if k not in ("NOTIFY_SOCKET", "VLLM_CPU_KVCACHE_SPACE")}
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(worker_command(RUNTIME_PYTHON, str(tmp_path / "plan.json"),
                                               plan["levers"]["python_optimize"]),
                                env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 900
            eff: dict = {}
            while True:
                # the worker exits 3 if the engine's settings differ from the plan (effective.py)
                assert proc.poll() is None, log_path.read_text()[-3000:]
                try:
                    eff = _get(base + "/edgectl/effective")
                    if eff.get("phase") == "serving":
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the worker did not become ready"
                time.sleep(0.5)
            assert eff["kernel"]["cpu_capability"] == isa_helpers.expected_torch_capability(isa), eff["kernel"]
            assert eff["attention_isa"] == [isa_helpers.expected_attention_isa(isa)], eff["attention_isa"]
            # edgectl's plugin loads its kernel library in every worker at the level the environment
            # selects (runtime/edgectl_runtime/kernels/ops: EDGECTL_KERNEL_ISA, under ATEN_CPU_CAPABILITY)
            assert eff["kernel_isa"] == isa_helpers.expected_kernel_isa(isa), eff["kernel_isa"]
            if isa_helpers.TIER == "avx2":
                assert (eff["kernel"]["cpu_capability"], eff["attention_isa"], eff["kernel_isa"]) == \
                    ("AVX2", ["vec"], "avx2"), eff
            req = urllib.request.Request(base + "/v1/chat/completions", headers={"content-type": "application/json"},
                                         data=json.dumps({"model": "smollm2-135m", "max_tokens": 16, "temperature": 0,
                                                          "messages": [{"role": "user", "content": QUESTION}]}).encode())
            with urllib.request.urlopen(req, timeout=300) as r:
                answer = json.loads(r.read())["choices"][0]["message"]["content"]
            assert "Paris" in answer, answer
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
