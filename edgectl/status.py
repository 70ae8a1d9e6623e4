"""``edgectl status``: what each deployment is doing and what it really costs.

For each deployment: its systemd state, restarts (and how many of them the OOM killer caused) and
the cause of the last one in words (the watchdog, a crash, the OOM killer: from the journal, where
systemd records each failed run and journald keeps the kernel's log; the unit's properties
describe only the current run), and after an OOM kill the limit, the plan's prediction and what
to do; the watchdog interval, uptime and endpoint; the measured memory
ledger from the service's cgroup (PSS of every process in it, anonymous vs file-backed)
against the plan's prediction and limit; in compiled mode, whether the running worker loaded its
graph from the cache or compiled it at this start (the worker's read-back,
``runtime/edgectl_runtime/vllm_plugin/compile_cache.py``); and the requests and tokens served, from vLLM's
``/metrics``, and for a speech model the seconds of audio transcribed (the worker's count,
``runtime/edgectl_runtime/service/audio_guard.py``), for a vision model the images served (the
worker's count, ``runtime/edgectl_runtime/service/image_guard.py``). With ``--memory``, the worker's own attribution of its PSS (``GET /edgectl/memory``,
edgectl/contract/memory.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgectl.client import Client, HttpFailed
from edgectl.contract import worker
from edgectl.contract.effective import Effective
from edgectl.contract.memory import SCHEMA as MEMORY_SCHEMA
from edgectl.contract.memory import render_text as render_attribution
from edgectl.contract.plan import Compilation, Plan
from edgectl.contract.procmem import TreeMem
from edgectl.deployment import Layout, deployment_names, service_memory
from edgectl.errors import EdgectlError
from edgectl.output import mib
from edgectl.systemd import (
    Failure,
    Systemd,
    failure_from_properties,
    restarts_by_oom,
    systemd_running,
)
from edgectl.units import validate_name

METRICS = {
    "vllm:request_success_total": "requests",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generated_tokens",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Counters from a Prometheus page, summed over label sets."""
    out = {v: 0.0 for v in METRICS.values()}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in METRICS:
            try:
                out[METRICS[name]] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


def _monotonic_us() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


def oom_advice(f: Failure | None, unit: str, memory_max: int | None, plan: Plan | None) -> str | None:
    """After an OOM kill (``f``): what to do, in one line (``memory_max``: the unit's MemoryMax now).
    Said by ``status`` and by a ``deploy`` whose start was killed."""
    if f is None or f.kind != "oom":
        return None
    kill = f.oom_kills[-1] if f.oom_kills else None
    if kill is not None and not kill.at_unit_limit:
        what = f"the limit of {kill.oom_memcg}" if kill.constraint == "CONSTRAINT_MEMCG" else "the machine's memory"
        return (f"{what} ran out, not this service's MemoryMax: stop what else uses it, or re-deploy with a "
                "smaller --max-model-len or --max-num-seqs")
    planned = plan.memory.limit_bytes if plan else None
    if planned is not None and memory_max is not None and memory_max < planned:
        return (f"MemoryMax was lowered outside edgectl, below the plan's (a drop-in or `systemctl set-property`, "
                f"which outrank the unit edgectl wrote): `systemctl set-property {unit} MemoryMax={planned}` "
                f"puts the plan's back, or `systemctl revert {unit}` removes it")
    return (f"the plan under-predicts this service's memory here: give it more (`systemctl set-property {unit} "
            "MemoryMax=…`), or re-deploy with a smaller --max-model-len or --max-num-seqs")


@dataclass
class DeploymentStatus:
    name: str
    unit: str
    state: str
    sub_state: str
    status_text: str
    restarts: int
    uptime_s: float | None
    endpoint: str | None
    plan: Plan | None
    memory: TreeMem | None
    metrics: dict[str, float] | None
    load_peak: dict[str, Any] | None = None
    warmup: dict[str, Any] | None = None  # the worker's warm-up answer and, if it looks broken, why
    compile: dict[str, Any] | None = None  # the worker's read-back of its compiled graph (None: not known)
    # --memory: the worker's attribution of its PSS (edgectl.memory/1), or why there is none
    attribution: dict[str, Any] | None = None
    attribution_unavailable: str | None = None
    watchdog_s: float | None = None  # systemd's WatchdogSec for the unit (None: no watchdog)
    last_failure: Failure | None = None  # the last failed run: why systemd restarted (or stopped) it
    restarts_by_oom: int = 0  # of ``restarts``, those after the kernel's OOM killer ended the run
    memory_max_bytes: int | None = None  # the unit's MemoryMax= as systemd applies it (drop-ins included)
    # the worker's count of audio transcribed, {"seconds", "requests"} (None: it serves no audio, or did not say)
    audio_transcribed: dict[str, float] | None = None
    # the worker's count of images served, {"images", "requests"} (None: not a vision plan, or it did not say)
    images_served: dict[str, int] | None = None

    def oom_limits(self) -> str | None:
        """After an OOM kill at the unit's limit: that limit and what the plan predicted and set."""
        f = self.last_failure
        if f is None or f.kind != "oom" or (f.oom_kills and not f.oom_kills[-1].at_unit_limit):
            return None
        limit = f"MemoryMax {mib(self.memory_max_bytes)}" if self.memory_max_bytes else "MemoryMax (not set)"
        if self.plan is None:
            return f"the unit's {limit}; no plan to compare with"
        m = self.plan.memory
        return f"the unit's {limit}; the plan predicted {mib(m.total_bytes)} steady and set MemoryMax {mib(m.limit_bytes)}"

    def oom_advice(self) -> str | None:
        """After an OOM kill: what to do, in one line."""
        return oom_advice(self.last_failure, self.unit, self.memory_max_bytes, self.plan)

    def to_dict(self) -> dict[str, Any]:
        planned = self.plan.memory if self.plan else None
        mem = None
        if self.memory is not None:
            mem = {**self.memory.to_dict(),
                   "predicted_total_bytes": planned.total_bytes if planned else None,
                   "limit_bytes": planned.limit_bytes if planned else None,
                   "high_bytes": planned.high_bytes if planned else None,
                   "measured_vs_predicted": (round(self.memory.pss_bytes / planned.total_bytes, 3)
                                             if planned and planned.total_bytes and self.memory.processes else None),
                   "load_peak": self.load_peak,
                   "load_peak_vs_steady": (round(self.load_peak["pss_bytes"] / self.memory.pss_bytes, 3)
                                           if self.load_peak and self.load_peak.get("pss_bytes")
                                           and self.memory.pss_bytes else None)}
        return {"name": self.name, "unit": self.unit, "state": self.state, "sub_state": self.sub_state,
                "status_text": self.status_text, "restarts": self.restarts, "restarts_by_oom": self.restarts_by_oom,
                "uptime_s": self.uptime_s, "watchdog_s": self.watchdog_s, "memory_max_bytes": self.memory_max_bytes,
                "last_failure": self.last_failure.to_dict() if self.last_failure else None,
                "oom_limits": self.oom_limits(), "what_to_do": self.oom_advice(),
                "endpoint": self.endpoint, "model": self.plan.model.name if self.plan else None,
                "weight_format": str(self.plan.weight_format) if self.plan else None, "memory": mem,
                "compiled_graph": self.compiled_graph(), "served": self.metrics, "warmup": self.warmup,
                "audio_transcribed": self.audio_transcribed, "images_served": self.images_served,
                **({"attribution": self.attribution} if self.attribution is not None else {}),
                **({"attribution_unavailable": self.attribution_unavailable}
                   if self.attribution_unavailable is not None else {})}

    def compiled_graph(self) -> dict[str, Any] | None:
        """Where the running worker's compiled graph came from: ``cache`` (loaded, with the seconds
        it took) or ``compiled`` (this start compiled it); None for an eager plan or when unknown."""
        if self.plan is None or self.plan.compilation is Compilation.EAGER or not self.compile:
            return None
        c = self.compile
        return {"source": c.get("source"), "load_s": c.get("load_s"), "compile_s": c.get("compile_s"),
                "artifact": c.get("artifact"), "load_failure": c.get("load_failure")}

    def render_text(self) -> str:
        up = f", up {self.uptime_s:.0f} s" if self.uptime_s is not None else ""
        oom = f", {self.restarts_by_oom} by the OOM killer" if self.restarts_by_oom else ""
        lines = [f"{self.name} ({self.unit}): {self.state} ({self.sub_state}){up}, {self.restarts} restart(s){oom}"]
        if self.status_text:
            lines.append(f"  status: {self.status_text}")
        watchdog = f"watchdog {self.watchdog_s:g} s" if self.watchdog_s else "no watchdog"
        if self.last_failure:
            when = ""
            if self.last_failure.realtime_us:
                when = time.strftime(" at %Y-%m-%d %H:%M:%S UTC", time.gmtime(self.last_failure.realtime_us / 1e6))
            lines.append(f"  {watchdog}; last failure{when}: {self.last_failure.describe()}")
            if self.oom_limits():
                lines.append(f"  limit: {self.oom_limits()}")
            if self.oom_advice():
                lines.append(f"  what to do: {self.oom_advice()}")
        else:
            lines.append(f"  {watchdog}; no failure in the journal")
        if self.endpoint:
            lines.append(f"  endpoint: {self.endpoint}/v1   model {self.to_dict()['model']} ({self.to_dict()['weight_format']})")
        graph = self.compiled_graph()
        if graph and graph["source"] == "cache":
            lines.append(f"  compiled graph: loaded from the cache in {graph['load_s']:.1f} s")
        elif graph and graph["source"] == "compiled":
            why = (f"the cached one failed to load: {graph['load_failure']}" if graph["load_failure"]
                   else "none was cached for these settings")
            lines.append(f"  compiled graph: compiled at this start in {graph['compile_s']:.0f} s ({why}); "
                         "the next start loads it")
        d = self.to_dict()["memory"]
        if d and self.memory and self.memory.processes:
            lines.append(f"  memory (PSS of the service's cgroup): {mib(d['pss_bytes'])} "
                         f"= anon {mib(d['pss_anon_bytes'])} + file {mib(d['pss_file_bytes'])}; "
                         f"predicted {mib(d['predicted_total_bytes'] or 0)}, MemoryMax {mib(d['limit_bytes'] or 0)}")
            if d.get("load_peak_vs_steady"):
                lp = d["load_peak"]
                lines.append(f"  load peak (sampled while loading): PSS {mib(lp['pss_bytes'])} = anon "
                             f"{mib(lp['pss_anon_bytes'])} + file {mib(lp['pss_file_bytes'])}, "
                             f"{d['load_peak_vs_steady']:.2f}× steady")
            for p in self.memory.processes:
                lines.append(f"    pid {p.pid:<7} {p.name:<16} PSS {mib(p.pss_bytes):>9}  anon {mib(p.pss_anon_bytes):>9}  file {mib(p.pss_file_bytes):>9}")
        if self.warmup and self.warmup.get("suspect"):
            lines.append(f"  warning: {self.warmup['suspect']}: the model may be broken (a wrong conversion "
                         "or quantization); check its answers")
        if self.metrics:
            m = self.metrics
            lines.append(f"  served: {m['requests']:.0f} requests, {m['prompt_tokens']:.0f} prompt + "
                         f"{m['generated_tokens']:.0f} generated tokens")
        if self.audio_transcribed is not None:
            a = self.audio_transcribed
            lines.append(f"  audio transcribed: {a['seconds']:.1f} s in {a['requests']:.0f} requests")
        if self.images_served is not None:
            i = self.images_served
            lines.append(f"  images served: {i['images']} in {i['requests']} requests")
        if self.attribution is not None:
            lines.append("  where the worker's memory goes (edgectl.memory/1, docs/memory.md):")
            lines += ["    " + line for line in render_attribution(self.attribution).splitlines()]
        elif self.attribution_unavailable:
            lines.append(f"  memory attribution: {self.attribution_unavailable}")
        return "\n".join(lines)


@dataclass
class StatusReport:
    deployments: list[DeploymentStatus]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "edgectl.status/1", "deployments": [d.to_dict() for d in self.deployments]}

    def render_text(self) -> str:
        if not self.deployments:
            return "no deployments (deploy one with `edgectl deploy MODEL`)"
        return "\n".join(d.render_text() for d in self.deployments)


def attribution_of(client: Client) -> tuple[dict[str, Any] | None, str | None]:
    """The worker's memory attribution, or why it has none (the worker walks its own memory:
    seconds on a small box, hence the long timeout)."""
    try:
        att = client.get_json(worker.MEMORY_ROUTE, timeout=180)
    except HttpFailed as exc:
        return None, f"the worker did not give one ({exc})"
    if not isinstance(att, dict) or att.get("schema") != MEMORY_SCHEMA:
        return None, f"the worker answered something else than {MEMORY_SCHEMA}"
    return att, None


def audio_of(report: Effective | None) -> dict[str, float] | None:
    """The worker's count of audio transcribed, when it has one (a worker serving audio routes)."""
    if report is None or report.audio_seconds is None or report.transcriptions is None:
        return None
    return {"seconds": report.audio_seconds, "requests": report.transcriptions}


def images_of(report: Effective | None) -> dict[str, int] | None:
    """The worker's count of images served, when it has one (a worker serving a vision plan)."""
    if report is None or report.images_served is None or report.image_requests is None:
        return None
    return {"images": report.images_served, "requests": report.image_requests}


def status_of(name: str, environ: Mapping[str, str], memory_attribution: bool = False) -> DeploymentStatus:
    layout = Layout.of(name, environ)
    plan = layout.existing_plan()
    sd = Systemd(layout.unit_dir)
    state = sd.show(layout.unit)
    if plan is None and not state.loaded:
        raise EdgectlError(f"no deployment named {name!r}: see `edgectl status` for the deployments here")
    uptime = None
    entered = state.int_prop("ActiveEnterTimestampMonotonic")
    if state.active == "active" and entered:
        uptime = max(0.0, (_monotonic_us() - entered) / 1e6)
    memory = service_memory(state) if state.active in ("active", "activating", "deactivating") else None
    metrics = report = attribution = None
    unavailable = "the service is not active" if memory_attribution else None
    if plan and state.active == "active":
        client = Client.of(plan.serve)
        text = client.metrics()
        metrics = parse_metrics(text) if text is not None else None
        report = client.worker_state()
        if memory_attribution:
            attribution, unavailable = attribution_of(client)
    # The journal's record of the last failed run (with the kernel's OOM kills in it); a failed unit's
    # own properties when the journal has none.
    failures = sd.failures(layout.unit) if state.loaded else []
    last_failure = failures[-1] if failures else None
    if last_failure is None and state.active == "failed":
        last_failure = failure_from_properties(state.props)
    return DeploymentStatus(name, layout.unit, state.active or "unknown", state.sub, state.status_text,
                            state.restarts, uptime, worker.endpoint(plan.serve) if plan else None, plan, memory, metrics,
                            report.load_peak or None if report else None, report.warmup if report else None,
                            report.compile or None if report else None, attribution, unavailable,
                            watchdog_s=state.watchdog_s, last_failure=last_failure,
                            restarts_by_oom=restarts_by_oom(failures, state.restarts),
                            memory_max_bytes=state.int_prop("MemoryMax"), audio_transcribed=audio_of(report),
                            images_served=images_of(report))


def status(name: str | None, environ: Mapping[str, str], memory_attribution: bool = False) -> StatusReport:
    if name is not None:
        validate_name(name)
    if not systemd_running():
        raise EdgectlError("systemd is not running on this machine: there are no deployments to show "
                           "(`edgectl serve` runs a model in the foreground)")
    names = [name] if name else deployment_names(environ)
    return StatusReport([status_of(n, environ, memory_attribution) for n in names])


def logs(name: str, environ: Mapping[str, str], follow: bool, lines: int) -> int:
    validate_name(name)
    layout = Layout.of(name, environ)
    deployed = layout.unit_path.exists() or layout.config_dir.exists()
    if not deployed and not systemd_running():
        raise EdgectlError(f"no deployment named {name!r}, and systemd is not running on this machine: "
                           "`edgectl serve` prints its log in the foreground")
    sd = Systemd(layout.unit_dir)
    if follow:
        if not deployed:
            raise EdgectlError(f"no deployment named {name!r} (no {layout.unit_path}, no {layout.config_dir}): "
                               "see `edgectl status`")
        return sd.follow(layout.unit, lines)
    journal = sd.journal(layout.unit, lines)
    if not journal and not deployed:
        # An undeployed service's journal is still shown; a name never deployed is a mistake.
        raise EdgectlError(f"no deployment named {name!r} (no {layout.unit_path}, no {layout.config_dir}, "
                           "nothing in the journal): see `edgectl status`")
    for line in journal:
        print(line)
    return 0
