"""The watchdog's promise under a real systemd, the real engine and the real SmolLM2, on the default plan.

One unit, rendered by edgectl's unit writer from the default plan, plus one line: the test-only
stall injection (``EDGECTL_TEST_STALL``). The unit is named ``faults-ID.service``, not
``edgectl-NAME.service``: the worker refuses the injection in a unit edgectl deployed, and the unit
writer refuses to write it (tests/test_watchdog.py). In order, sharing one engine start:

1. a long but progressing request — a prefill of nearly the whole context, many engine steps of one
   chunk each — is answered and the watchdog never fires;
2. the engine step stalls while the process and its HTTP server stay alive (the server still
   answers): systemd's watchdog kills the worker (``Result=watchdog`` in the journal), restarts it,
   and it serves again;
3. the whole worker is frozen (SIGSTOP): the same, with the abort bounded by TimeoutAbortSec=.

The SIGSTOP of a deployment made by ``edgectl deploy`` is in tests/test_deploy_systemd.py too. Times are printed
(``pytest -s``), never asserted: the issue's bound (serving again within 60 s) is read from them.

The AVX2 path on a bigger CPU: the variables that hold the ISA down (tests/isa_helpers.py
``ISA_CAPS``, and a ``PYTHONPATH`` entry named ``isa_avx2``), when set for the test run, are passed
on to the unit, so the worker under systemd runs that path too.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from isa_helpers import ISA_CAPS
from sandbox import host_dirs_restored, systemd_sandbox, unique_name  # noqa: F401  (the fixture)

from edgectl.contract.plan import Plan
from edgectl.deploy import QUESTION
from edgectl.systemd import failures_from_journal
from edgectl.units import render_unit

pytestmark = [pytest.mark.systemd, pytest.mark.engine]

EDGECTL = "/opt/edgectl/venv/bin/edgectl"
PYTHON = "/opt/edgectl/venv/bin/python"


def _isa_environment() -> dict[str, str]:
    """The ISA-capping variables of this test run, to pass on to the unit (empty: the native ISA)."""
    env = {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}
    isa_dirs = [d for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d.rstrip("/").endswith("isa_avx2")]
    if env and isa_dirs:
        env["PYTHONPATH"] = os.path.abspath(isa_dirs[0])
    return env


def _post(port: int, path: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _get_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _chat(port: int) -> str:
    body = {"model": "smollm2-135m", "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": QUESTION}]}
    return _post(port, "/v1/chat/completions", body, timeout=120)["choices"][0]["message"]["content"]


def _serving_again(sb, unit: str, restarts_before: int, port: int, timeout_s: float) -> float:
    """Seconds until the unit restarted, is active and answers a question (monotonic clock)."""
    sb.wait_for(unit, lambda v: int(v.get("NRestarts") or 0) > restarts_before and v["ActiveState"] == "active"
                and v["SubState"] == "running", timeout_s=timeout_s,
                props=("ActiveState", "SubState", "NRestarts", "MainPID", "StatusText"), what="restarted and READY")
    assert "paris" in _chat(port).lower()
    return time.monotonic()


def _long_prompt(port: int, model: str, tokens: int) -> tuple[str, int]:
    """A prompt of at most ``tokens`` tokens, as the server's own tokenizer counts them."""
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * (tokens // 9 + 1))
    count = _post(port, "/tokenize", {"model": model, "prompt": text})["count"]
    while count > tokens:
        text = text[: int(len(text) * tokens / count) - 8]
        count = _post(port, "/tokenize", {"model": model, "prompt": text})["count"]
    return text, count


def test_a_long_prefill_lives_and_a_stalled_engine_is_restarted(systemd_sandbox, pulled_smollm2):  # noqa: F811
    sb = systemd_sandbox
    name, port = unique_name("f"), 8000 + int(time.time()) % 500 + 340
    unit = f"faults-{name}.service"
    out = subprocess.run([EDGECTL, "plan", "smollm2-135m", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    plan = Plan.from_dict(json.loads(out.stdout)).with_serve(name=name, port=port)
    plan_path = f"/run/edgectl-faults/{name}/plan.json"
    sb.write_file(plan_path, json.dumps(plan.to_dict()))
    text = render_unit(plan, plan_path=plan_path, python=PYTHON)
    stall_file = f"/var/lib/edgectl/{name}/stall"  # the service's own state directory
    extra = {"EDGECTL_TEST_STALL": stall_file, **_isa_environment()}
    lines = "".join(f"Environment={k}={v}\n" for k, v in extra.items())
    text = text.replace("\n[Service]\n", f"\n[Service]\n{lines}", 1)
    print(f"\nISA: {_isa_environment() or 'native'}; plan: {plan.model.name} {plan.weight_format}, {plan.max_model_len} tokens, chunks of "
          f"{plan.max_num_batched_tokens}; WatchdogSec={plan.timeouts.watchdog_s} TimeoutStartSec={plan.timeouts.start_s}")
    with host_dirs_restored("/var/lib/edgectl", "/var/cache/edgectl"):
        sb.install_unit(unit, text)
        try:
            t0 = time.monotonic()
            started = sb.systemctl("start", unit, check=False, timeout=plan.timeouts.start_s + 60)
            assert started.returncode == 0, sb.journal(unit, 80)
            print(f"ready in {time.monotonic() - t0:.1f} s")
            assert "paris" in _chat(port).lower()
            state = sb.show(unit, "NRestarts", "MainPID", "WatchdogUSec")
            assert state["WatchdogUSec"] == f"{math.ceil(plan.timeouts.watchdog_s)}s"

            # -- 1. a prefill of nearly the whole context: many steps, each one chunk; no restart
            prompt, count = _long_prompt(port, plan.model.name, plan.max_model_len - 32)
            assert count > 3 * plan.max_num_batched_tokens  # several engine steps, not one
            t0 = time.monotonic()
            answer = _post(port, "/v1/completions", {"model": plan.model.name, "prompt": prompt, "max_tokens": 8,
                                                     "temperature": 0}, timeout=600)
            took = time.monotonic() - t0
            print(f"long prefill: {count} prompt tokens answered in {took:.1f} s "
                  f"({count / plan.max_num_batched_tokens:.1f} chunks)")
            assert answer["usage"]["prompt_tokens"] > 3 * plan.max_num_batched_tokens
            assert answer["usage"]["completion_tokens"] >= 1
            after = sb.show(unit, "NRestarts", "MainPID")
            assert after == {"NRestarts": state["NRestarts"], "MainPID": state["MainPID"]}, sb.journal(unit, 40)

            # -- 2. the engine step stalls; the HTTP server stays up; the watchdog restarts the worker
            sb.host_path(f"/var/lib/private/edgectl/{name}/stall").write_text("stall\n")
            stalled_at = time.monotonic()
            hung: dict[str, object] = {}

            def ask() -> None:  # this request runs into the stalled step and never gets its answer
                try:
                    hung["answer"] = _chat(port)
                except Exception as exc:  # noqa: BLE001 (the worker is killed under it)
                    hung["error"] = repr(exc)

            asker = threading.Thread(target=ask, daemon=True)
            asker.start()
            time.sleep(3)
            # the server still answers HTTP while the engine is stuck (a frozen process would not)
            assert _get_status(port, "/edgectl/live") in (200, 503)
            assert sb.show(unit, "MainPID")["MainPID"] == state["MainPID"]
            back = _serving_again(sb, unit, int(state["NRestarts"]), port, timeout_s=plan.timeouts.watchdog_s
                                  + plan.timeouts.start_s + 120)
            print(f"engine stall → serving again in {back - stalled_at:.1f} s "
                  f"(WatchdogSec={plan.timeouts.watchdog_s})")
            asker.join(30)
            assert "answer" not in hung, hung
            journal = sb.journal(unit, 400)
            assert "EDGECTL_TEST_STALL" in journal and "stalls now" in journal
            assert "Watchdog timeout" in journal
            failures = failures_from_journal(sb.run(["journalctl", "-u", unit, "-o", "json", "--no-pager",
                                                     "MESSAGE_ID=d9b373ed55a64feb8242e02dbe79a49c",
                                                     "MESSAGE_ID=98e322203f7a4ed290d09fe03c09fe15"]).stdout)
            assert failures and failures[-1].result == "watchdog", failures
            assert failures[-1].signal == "ABRT"

            # -- 3. the whole worker frozen (SIGSTOP): no pings at all; the watchdog's SIGABRT stays
            # pending on a stopped task, so the unit's TimeoutAbortSec bounds the wait for SIGKILL
            frozen = sb.show(unit, "NRestarts", "MainPID")
            sb.run(["kill", "-STOP", frozen["MainPID"]])
            stopped_at = time.monotonic()
            back = _serving_again(sb, unit, int(frozen["NRestarts"]), port, timeout_s=plan.timeouts.watchdog_s
                                  + plan.timeouts.start_s + 120)
            print(f"SIGSTOP → serving again in {back - stopped_at:.1f} s (WatchdogSec={plan.timeouts.watchdog_s})")
            assert sb.show(unit, "MainPID")["MainPID"] != frozen["MainPID"]
        finally:
            sb.remove_unit(unit)
