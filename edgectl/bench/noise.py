"""The noise gate: a run's figures are quotable only when each arm's passes agree.

Per arm, the spread of its passes — max / min over its ``ok`` passes — of the one-stream decode
rate, of the N-stream aggregate decode rate (``--concurrency``), of the prefill rate and of the
long-context decode rate. An arm whose decode spread (one stream or aggregate) exceeds
MAX_DECODE_SPREAD is noisy, not quotable; the run is quotable only if every arm, the control arm
among them (every ratio is divided by it), passes. Prefill is recorded, not gated: one 512-token
TTFT per pass, it moves more than decode on a quiet host too (docs/facts.md, "Measuring without
fooling ourselves"); the long-context decode is recorded, not gated, until runs on a quiet host
say what spread it has there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgectl.bench import stats
from edgectl.bench.arms import CONTROL

# docs/facts.md, "Measuring without fooling ourselves": in the committed runs made on a host no
# other work shared, every arm's decode max/min was at most 1.22; every run recorded as sharing its
# host (or with a pass disturbed) had an arm at 1.32 or more. 1.25 lies between the two.
MAX_DECODE_SPREAD = 1.25
GATED = ("decode_tok_s", "aggregate_decode_tok_s")
RECORDED = ("prefill_tok_s", "decode_long_tok_s")


def spread(values: list[float | None]) -> float | None:
    """max / min of the measured values; None with fewer than one, or a zero."""
    return stats.ratio(stats.maximum(values), stats.minimum(values))


def arm_spreads(passes: list[Mapping[str, Any]],
                metrics: Sequence[str] = (*GATED, *RECORDED)) -> dict[str, float | None]:
    """Each gated and recorded metric's spread over the arm's ``ok`` passes."""
    ok = [p for p in passes if p.get("status") == "ok"]
    return {m: spread([p.get(m) for p in ok]) for m in metrics}


def noise_gate(arms: Mapping[str, Mapping[str, Any]], gated: Sequence[str] = GATED,
               recorded: Sequence[str] = RECORDED) -> dict[str, Any]:
    """``arms``: the artifact's arms (each with its ``passes``). Per arm its spreads and whether
    it is noisy; ``quiet``: no arm is. ``gated``, ``recorded``: the per-pass figures gated and
    recorded (default the text bench's; the speech bench gates its own, bench/speech/report.py)."""
    out: dict[str, Any] = {
        "max_decode_spread": MAX_DECODE_SPREAD, "control": CONTROL if CONTROL in arms else None, "arms": {},
        "method": (f"spread = max / min over an arm's ok passes; an arm whose {' or '.join(gated)} "
                   f"spread exceeds {MAX_DECODE_SPREAD} is noisy, not quotable ({', '.join(recorded)} recorded, "
                   "not gated)")}
    for name, arm in arms.items():
        spreads = arm_spreads(arm.get("passes") or [], (*gated, *recorded))
        noisy = any(s is not None and s > MAX_DECODE_SPREAD for s in (spreads[m] for m in gated))
        out["arms"][name] = {**spreads, "noisy": noisy}
    out["quiet"] = not any(a["noisy"] for a in out["arms"].values())
    return out
