"""``edgectl deploy`` and ``undeploy``: a plan turned into a supervised systemd service.

deploy: probe → plan → (pull) → write the plan and the unit atomically → reload →
(re)start → wait for READY, showing the worker's phases → check with a real request (a chat
completion; a speech model: the transcription of the shipped clip) → report the endpoint, the plan and the measured memory. If the new version
does not become ready, the previous unit and plan are put back and restarted (or, on a
first deploy, everything written is removed) and the command fails with the journal's tail.

Bad input (unknown model, a plan that does not fit, a port in use, an invalid name, not
root) is refused before anything is written or stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from edgectl.atomic import write_text_atomic
from edgectl.client import Client, HttpFailed
from edgectl.contract import environment, worker
from edgectl.contract.plan import Plan, Request
from edgectl.contract.worker import WARMUP_CLIP
from edgectl.deployment import Layout, port_holder, service_memory
from edgectl.errors import EXIT_BAD_INPUT, EXIT_FAILED, EdgectlError
from edgectl.output import mib
from edgectl.planner.service import MAX_START_S
from edgectl.status import oom_advice
from edgectl.systemd import Systemd, UnitState, systemd_running
from edgectl.units import HIDDEN_PREFIXES, render_unit, validate_name

Progress = Callable[[str], None]

# Not the bare "What is the capital of France?": SmolLM2-135M's first answer token to it is a
# near-tie ("L" 0.14-0.16 vs "The" 0.14-0.16, int4 and bf16, on the x86_64-amx development box)
# that small numeric differences flip to "L'Étoile, la Marseillaise, …". Asked this way, "The"
# leads "Paris" 0.27-0.28 to 0.12-0.13 there, and both continue to Paris.
QUESTION = "What is the capital of France? Answer with the city name only."


@dataclass
class DeployResult:
    name: str
    unit: str
    endpoint: str
    plan: Plan
    unit_text: str
    dry_run: bool
    answer: str | None = None
    ready_s: float | None = None
    memory: dict[str, Any] | None = None
    replaced_previous: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "edgectl.deploy/1", "name": self.name, "unit": self.unit, "endpoint": self.endpoint,
                "dry_run": self.dry_run, "answer": self.answer, "ready_s": self.ready_s,
                "replaced_previous": self.replaced_previous, "memory": self.memory, "plan": self.plan.to_dict(),
                "unit_text": self.unit_text if self.dry_run else None}

    def render_text(self) -> str:
        p = self.plan
        if self.dry_run:
            return (f"# dry run: nothing written. Plan for {self.unit}:\n" + json.dumps(p.to_dict(), indent=2)
                    + f"\n\n# {self.unit}:\n" + self.unit_text)
        lines = [
            f"{self.unit} is serving {p.model.name} at {self.endpoint}/v1 (ready in {self.ready_s:.0f} s)",
            f"  plan: {p.speech.dtype + ' speech to text' if p.speech else p.weight_format}, "
            f"{p.max_model_len} tokens × {p.max_num_seqs}, "
            f"{p.threads} threads on CPUs {','.join(map(str, p.cpus))}, MemoryMax {mib(p.memory.limit_bytes)}",
        ]
        if self.memory:
            m = self.memory
            lines.append(f"  memory: measured PSS {mib(m['pss_bytes'])} in {len(m['processes'])} process(es) "
                         f"(anon {mib(m['pss_anon_bytes'])}, file {mib(m['pss_file_bytes'])}); "
                         f"predicted {mib(p.memory.total_bytes)}")
        if self.answer is not None:
            asked = f"transcribed {WARMUP_CLIP.name}" if p.speech is not None else repr(QUESTION)
            lines.append(f"  check: {asked} → {self.answer.strip()!r}")
        lines.append(f"  status: edgectl status {self.name}   logs: edgectl logs {self.name}")
        return "\n".join(lines)


def _check_model_visible(path: str) -> None:
    p = Path(path).resolve()
    for hidden in HIDDEN_PREFIXES:
        if p == Path(hidden) or Path(hidden) in p.parents:
            raise EdgectlError(
                f"the service cannot see {p}: it runs with ProtectHome=yes and PrivateTmp=yes, which hide {hidden}; "
                "move the model under /var/lib/edgectl/models or /opt (or deploy a catalog model)")
    # An unprivileged (dynamic) user must be able to read every file and traverse every directory.
    for parent in [p, *p.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if not mode & 0o001:
            raise EdgectlError(f"the service's unprivileged user cannot enter {parent} (mode {mode & 0o777:o}): "
                               f"`chmod o+x {parent}`")
    for f in p.iterdir():
        if f.is_file() and not f.stat().st_mode & 0o004:
            raise EdgectlError(f"the service's unprivileged user cannot read {f} (mode {f.stat().st_mode & 0o777:o}): "
                               f"`chmod o+r {p}/*`")


@dataclass
class _Snapshot:
    unit_text: str | None
    plan_text: str | None
    was_active: bool


def _snapshot(layout: Layout, sd: Systemd) -> _Snapshot:
    unit_text = layout.unit_path.read_text() if layout.unit_path.exists() else None
    plan_text = layout.plan_path.read_text() if layout.plan_path.exists() else None
    state = sd.show(layout.unit)
    return _Snapshot(unit_text, plan_text, state.active in ("active", "activating", "reloading"))


def wait_ready(sd: Systemd, unit: str, timeout_s: float, progress: Progress, *, old_pid: int = 0,
               restarts_before: int | None = None) -> tuple[bool, str, UnitState]:
    """Poll until the unit is active (READY=1 arrived), fails, or the time is up."""
    deadline = time.monotonic() + timeout_s
    last_status = None
    started = False
    state = sd.show(unit)
    base_restarts = state.restarts if restarts_before is None else restarts_before
    while time.monotonic() < deadline:
        state = sd.show(unit)
        if state.main_pid and state.main_pid != old_pid:
            started = True
        if state.status_text and state.status_text != last_status:
            progress(f"  {state.status_text}")
            last_status = state.status_text
        if state.active == "active" and state.sub == "running" and started:
            return True, "ready", state
        if state.active == "failed":
            return False, f"the service failed ({state.props.get('Result', '?')})", state
        if state.sub == "auto-restart" or state.restarts > base_restarts:
            return False, "the service exited during start-up and systemd is restarting it", state
        if started and state.active == "inactive":
            return False, "the service stopped during start-up", state
        time.sleep(0.5)
    return False, f"not ready after {timeout_s:.0f} s", state


def deploy(request: Request, environ: Mapping[str, str], *, dry_run: bool = False, allow_synthetic: bool = False,
           progress: Progress = lambda _: None) -> DeployResult:
    """``allow_synthetic``: deploy a synthetic model's random weights knowingly (``--allow-synthetic``)."""
    from edgectl.inputs import make_plan

    validate_name(request.name)
    from edgectl.models.synthetic import ALLOW_SYNTHETIC_FLAG, refuse_deploy

    # random weights (a synthetic model) never become a service unless the deployment says it knows
    if refuse_deploy(request.model, allow_synthetic=allow_synthetic):
        progress(f"{request.model} is synthetic (random weights: its answers are nonsense), deployed as "
                 f"{ALLOW_SYNTHETIC_FLAG} asks")
    if not dry_run and os.geteuid() != 0:
        raise EdgectlError("edgectl deploy writes a systemd unit and /etc/edgectl: run it as root (sudo edgectl deploy ...)")
    layout = Layout.of(request.name, environ)
    python = environment.read("EDGECTL_RUNTIME_PYTHON", environ)

    planned = make_plan(request, environ)
    _check_port_free(request, layout.existing_plan())

    if dry_run:
        plan = planned.plan
        return DeployResult(request.name, layout.unit, worker.endpoint(plan.serve), plan,
                            render_unit(plan, plan_path=str(layout.plan_path), python=python), True)

    if not systemd_running():
        raise EdgectlError("systemd is not running on this machine: run the model in the foreground with "
                           f"`edgectl serve {request.model}`")
    sd = Systemd(layout.unit_dir)

    if not planned.pulled:
        from edgectl.bench import agreement
        from edgectl.models.pull import ensure_pulled

        progress(f"pulling {request.model} (it fits: planned {planned.plan.memory.limit_bytes >> 20} MiB "
                 f"≤ budget {planned.facts.memory.budget_bytes >> 20} MiB)")
        ensure_pulled(request.model, progress, environ, check_agreement=agreement.check)
        planned = make_plan(request, environ, facts=planned.facts)  # from the real files now
    plan = planned.plan
    _check_model_visible(plan.model.path)
    unit_text = render_unit(plan, plan_path=str(layout.plan_path), python=python)

    previous = _snapshot(layout, sd)
    old = sd.show(layout.unit)
    progress(f"{'replacing' if previous.was_active else 'starting'} {layout.unit}: "
             f"{plan.weight_format}, {plan.max_model_len} tokens, MemoryMax {plan.memory.limit_bytes >> 20} MiB")
    write_text_atomic(layout.plan_path, plan.to_json())
    write_text_atomic(layout.unit_path, unit_text)
    t0 = time.monotonic()
    started_us = time.time_ns() // 1000 - 1_000_000  # the journal's clock; a second of slack
    ok, why, answer = _restart_and_check(sd, layout.unit, plan, old, progress)
    if not ok:
        _roll_back_and_fail(sd, layout, plan, previous, why, started_us, progress)
    ready_s = time.monotonic() - t0
    sd.enable(layout.unit)
    memory = service_memory(sd.show(layout.unit))
    return DeployResult(request.name, layout.unit, worker.endpoint(plan.serve), plan, unit_text, False,
                        answer=answer, ready_s=ready_s, memory=memory.to_dict() if memory else None,
                        replaced_previous=previous.was_active)


def _check_port_free(request: Request, existing: Plan | None) -> None:
    """Refuse a port another program holds; the service being replaced may hold its own."""
    holder = port_holder(request.host, request.port)
    if holder is not None:
        ours = existing is not None and existing.serve.port == request.port
        if not ours:
            raise EdgectlError(f"port {request.port} on {request.host} is in use by {holder}: pick another with --port")


def _restart_and_check(sd: Systemd, unit: str, plan: Plan, old: UnitState,
                       progress: Progress) -> tuple[bool, str, str | None]:
    """(Re)start the unit, wait for READY, and ask it one real question: (ready, why not, the answer)."""
    try:
        sd.daemon_reload()
        sd.reset_failed(unit)
        sd.restart(unit)
        ok, why, state = wait_ready(sd, unit, plan.timeouts.start_s + 30, progress,
                                    old_pid=old.main_pid, restarts_before=old.restarts)
        answer = None
        if ok:
            ok, why, answer = _check_answer(plan)
    except EdgectlError as exc:
        ok, why, answer = False, exc.message, None
    return ok, why, answer


def _check_answer(plan: Plan) -> tuple[bool, str, str | None]:
    """One real request: the question (a text model) or the shipped clip's transcription (a speech model)."""
    client = Client.of(plan.serve)
    asked = f"a transcription of {WARMUP_CLIP.name}" if plan.speech is not None else repr(QUESTION)
    try:
        if plan.speech is not None:
            answer = client.transcribe(plan.model.name, WARMUP_CLIP.read_bytes(), WARMUP_CLIP.name)["text"]
        else:
            answer = client.chat(plan.model.name, QUESTION)
    except HttpFailed as exc:
        return False, f"it reported ready but {asked} failed: {exc}", None
    if not answer.strip():
        return False, f"it reported ready but answered {asked} with nothing", answer
    return True, "", answer


def _roll_back_and_fail(sd: Systemd, layout: Layout, plan: Plan, previous: _Snapshot, why: str, started_us: int,
                        progress: Progress) -> NoReturn:
    """Put the previous version back (or remove the new one) and fail with why, the journal's tail
    and, when the service's run ended, whether the OOM killer ended it."""
    tail = sd.journal(layout.unit, 25)
    # a run of the service ended (failed, or systemd is restarting it): was it the OOM killer?
    oom = _oom_in_this_start(sd, layout.unit, plan, started_us) if why.startswith("the service") else None
    if oom:
        why = f"{why}: {oom}"
    restored = _roll_back(layout, sd, previous, progress)
    raise EdgectlError(f"{layout.unit} did not become ready: {why}; {restored}", exit_code=EXIT_FAILED,
                       details=["--- journal (last lines) ---", *tail])


def _oom_in_this_start(sd: Systemd, unit: str, plan: Plan, since_us: int) -> str | None:
    """The kernel's OOM kills of this start in words, with what to do (None: none seen). Only the
    deploy can say it for a first deployment: the rollback removes the unit that status would read."""
    for _ in range(5):  # the journal may hold the run's end a moment after systemd acted on it
        failures = [f for f in sd.failures(unit) if (f.realtime_us or 0) >= since_us]
        if failures:
            break
        time.sleep(1)
    oom = [f for f in failures if f.kind == "oom"]
    if not oom:
        return None
    advice = oom_advice(oom[-1], unit, sd.show(unit).int_prop("MemoryMax"), plan)
    return f"{oom[-1].describe()}, {len(oom)} time(s) in this start; {advice}"


def _roll_back(layout: Layout, sd: Systemd, previous: _Snapshot, progress: Progress) -> str:
    """Put the previous deployment back (and running, if it was), or remove what was written."""
    if previous.unit_text is None or previous.plan_text is None:
        sd.stop(layout.unit)
        sd.disable(layout.unit)
        sd.clean(layout.unit)
        layout.unit_path.unlink(missing_ok=True)
        shutil.rmtree(layout.config_dir, ignore_errors=True)
        sd.daemon_reload()
        sd.reset_failed(layout.unit)
        return "nothing was deployed before, so the new unit and its configuration were removed"
    progress(f"rolling back {layout.unit} to the previous deployment")
    write_text_atomic(layout.plan_path, previous.plan_text)
    write_text_atomic(layout.unit_path, previous.unit_text)
    sd.daemon_reload()
    sd.reset_failed(layout.unit)
    if not previous.was_active:
        sd.stop(layout.unit)
        return "the previous deployment's unit and plan are restored (it was not running)"
    old = sd.show(layout.unit)
    sd.restart(layout.unit)
    try:
        start_s = Plan.from_dict(json.loads(previous.plan_text)).timeouts.start_s
    except (ValueError, EdgectlError):
        start_s = MAX_START_S  # written by hand or by another version: wait as long as any plan may
    ok, why, _ = wait_ready(sd, layout.unit, start_s + 30, progress,
                            old_pid=old.main_pid, restarts_before=old.restarts)
    if ok:
        return "the previous deployment is restored and running again"
    return f"the previous deployment is restored but did not come back: {why}"


@dataclass
class UndeployResult:
    name: str
    unit: str
    removed: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "edgectl.undeploy/1", "name": self.name, "unit": self.unit, "removed": self.removed}

    def render_text(self) -> str:
        return f"{self.unit} stopped and removed ({', '.join(self.removed)}); models are kept"


def undeploy(name: str, environ: Mapping[str, str]) -> UndeployResult:
    validate_name(name)
    if os.geteuid() != 0:
        raise EdgectlError("edgectl undeploy removes a systemd unit: run it as root")
    layout = Layout.of(name, environ)
    if not layout.unit_path.exists() and not layout.config_dir.exists():
        raise EdgectlError(f"no deployment named {name!r} (no {layout.unit_path}, no {layout.config_dir}): "
                           "see `edgectl status`", exit_code=EXIT_BAD_INPUT)
    sd = Systemd(layout.unit_dir)
    removed = []
    sd.stop(layout.unit)
    sd.disable(layout.unit)
    sd.clean(layout.unit)  # its state and cache directories (vLLM's caches); models are kept
    if layout.unit_path.exists():
        layout.unit_path.unlink()
        removed.append(str(layout.unit_path))
    if layout.config_dir.exists():
        shutil.rmtree(layout.config_dir)
        removed.append(str(layout.config_dir))
    sd.daemon_reload()
    sd.reset_failed(layout.unit)
    return UndeployResult(name, layout.unit, removed)
