"""How systemd supervises the service: its timeouts and the worker's environment (the speeds it will run at:
speed.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgectl.contract import environment
from edgectl.contract.plan import (
    Compilation,
    Levers,
    Reason,
    Request,
    Source,
    ThreadWait,
    Timeouts,
    Topology,
    WeightFormat,
)
from edgectl.planner.decided import Decided
from edgectl.planner.speed import prefill_at, prefill_scale
from edgectl.probe.formats import format_cpu_list

if TYPE_CHECKING:
    from edgectl.planner.cpus import Cpus
    from edgectl.profiles import Figure, Profile

STOP_S = 30
MIN_WATCHDOG_S = 5  # the shortest --watchdog-sec accepted
MAX_WATCHDOG_S = 600
MIN_START_S, MAX_START_S = 180, 1800
# The watchdog is pinged per engine step and while the engine is idle (runtime/edgectl_runtime/
# inproc.py), so WatchdogSec only has to outlast the longest single step the plan allows: one
# prefill chunk of max_num_batched_tokens. It is that step at the slowest measured prefill rate,
# times WATCHDOG_MARGIN (the last chunk of a full context attends to every earlier token; a shared
# core), plus WATCHDOG_SLACK_S, and never under WATCHDOG_FLOOR_S: pauses outside a step (the
# scheduler, a garbage collection, a busy neighbour on a 2-core box) are not measured by anyone.
WATCHDOG_MARGIN = 3
WATCHDOG_SLACK_S = 10
WATCHDOG_FLOOR_S = 30
# Without a measured prefill rate, the longest engine step is taken as this long.
UNMEASURED_STEP_S = 120.0
# Without a measured time to ready, start-up is taken as this long.
UNMEASURED_READY_S = 300


def longest_step_s(batched_tokens: int, slowest_prefill_tok_s: float | None) -> float:
    """The longest engine step the plan allows: one chunk of ``batched_tokens`` prefill tokens."""
    if not slowest_prefill_tok_s:
        return UNMEASURED_STEP_S
    return batched_tokens / slowest_prefill_tok_s


def watchdog_for_step(step_s: float) -> int:
    """WatchdogSec for a longest step of ``step_s`` (the rule above; pure)."""
    return int(min(MAX_WATCHDOG_S, max(WATCHDOG_FLOOR_S, math.ceil(step_s * WATCHDOG_MARGIN + WATCHDOG_SLACK_S))))


def start_for_ready(ready_s: float | None) -> int:
    """TimeoutStartSec: more than 3 × the time to ready, one minute more, within the bounds."""
    return int(min(MAX_START_S, max(MIN_START_S, math.ceil((ready_s or UNMEASURED_READY_S) * 3 + 60))))


def choose_timeouts(request: Request, profile: Profile, weight_format: WeightFormat, weights_bytes: int,
                    linear_params: int | None, batched_tokens: int,
                    compilation: Compilation = Compilation.EAGER) -> Decided[Timeouts]:
    """The watchdog from the longest single engine step, the start timeout from the time to ready.

    Each figure is the profile's, named with its provenance in the reason: measured by edgectl,
    external (published elsewhere), or a fallback guess when nobody measured it.
    """
    figures = profile.formats.get(weight_format)
    prefill = figures.prefill_tok_s if figures else None
    # The slowest pass, not the median: a step must fit even on the worst measured run.
    slowest = prefill_at(prefill.min if prefill.min is not None else prefill.median, prefill, weights_bytes,
                         linear_params) if prefill else None
    step_s = longest_step_s(batched_tokens, slowest)
    watchdog_s = request.watchdog_s if request.watchdog_s is not None else watchdog_for_step(step_s)
    # In compiled mode the first start compiles: the start timeout is sized from that start.
    cold = profile.compiled.ready_cold_s if profile.compiled else None
    start_fig = profile.ready_s if compilation is Compilation.EAGER else cold
    start_s = start_for_ready(start_fig.median if start_fig else None)
    timeouts = Timeouts(start_s=start_s, watchdog_s=watchdog_s, stop_s=STOP_S)

    if request.watchdog_s is not None:
        watchdog_why = "watchdog asked with --watchdog-sec"
    else:
        rule = (f"watchdog = max({WATCHDOG_FLOOR_S} s, {WATCHDOG_MARGIN} × the longest engine step + "
                f"{WATCHDOG_SLACK_S} s); the worker pings per step and while idle, so the longest step is "
                f"one prefill chunk of {batched_tokens} tokens")
        if prefill:
            watchdog_why = (f"{rule}: {step_s:.1f} s at the slowest prefill rate {slowest:.0f} tok/s "
                            f"({_figure_provenance(profile, prefill, 'tok/s', weights_bytes, linear_params)})")
        else:
            watchdog_why = (f"{rule}: taken as {UNMEASURED_STEP_S:.0f} s, because {profile.name} has no prefill "
                            f"figure for {weight_format}")
    if compilation is not Compilation.EAGER and cold:
        start_why = (f"start = 3 × the time to ready + 60 s (at least {MIN_START_S} s): the first start in compiled "
                     f"mode compiles, ready in {_figure_provenance(profile, cold, 's')}")
    elif compilation is not Compilation.EAGER:
        start_why = (f"start = 3 × the time to ready + 60 s: taken as {UNMEASURED_READY_S} s, because "
                     f"{profile.name} has no measured first start in compiled mode (it compiles)")
    elif profile.ready_s:
        start_why = (f"start = 3 × the time to ready + 60 s (at least {MIN_START_S} s): ready in "
                     f"{_figure_provenance(profile, profile.ready_s, 's')}")
    else:
        start_why = (f"start = 3 × the time to ready + 60 s: taken as {UNMEASURED_READY_S} s, because "
                     f"{profile.name} has no measured time to ready")
    source = Source.FLAG if request.watchdog_s is not None else profile.reason_source if prefill else Source.FALLBACK
    return Decided(timeouts, Reason("timeouts", {"start_s": start_s, "watchdog_s": watchdog_s, "stop_s": STOP_S},
                                    source, f"{watchdog_why}; {start_why}"))


def _figure_provenance(profile: Profile, fig: Figure, unit: str, weights_bytes: int | None = None,
                       linear_params: int | None = None) -> str:
    """How a figure was obtained, in words: measured by edgectl here, emulated, or external; a prefill
    figure (``weights_bytes`` given) moved from another model as speed.prefill_at moves it."""
    src = fig.source
    scaled = ""
    by = prefill_scale(fig, weights_bytes, linear_params)[1] if weights_bytes else None
    if by:
        scaled = f", scaled from {src.model or 'another model'} by {by}"
    if src.external:
        where = f"an external figure, not measured with edgectl: {src.reference or src.command}"
    else:
        where = f"measured with edgectl bench on {src.cpu_model}, {src.cores} CPUs, {src.date}"
    if profile.emulated:
        where += f", on an emulated ISA ({profile.emulated})"
    return f"{fig.describe(unit)}, {where}{scaled}"


def worker_environment(cpus: Cpus, levers: Levers) -> dict[str, str]:
    """The variables the plan sets for the worker (declared in contract/environment.py), from its CPUs and
    its levers."""
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": format_cpu_list(cpus.cpus[:cpus.threads], sep=","),
        "OMP_NUM_THREADS": str(cpus.threads),
        **environment.OFFLINE,
    }
    if levers.thread_wait is ThreadWait.PASSIVE:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif levers.thread_wait is ThreadWait.SPIN_SHORT:
        env["GOMP_SPINCOUNT"] = environment.SHORT_SPINCOUNT
    if levers.huge_pages:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    if levers.cpp_wrapper:
        env["TORCHINDUCTOR_CPP_WRAPPER"] = "1"
        env["VLLM_USE_LAYERNAME"] = "0"
    if levers.topology is Topology.SINGLE_PROCESS:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if levers.topology is Topology.STOCK:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1" if cpus.reserve_frontend_core else "0"
    return env
