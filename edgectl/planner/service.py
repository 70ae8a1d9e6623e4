"""What the service will do and how systemd supervises it: predictions, timeouts, environment."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from edgectl.contract import environment
from edgectl.contract.plan import Predicted, Reason, Request, Source, Timeouts, Topology, WeightFormat
from edgectl.planner.decided import Decided
from edgectl.probe.formats import format_cpu_list

if TYPE_CHECKING:
    from edgectl.profiles import Figure, Profile

STOP_S = 30
MIN_WATCHDOG_S = 5
MAX_WATCHDOG_S = 600
MIN_START_S, MAX_START_S = 180, 1800
# Without a measured prefill rate, the longest engine step is taken as this long.
UNMEASURED_STEP_S = 120.0
# Without a measured time to ready, start-up is taken as this long.
UNMEASURED_READY_S = 300


def predict(profile: Profile, weight_format: WeightFormat, weights_bytes: int) -> Predicted:
    """Speeds and time to ready from the profile's figures (decode is bandwidth-bound: a figure
    measured on another model is scaled by the bytes read per token)."""
    figures = profile.formats.get(weight_format)
    decode = round(_scale(figures.decode_tok_s, weights_bytes), 2) if figures and figures.decode_tok_s else None
    prefill = round(_scale(figures.prefill_tok_s, weights_bytes), 2) if figures and figures.prefill_tok_s else None
    ready = round(profile.ready_s.median, 1) if profile.ready_s else None
    return Predicted(decode_tok_s=decode, prefill_tok_s=prefill, ready_s=ready)


def choose_timeouts(request: Request, profile: Profile, predicted: Predicted, batched_tokens: int) -> Decided[Timeouts]:
    """Watchdog > 3 × the longest engine step; start > 3 × the time to ready."""
    step_s = batched_tokens / predicted.prefill_tok_s if predicted.prefill_tok_s else UNMEASURED_STEP_S
    watchdog_s = int(min(MAX_WATCHDOG_S, max(30, math.ceil(step_s * 3 + 10))))
    if request.watchdog_s is not None:
        watchdog_s = request.watchdog_s
    start_s = int(min(MAX_START_S, max(MIN_START_S, math.ceil((predicted.ready_s or UNMEASURED_READY_S) * 3 + 60))))
    timeouts = Timeouts(start_s=start_s, watchdog_s=watchdog_s, stop_s=STOP_S)
    source = (Source.FLAG if request.watchdog_s is not None
              else profile.reason_source if predicted.prefill_tok_s else Source.FALLBACK)
    detail = (("watchdog asked with --watchdog-sec; " if request.watchdog_s is not None else
               f"watchdog > 3 × the longest engine step ({batched_tokens} tokens at the predicted prefill rate"
               + ("" if predicted.prefill_tok_s else f", {UNMEASURED_STEP_S:.0f} s when not measured") + "); ")
              + f"start > 3 × the measured time to ready ({UNMEASURED_READY_S} s when not measured)")
    return Decided(timeouts, Reason("timeouts", {"start_s": start_s, "watchdog_s": watchdog_s, "stop_s": STOP_S},
                                    source, detail))


def worker_environment(cpus: list[int], threads: int, topology: Topology, reserve_frontend_core: bool) -> dict[str, str]:
    """The variables the plan sets for the worker (declared in contract/environment.py)."""
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": format_cpu_list(cpus[:threads], sep=","),
        "OMP_NUM_THREADS": str(threads),
        **environment.OFFLINE,
    }
    if topology is Topology.SINGLE_PROCESS:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if topology is Topology.STOCK:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1" if reserve_frontend_core else "0"
    return env


def _scale(fig: Figure, weights_bytes: int) -> float:
    """A throughput measured on one model, scaled to this one by resident weight bytes."""
    ref = fig.source.model_weights_bytes
    if ref:
        return fig.median * ref / max(weights_bytes, 1)
    return fig.median
