"""The worker without systemd: refusals before loading, and a graceful drain on SIGTERM.

The refusals of a plan or an environment come before anything imports vLLM, so they run the real
worker from this checkout with any Python. Refusing a port in use needs vLLM's server set-up (the
installed runtime); the drain test serves the real SmolLM2 (one engine start).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import isa_helpers
import pytest
from installed import RUNTIME_PYTHON
from models_helpers import REPO

from edgectl.launch import worker_command


def _plan_for(model: str, port: int, tmp_path: Path, *args: str, **changes) -> Path:
    """A plan for the catalog model (from its shipped config if it is not pulled), on ``port``, in
    eager mode unless ``args`` ask otherwise; ``args`` are more `edgectl plan` options."""
    if "--compilation" not in args:  # each compile costs minutes on 2 cores; compiled mode: test_compile_cache_engine.py
        args = ("--compilation", "eager", *args)
    out = subprocess.run([sys.executable, "-m", "edgectl", "plan", model, "--max-model-len", "1024", *args, "--json"],
                         capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    plan["serve"]["port"] = port
    plan.update(changes)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "VLLM_CPU_KVCACHE_SPACE")}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "runtime"), full.get("PYTHONPATH", "")])
    full.update(extra or {})
    return full


def _worker(plan: Path, env: dict[str, str] | None = None, python: str = sys.executable, **kw) -> subprocess.Popen:
    """The worker of this checkout, started as the unit starts it (python -OO when the plan says so)."""
    try:
        optimize = int(json.loads(plan.read_text())["levers"]["python_optimize"])
    except (ValueError, KeyError, TypeError):  # a plan that is not one: the worker refuses it anyway
        optimize = 0
    return subprocess.Popen(worker_command(python, str(plan), optimize), env=_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, **kw)


def test_an_environment_override_of_the_kv_budget_is_refused(tmp_path):
    plan = _plan_for("smollm2-135m", _free_port(), tmp_path)
    proc = _worker(plan, {"VLLM_CPU_KVCACHE_SPACE": "4"})
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]
    assert "VLLM_CPU_KVCACHE_SPACE=4 is set" in out and "unset it" in out
    assert "Loading weights" not in out  # refused before anything was loaded


@pytest.mark.runtime
def test_a_port_in_use_is_refused_before_loading(tmp_path, pulled_smollm2):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        plan = _plan_for("smollm2-135m", busy.getsockname()[1], tmp_path)
        proc = _worker(plan, python=RUNTIME_PYTHON)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-2000:]
    assert "cannot bind 127.0.0.1" in out and "pick another with --port" in out
    assert "Loading weights" not in out


def test_a_plan_that_is_not_a_plan_is_refused(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps({"schema": "something/1"}))
    proc = _worker(bad)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "is not an edgectl plan" in out


def test_a_plan_with_a_bad_field_is_refused_naming_it(tmp_path):
    path = _plan_for("smollm2-135m", _free_port(), tmp_path)
    plan = json.loads(path.read_text())
    plan["threads"] = "two"
    path.write_text(json.dumps(plan))
    proc = _worker(path)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out[-2000:]
    assert f"{path}: plan.threads: expected an integer, got a string 'two'" in out


def _get(url: str, timeout: float = 5) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.mark.engine
def test_sigterm_finishes_the_running_request_refuses_new_ones_and_exits_0(tmp_path, pulled_smollm2):
    port = _free_port()
    plan = _plan_for("smollm2-135m", port, tmp_path)
    # The drain is bounded by the plan's stop timeout (30 s): on a loaded 2-core machine 200 tokens
    # can take longer, and the cut-off request would fail this test for the wrong reason.
    data = json.loads(plan.read_text())
    data["timeouts"]["stop_s"] = 600
    plan.write_text(json.dumps(data))
    proc = _worker(plan, python=RUNTIME_PYTHON)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        try:
            status, body = _get(base + "/edgectl/effective")
            if status == 200 and body.get("phase") == "serving":
                break
        except OSError:
            pass
        time.sleep(0.5)
    else:
        pytest.fail("the worker did not become ready")
    # the probes a Kubernetes pod uses (edgectl/fleet/k8s.py): alive and ready while serving
    assert _get(base + "/edgectl/live") == (200, {"ok": True, "phase": "serving", "why": "serving"})
    assert _get(base + "/edgectl/ready") == (200, {"ok": True, "phase": "serving", "why": "serving"})
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()

    # a long streamed generation is in flight when SIGTERM arrives
    body = json.dumps({"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 200,
                       "ignore_eos": True, "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body, headers={"content-type": "application/json"})
    chunks: list[dict] = []
    first_token = threading.Event()

    def consume() -> None:
        with urllib.request.urlopen(req, timeout=300) as r:
            for line in r:
                line = line.strip()
                if line.startswith(b"data: {"):
                    chunks.append(json.loads(line[6:]))
                    first_token.set()

    reader = threading.Thread(target=consume)
    reader.start()
    assert first_token.wait(120), "the generation did not start"
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    # while draining, a new request is turned away rather than queued
    late = urllib.request.Request(base + "/v1/completions",
                                  data=json.dumps({"model": "smollm2-135m", "prompt": "hi", "max_tokens": 2}).encode(),
                                  headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(late, timeout=30) as r:
            late_status = r.status
    except urllib.error.HTTPError as exc:
        late_status = exc.code
    except OSError:
        late_status = "refused"
    # draining: no longer ready (a pod leaves its Service), still alive (no restart mid-drain)
    try:
        ready_while_draining = _get(base + "/edgectl/ready")
        live_while_draining = _get(base + "/edgectl/live")[0]
    except OSError:
        ready_while_draining, live_while_draining = "refused", "refused"
    reader.join(timeout=300)
    assert proc.wait(timeout=120) == 0, "".join(log)[-3000:]
    # the in-flight request got every token it asked for
    text_chunks = [c for c in chunks if c.get("choices") and c["choices"][0].get("text") is not None]
    finish = [c["choices"][0].get("finish_reason") for c in text_chunks if c["choices"][0].get("finish_reason")]
    assert finish == ["length"], (finish, "".join(log)[-3000:])
    assert late_status in (503, "refused"), late_status
    if ready_while_draining != "refused":
        assert ready_while_draining[0] == 503 and ready_while_draining[1]["phase"] == "stopping", ready_while_draining
        assert live_while_draining == 200
    assert any("stopping: finishing running requests" in line for line in log), "".join(log)[-2000:]


@pytest.mark.engine
@pytest.mark.isa_avx2
def test_a_w4a8_plan_serves_on_edgectls_kernels(tmp_path, pulled_smollm2):
    """`--format w4a8` (x86-64 with AVX2: the planner's host rule): the worker serves only once the
    engine's read-back matches the plan (edgectl/contract/effective.py), and reports the kernel
    ISA level it dispatched to: the run's (isa_helpers; avx2 in the AVX2 tier)."""
    isa = isa_helpers.host_isa()
    if not (isa["avx2"] and isa["fma"]):
        pytest.skip("w4a8 is planned on x86-64 with AVX2 only")
    port = _free_port()
    plan = _plan_for("smollm2-135m", port, tmp_path, "--format", "w4a8", *isa_helpers.plan_args(tmp_path))
    assert json.loads(plan.read_text())["quantize_lm_head"] is True  # the int8 head, by default
    proc = _worker(plan, python=RUNTIME_PYTHON)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        body: dict = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                status, body = _get(base + "/edgectl/effective")
                if status == 200 and body.get("phase") == "serving":
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("the worker did not become ready")
        # avx512vnni where AVX-512 VNNI is usable, else avx2 (the AVX2 tier: EDGECTL_KERNEL_ISA=avx2)
        assert body["kernel_isa"] == isa_helpers.expected_kernel_isa(isa), body.get("kernel_isa")
        counts = body["linear_format_counts"]
        assert counts.get("w4a8/b32") == 120, counts  # 30 x qkv, o, gate_up, down: all on edgectl's W4
        assert body["lm_head_format"] == "w8a8/b32-tied-embedding"
        req = urllib.request.Request(base + "/v1/completions", headers={"content-type": "application/json"},
                                     data=json.dumps({"model": "smollm2-135m", "prompt": "The capital of France is",
                                                      "max_tokens": 8, "temperature": 0}).encode())
        with urllib.request.urlopen(req, timeout=120) as r:
            text = json.loads(r.read())["choices"][0]["text"]
        assert text.strip(), text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
