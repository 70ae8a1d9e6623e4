"""``edgectl serve``: the same worker as a deployment, in the foreground, for hosts without systemd.

The plan is written to a private temporary file that lives as long as the worker; Ctrl-C
(SIGINT) or SIGTERM is passed to the worker, which drains and stops.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from edgectl import launch
from edgectl.client import Client, HttpFailed
from edgectl.contract import environment, worker
from edgectl.contract.plan import Request
from edgectl.deployment import port_holder
from edgectl.errors import EXIT_BAD_INPUT, EXIT_FAILED, EdgectlError


def wait_serving(client: Client, proc: subprocess.Popen, timeout_s: float) -> bool:
    """Until the worker says it is serving (its warm-up answered) or exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        state = client.worker_state(timeout=2)
        if state is not None and state.phase == worker.SERVING:
            return True
        time.sleep(0.5)
    return False


def serve(request: Request, environ: Mapping[str, str], *, question: str | None, progress) -> int:
    from edgectl.inputs import make_plan

    planned = make_plan(request, environ)
    holder = port_holder(request.host, request.port)
    if holder is not None:
        raise EdgectlError(f"port {request.port} on {request.host} is in use by {holder}: pick another with --port")
    if not planned.pulled:
        from edgectl.bench import agreement
        from edgectl.models.pull import ensure_pulled

        progress(f"pulling {request.model}")
        ensure_pulled(request.model, progress, environ, check_agreement=agreement.check)
        planned = make_plan(request, environ, facts=planned.facts)
    plan = planned.plan
    from edgectl.models.catalog import CATALOG, SYNTHETIC_PURPOSE

    if (entry := CATALOG.get(request.model)) is not None and entry.synthetic is not None:
        progress(f"warning: {request.model} is synthetic: {SYNTHETIC_PURPOSE}")
    progress(planned.render_text())
    python = environment.runtime_python(environ)
    with tempfile.TemporaryDirectory(prefix="edgectl-serve-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(plan.to_json())
        env = launch.environment(environ)
        proc = subprocess.Popen(launch.worker_command(python, str(plan_path), plan.levers.python_optimize), env=env)

        def forward(signum, _frame):
            proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        client = Client.of(plan.serve)
        if wait_serving(client, proc, plan.timeouts.start_s):
            progress(f"serving {plan.model.name} at {worker.base_url(plan.serve)}/v1 (Ctrl-C stops)")
            if question:
                ask(client, plan.model.name, question, chat=planned.model.chat_template, progress=progress)
        code = proc.wait()
    if code not in (worker.EXIT_STOPPED, -signal.SIGINT, -signal.SIGTERM):
        raise EdgectlError(f"the worker exited with status {code} (see its log above)",
                           exit_code=EXIT_BAD_INPUT if code in worker.NOT_RESTARTABLE else EXIT_FAILED)
    return 0


def ask(client: Client, model: str, question: str, *, chat: bool, progress) -> None:
    """Print the model's answer to ``question``: a chat turn, or, for a model without a chat
    template (a base model, which vLLM refuses chat requests for), the question completed as text."""
    try:
        if chat:
            answer = client.chat(model, question)
        else:
            progress(f"{model} has no chat template (a base model): asking as a plain completion")
            answer = client.complete(model, question)
        print(f"{question} → {answer.strip()}", flush=True)
    except HttpFailed as exc:
        progress(f"asking {question!r} failed: {exc}")
