"""edgectl deploy under a real systemd, with the real vLLM engine and the real SmolLM2 model.

One scenario, in order, sharing one sandbox and few engine starts (each ~30-60 s on 2 cores):
deploy (the default plan's timeouts) → active and READY → a chat completion says Paris → ``kill -9``
of the worker → systemd restarts it and it is READY again, and ``edgectl status`` calls it a crash
(where the planner chose compiled mode for this class, the first start compiled the graph and the
restart loaded it from the deployment's cache) →
``kill -STOP`` → the watchdog kills and restarts it, status says so (the times are printed here; the
60 s bound is asserted over 3 runs of each fault in tests/test_faults_systemd.py) → a
re-deploy with a broken model rolls back to the running previous version → undeploy leaves no
unit, no config, no process.

The steps depend on each other, so they are one test with named phases; a failure says which.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
from sandbox import SystemdSandbox, systemd_sandbox  # noqa: F401  (the fixture)

from edgectl.deploy import QUESTION  # a question whose answer is not a near-tie

pytestmark = [pytest.mark.systemd, pytest.mark.engine]

EDGECTL = "/opt/edgectl/venv/bin/edgectl"
UNIT_DIR = "/run/systemd/system"  # the sandbox's private runtime unit directory
CONFIG_DIR = "/run/edgectl-test/etc"  # private to the sandbox as well


def _env(extra: dict[str, str] | None = None) -> list[str]:
    env = {"EDGECTL_UNIT_DIR": UNIT_DIR, "EDGECTL_CONFIG_DIR": CONFIG_DIR, **(extra or {})}
    return ["env", *(f"{k}={v}" for k, v in env.items())]


def edgectl(sb: SystemdSandbox, *args: str, timeout: float = 900):
    return sb.run([*_env(), EDGECTL, *args], timeout=timeout)


def _chat(port: int, question: str) -> str:
    body = json.dumps({"model": "smollm2-135m", "temperature": 0, "max_tokens": 32,
                       "messages": [{"role": "user", "content": question}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def _wait_active_again(sb: SystemdSandbox, unit: str, restarts_before: int, timeout_s: float) -> dict[str, str]:
    return sb.wait_for(
        unit,
        lambda v: int(v.get("NRestarts", "0") or 0) > restarts_before and v["ActiveState"] == "active"
        and v["SubState"] == "running",
        timeout_s=timeout_s, props=("ActiveState", "SubState", "NRestarts", "MainPID", "StatusText", "Result"),
        what="restarted and READY again",
    )


def _status(sb: SystemdSandbox, name: str) -> dict:
    s = edgectl(sb, "status", name, "--json")
    assert s.returncode == 0, s.stderr
    return json.loads(s.stdout)["deployments"][0]


def _broken_copy(src: Path, dst: Path) -> None:
    """A model that passes inspection (config, tokenizer, the GGUF's header) but cannot load: the
    GGUF's tensor ``blk.29.ffn_down.weight`` renamed in its header, so layer 29's down_proj gets
    no weights (edgectl's loader refuses an incomplete model)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "model.gguf" and f.is_file():
            shutil.copy(f, dst / f.name)
    data = bytearray((src / "model.gguf").read_bytes())
    at = data.find(b"blk.29.ffn_down.weight")
    assert at > 0
    data[at:at + 22] = b"blk.29.ffn_dowx.weight"
    (dst / "model.gguf").write_bytes(bytes(data))
    for f in dst.iterdir():
        os.chmod(f, 0o644)
    os.chmod(dst, 0o755)


def test_deploy_restart_watchdog_rollback_undeploy(systemd_sandbox, pulled_smollm2):  # noqa: F811
    sb = systemd_sandbox
    name, port = "smoke", 8311
    unit = f"edgectl-{name}.service"

    # -- deploy: active only after READY, and it answers
    r = edgectl(sb, "deploy", "smollm2-135m", "--name", name, "--port", str(port),
                "--max-model-len", "2048", "--json")
    assert r.returncode == 0, f"deploy failed:\n{r.stdout}\n{r.stderr}"
    result = json.loads(r.stdout)
    assert result["endpoint"] == f"http://127.0.0.1:{port}"
    state = sb.show(unit, "ActiveState", "SubState", "StatusText", "NRestarts", "MainPID", "Type",
                    "WatchdogUSec", "MemoryMax")
    assert (state["ActiveState"], state["SubState"]) == ("active", "running")
    assert state["StatusText"].startswith("serving smollm2-135m")
    watchdog_s = result["plan"]["timeouts"]["watchdog_s"]
    assert state["WatchdogUSec"] == f"{watchdog_s}s"
    assert int(state["MemoryMax"]) == result["plan"]["memory"]["limit_bytes"]
    assert "paris" in _chat(port, QUESTION).lower()

    # status reports measured PSS next to the prediction, from the service's cgroup
    s = edgectl(sb, "status", name, "--json")
    assert s.returncode == 0, s.stderr
    dep = json.loads(s.stdout)["deployments"][0]
    assert dep["state"] == "active"
    assert dep["memory"]["pss_bytes"] > 100 << 20
    assert dep["memory"]["predicted_total_bytes"] == result["plan"]["memory"]["total_bytes"]
    assert [p["pid"] for p in dep["memory"]["processes"]] == [int(state["MainPID"])]
    compiled = result["plan"]["compilation"] != "eager"  # the planner chose it for this class from its profile
    if compiled:  # a fresh deployment has no graph in its cache directory yet: this start compiled it
        assert dep["compiled_graph"]["source"] == "compiled", dep["compiled_graph"]
    else:
        assert dep["compiled_graph"] is None

    # -- kill -9: systemd restarts it (Restart=on-failure) and it becomes READY again
    pid = int(state["MainPID"])
    killed_at = time.monotonic()
    sb.run(["kill", "-9", str(pid)])
    after = _wait_active_again(sb, unit, int(state["NRestarts"]), timeout_s=400)
    killed_back_s = time.monotonic() - killed_at
    assert int(after["MainPID"]) != pid
    assert "paris" in _chat(port, QUESTION).lower()
    dep = _status(sb, name)
    assert dep["watchdog_s"] == watchdog_s
    assert (dep["last_failure"]["kind"], dep["last_failure"]["signal"]) == ("crash", "KILL"), dep
    if compiled:  # the restart loaded the graph the first start saved in the deployment's cache
        assert dep["compiled_graph"]["source"] == "cache", dep["compiled_graph"]
    print(f"\nkill -9 → READY again in {killed_back_s:.1f} s (RestartSec= included); "
          f"compiled graph: {dep['compiled_graph']}")

    # -- kill -STOP: the pings stop, the watchdog kills it, systemd restarts it
    pid = int(after["MainPID"])
    stopped_at = time.monotonic()
    sb.run(["kill", "-STOP", str(pid)])
    again = _wait_active_again(sb, unit, int(after["NRestarts"]), timeout_s=watchdog_s + 600)
    assert int(again["MainPID"]) != pid
    assert "paris" in _chat(port, QUESTION).lower()
    print(f"\nSIGSTOP → serving again in {time.monotonic() - stopped_at:.1f} s (WatchdogSec={watchdog_s})")
    assert "Watchdog timeout" in sb.journal(unit, 200)
    dep = _status(sb, name)
    # the kind is what status promises; the signal the process died of is systemd's SIGABRT, or a fault
    # while a thread handles it on the way down (SEGV was seen on this box): either way a named signal
    assert dep["last_failure"]["kind"] == "watchdog" and dep["last_failure"]["signal"], dep
    text = edgectl(sb, "status", name).stdout
    assert f"watchdog {watchdog_s} s; last failure at " in text and "the watchdog: " in text, text

    # -- a re-deploy with a model that cannot load rolls back to the running previous version
    plan_before = json.loads(sb.host_path(f"{CONFIG_DIR}/{name}/plan.json").read_text())
    broken = Path("/var/lib/edgectl/test-broken-model")
    try:
        _broken_copy(Path(plan_before["model"]["path"]), broken)
        r = edgectl(sb, "deploy", str(broken), "--name", name, "--port", str(port),
                    "--max-model-len", "2048")
        assert r.returncode == 1, f"the broken deploy should fail:\n{r.stdout}\n{r.stderr}"
        assert "did not become ready" in r.stderr
        assert "previous deployment is restored and running" in r.stderr, r.stderr
        assert "--- journal" in r.stderr
    finally:
        shutil.rmtree(broken, ignore_errors=True)
    restored = sb.show(unit, "ActiveState", "SubState")
    assert (restored["ActiveState"], restored["SubState"]) == ("active", "running")
    plan_after = json.loads(sb.host_path(f"{CONFIG_DIR}/{name}/plan.json").read_text())
    assert plan_after["model"]["path"] == plan_before["model"]["path"]
    assert "paris" in _chat(port, QUESTION).lower()

    # -- undeploy: no unit, no config, no process
    pid = int(sb.show(unit, "MainPID")["MainPID"])
    r = edgectl(sb, "undeploy", name)
    assert r.returncode == 0, r.stderr
    assert not sb.host_path(f"{UNIT_DIR}/{unit}").exists()
    assert not sb.host_path(f"{CONFIG_DIR}/{name}").exists()
    assert sb.show(unit, "LoadState")["LoadState"] == "not-found"
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists(), "the worker outlived its undeploy"


def test_bad_input_writes_nothing(systemd_sandbox, pulled_smollm2):  # noqa: F811
    """Invalid name, a port in use, a plan that does not fit: exit 2, one line, nothing written."""
    sb = systemd_sandbox
    cases = [
        (["deploy", "smollm2-135m", "--name", "Bad Name!"], "name"),
        (["deploy", "smollm2-135m", "--name", "toolong", "--max-model-len", "999999"], "max-model-len"),
        (["deploy", "no-such-model", "--name", "nomodel"], "no-such-model"),
    ]
    for args, needle in cases:
        r = edgectl(sb, *args, timeout=120)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert needle.lower() in lines[0].lower()
        assert "Traceback" not in r.stderr
    # a port in use by another program
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = edgectl(sb, "deploy", "smollm2-135m", "--name", "busy", "--port", str(busy), timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"port {busy}" in r.stderr and "in use" in r.stderr
    written = list(sb.host_path(UNIT_DIR).glob("edgectl-*.service"))
    assert not [w for w in written if w.name in ("edgectl-busy.service", "edgectl-nomodel.service", "edgectl-toolong.service")]
    assert not sb.host_path(CONFIG_DIR).exists() or not any(
        (sb.host_path(CONFIG_DIR) / n).exists() for n in ("busy", "nomodel", "toolong"))


def test_not_root_is_refused(tmp_path):
    """A non-root user gets one line and exit 2 (the check comes before any planning)."""
    import subprocess

    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", EDGECTL, "deploy",
                        "smollm2-135m", "--name", "x"], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and "root" in r.stderr
    assert "Traceback" not in r.stderr
