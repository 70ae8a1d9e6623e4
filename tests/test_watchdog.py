"""Who pings systemd's watchdog, and when (without systemd, without vLLM).

While serving with the engine in the worker's process, the engine thread pings after every step
and every idle wait (``Service.engine_progress``), only while the HTTP event loop runs, at most
every quarter of ``WatchdogSec``; the watchdog thread pings during start-up and the drain and
otherwise only says why the pings stopped. The test-only stall injection is refused in a unit
edgectl deployed, and the unit writer never writes it. The real thing, under a real systemd and
the real engine: tests/test_faults_systemd.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from models_helpers import REPO
from plan_helpers import SMOLLM2, host_facts, make_plan, shape

from edgectl.contract import worker as contract
from edgectl.contract.plan import Plan
from edgectl.errors import EdgectlError
from edgectl.units import render_unit
from edgectl_runtime.service.notify import Watchdog
from edgectl_runtime.service.worker import Service, refused_test_faults

V2 = "0::/system.slice/edgectl-chat.service\n"
V1 = ("12:memory:/system.slice/edgectl-chat.service\n1:name=systemd:/system.slice/edgectl-chat.service\n"
      "0::/system.slice/edgectl-chat.service\n")
TEST_UNIT = "0::/system.slice/faults-1234abcd.service\n"
SHELL = "0::/user.slice/user-0.slice/session-3.scope\n"


class Notes:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def watchdog(self) -> None:
        self.sent.append("WATCHDOG=1")


class Health:
    """An in-process engine's heartbeat as the worker sees it (inproc.EngineHealth's fields)."""

    def __init__(self, stalled_s: float = 0.0) -> None:
        self.dead_reason = None
        self.stalled_s = stalled_s

    def stalled_for_s(self) -> float:
        return self.stalled_s


class Thread:
    def is_alive(self) -> bool:
        return True


class Core:
    def __init__(self, health: Health) -> None:
        self.health = health
        self._thread = Thread()


class Client:
    errored = False

    def __init__(self, health: Health) -> None:
        self.engine_core = Core(health)


def _plan(watchdog_s: int = 40) -> Plan:
    return make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2), watchdog_s=watchdog_s)


def _serving(health: Health | None = None, ping_every_s: float = 10.0) -> tuple[Service, Notes]:
    notes = Notes()
    service = Service(_plan(), notes, ping_every_s=ping_every_s)
    service.engine_client = Client(health or Health())
    service.phase = contract.SERVING
    return service, notes


def test_the_unit_of_a_process_is_read_from_its_cgroup():
    assert contract.systemd_unit(V2) == "edgectl-chat.service"
    assert contract.systemd_unit(V1) == "edgectl-chat.service"
    assert contract.systemd_unit(SHELL) is None
    assert contract.is_deployment_unit("edgectl-chat.service")
    assert not contract.is_deployment_unit("faults-1234abcd.service")
    assert not contract.is_deployment_unit(None)


def test_the_stall_injection_is_refused_in_a_deployed_unit_only():
    env = {"EDGECTL_TEST_STALL": "stall"}
    (problem,) = refused_test_faults(env, V2)
    assert "EDGECTL_TEST_STALL" in problem and "edgectl-chat.service" in problem
    assert refused_test_faults(env, V1)
    assert refused_test_faults(env, TEST_UNIT) == []
    assert refused_test_faults(env, SHELL) == []
    assert refused_test_faults({}, V2) == []


def test_the_unit_writer_refuses_a_plan_that_carries_the_stall_injection():
    plan = _plan()
    plan = Plan.from_dict({**plan.to_dict(), "env": {**plan.env, "EDGECTL_TEST_STALL": "stall"}})
    # the model where `edgectl models pull` keeps it: the shape's directory lies in the checkout, which
    # may be under /tmp or /home, where the unit writer refuses a model path first
    plan = replace(plan, model=replace(plan.model, path="/var/lib/edgectl/models/smollm2-135m"))
    with pytest.raises(EdgectlError, match="EDGECTL_TEST_STALL: a test-only fault injection"):
        render_unit(plan, plan_path="/etc/edgectl/chat/plan.json", python="/opt/edgectl/venv/bin/python")


def test_the_worker_refuses_to_start_with_it_in_a_deployed_unit(tmp_path: Path):
    """The real worker's start-up, up to the refusal (before vLLM is imported): exit 2, one line."""
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(_plan().to_dict()))
    code = ("import sys, edgectl_runtime.service.worker as w\n"
            "w.prepare_environment(w.load_plan(sys.argv[1]), {'EDGECTL_TEST_STALL': 'stall'}, sys.argv[2])\n")
    done = subprocess.run([sys.executable, "-c", code, str(plan_path), V2], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode != 0 and "test-only fault injection" in done.stderr
    done = subprocess.run([sys.executable, "-c", code, str(plan_path), TEST_UNIT], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_engine_thread_pings_while_serving_and_the_loop_runs():
    service, notes = _serving(ping_every_s=10.0)
    service.engine_progress()
    assert notes.sent == ["WATCHDOG=1"]
    service.engine_progress()  # within the interval: once is enough
    assert notes.sent == ["WATCHDOG=1"]
    service._last_engine_ping -= 10.0
    service.engine_progress()
    assert notes.sent == ["WATCHDOG=1"] * 2


def test_no_ping_from_the_engine_when_the_http_loop_is_stuck():
    service, notes = _serving(ping_every_s=0.0)
    service.loop_heartbeat.last_monotonic = time.monotonic() - service.stall_limit_s - 1
    service.engine_progress()
    assert notes.sent == []
    ok, why = service.watchdog_check()
    assert not ok and "event loop" in why


def test_no_ping_from_the_engine_before_it_serves():
    service, notes = _serving(ping_every_s=0.0)
    service.phase = "warming up"
    service.engine_progress()
    assert notes.sent == []
    assert service.watchdog_check() == (True, "warming up")  # the watchdog thread covers start-up


def test_the_watchdog_thread_leaves_a_serving_engine_to_ping_and_says_when_it_stalls():
    health = Health()
    service, _ = _serving(health)
    assert service.watchdog_check() == (False, None)  # the engine thread pings
    health.stalled_s = service.stall_limit_s + 1
    ok, why = service.watchdog_check()
    assert not ok and "engine thread has not come back" in why


def test_without_an_engine_in_this_process_the_thread_pings_while_healthy():
    """The stock topology: the engine is in other processes; the loop's heartbeat is the rule."""
    notes = Notes()
    service = Service(_plan(), notes)
    service.engine_client = type("Remote", (), {"errored": False})()
    service.phase = contract.SERVING
    assert service.watchdog_check() == (True, "serving")


def test_the_watchdog_thread_pings_only_when_told_to():
    answers = iter([(True, "loading"), (False, None), (False, "stuck"), (False, "stuck")] + [(False, None)] * 100)
    notes = Notes()
    dog = Watchdog(notes, lambda: next(answers), interval_s=0.01)
    dog.start()
    time.sleep(0.3)
    dog.stop()
    dog.join(5)
    assert notes.sent == ["WATCHDOG=1"] and dog.pings == 1
