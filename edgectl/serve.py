"""``edgectl serve``: the same worker as a deployment, in the foreground, for hosts without systemd.

The plan is written to a private temporary file that lives as long as the worker; Ctrl-C
(SIGINT) or SIGTERM is passed to the worker, which drains and stops.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from edgectl import envvars
from edgectl.deploy import ask, client_base, port_holder
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.plan import Request


def wait_serving(plan: dict, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Until the worker says it is serving (its warm-up answered) or exits."""
    deadline = time.monotonic() + timeout_s
    url = client_base(plan) + "/edgectl/effective"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if json.loads(r.read()).get("phase") == "serving":
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def serve(request: Request, environ: Mapping[str, str], *, question: str | None, progress) -> int:
    from edgectl.planning import make_plan

    planned = make_plan(request, environ)
    holder = port_holder(request.host, request.port)
    if holder is not None:
        raise EdgectlError(f"port {request.port} on {request.host} is in use by {holder}: pick another with --port")
    if not planned.pulled:
        from edgectl.models.pull import ensure_pulled

        progress(f"pulling {request.model}")
        ensure_pulled(request.model, progress, environ)
        planned = make_plan(request, environ, facts=planned.facts)
    plan = planned.plan.to_dict()
    progress(planned.plan.render_text())
    python = envvars.read("EDGECTL_RUNTIME_PYTHON", environ)
    with tempfile.TemporaryDirectory(prefix="edgectl-serve-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(json.dumps(plan, indent=2))
        env = {k: v for k, v in environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        proc = subprocess.Popen([python, "-m", "edgectl_runtime.worker", "--plan", str(plan_path)], env=env)

        def forward(signum, _frame):
            proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        if wait_serving(plan, proc, plan["timeouts"]["start_s"]):
            progress(f"serving {plan['model']['name']} at {client_base(plan)}/v1 (Ctrl-C stops)")
            if question:
                try:
                    answer = ask(plan, question)
                    print(f"{question} → {answer.strip()}", flush=True)
                except OSError as exc:
                    progress(f"asking {question!r} failed: {exc}")
        code = proc.wait()
    if code not in (0, -signal.SIGINT, -signal.SIGTERM):
        raise EdgectlError(f"the worker exited with status {code} (see its log above)",
                           exit_code=2 if code in (2, 3) else EXIT_FAILED)
    return 0


def progress_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


