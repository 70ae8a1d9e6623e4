"""What the speech and vision benches' reports share: the rules of a grid and the table's pieces.

The text bench's rules (bench/report.py) hold for both: an arm is summarised (median, min, max)
only when every pass of it is ``ok``; the grid is complete only when every pass of every arm that
ran is; comparisons exist only for a complete grid; a figure is quotable only from
``QUOTABLE_PASSES`` passes or more that the noise gate (bench/noise.py) finds quiet, gated on the
figures each bench's claims quote. Each bench's own figures, comparison and table stay in its
``report.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgectl.bench import stats
from edgectl.bench.noise import noise_gate
from edgectl.bench.prediction import check_label
from edgectl.bench.report import incomplete_reasons

QUOTABLE_PASSES = 3


def summarise(passes: list[dict[str, Any]], metrics: Sequence[str],
              value: Callable[[dict[str, Any], str], float | None] = lambda p, m: p.get(m)) -> dict[str, Any]:
    """An arm's median, min and max of each metric (``value``: a pass's figure), only when every pass is ok."""
    ok = [p for p in passes if p["status"] == "ok"]
    out: dict[str, Any] = {"passes_ok": len(ok), "passes_run": len(passes)}
    if not passes or len(ok) != len(passes):
        out.update(median=None, min=None, max=None, note="not summarised: not every pass of this arm is ok")
        return out
    for name, fn in (("median", stats.median), ("min", stats.minimum), ("max", stats.maximum)):
        out[name] = {m: fn([value(p, m) for p in ok]) for m in metrics}
    return out


def finish_grid(artifact: dict[str, Any], records: dict[str, list[dict[str, Any]]], passes: int,
                summarise: Callable[[list[dict[str, Any]]], dict[str, Any]], gated: Sequence[str],
                recorded: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each arm's passes and summary, completeness, the noise gate and quotability, into
    ``artifact`` (in place); the summaries by arm."""
    summaries = {}
    for name, recs in records.items():
        artifact["arms"][name]["passes"] = recs
        summaries[name] = summarise(recs)
        artifact["arms"][name].update(summaries[name])
    reasons = incomplete_reasons(records, passes)
    artifact["finished"] = True
    artifact["complete"] = not reasons and bool(records)
    artifact["incomplete_reasons"] = reasons
    artifact["noise"] = noise_gate(artifact["arms"], gated=gated, recorded=recorded)
    artifact["quotable"] = artifact["complete"] and passes >= QUOTABLE_PASSES and artifact["noise"]["quiet"]
    return summaries


@dataclass
class GridResult:
    """A bench's artifact and where it was written; each bench renders it as its text."""

    artifact: dict[str, Any]
    path: Path | None = None
    messages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return self.artifact

    def render_text(self) -> str:
        raise NotImplementedError


def not_quotable_note(a: dict[str, Any]) -> str:
    """What the heading of a complete grid that is not quotable adds: why not ("" otherwise)."""
    if not a["complete"] or a.get("quotable"):
        return ""
    noisy = [n for n, v in ((a.get("noise") or {}).get("arms") or {}).items() if v["noisy"]]
    return (f" (noisy: {', '.join(noisy)}: not a figure to quote, see the noise gate below)" if noisy else
            f" (fewer than {QUOTABLE_PASSES} passes per arm: indicative only, not a figure to quote)")


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """The rows as aligned columns, indented."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def noise_lines(a: dict[str, Any], gated: Sequence[str], recorded: Sequence[str]) -> list[str]:
    gate = a.get("noise") or {}
    if not gate.get("arms"):
        return []
    lines = [f"noise gate: max/min of the passes; an arm whose {' or '.join(gated)} spread exceeds "
             f"{gate['max_decode_spread']} is noisy, not quotable"]
    for name, v in gate["arms"].items():
        parts = ", ".join(f"{m} {times(v.get(m))}" for m in (*gated, *recorded))
        lines.append(f"  {name}: {parts} — " + ("noisy, not quotable" if v["noisy"] else "quiet"))
    return lines


def incomplete_lines(a: dict[str, Any]) -> list[str]:
    return ["no comparisons: the grid is incomplete —", *[f"  - {r}" for r in a["incomplete_reasons"]]]


def memory_lines(a: dict[str, Any], bar: float) -> list[str]:
    mp = a.get("memory_prediction") or {}
    return [f"memory, the plan's steady prediction vs the measured PSS (median): {n} {v['predicted_bytes'] / 1e9:.3f} "
            f"vs {v['measured_bytes'] / 1e9:.3f} GB ({v['error']:+.1%}, {check_label(v)}; bar ±{bar:.0%})"
            for n, v in (mp.get("arms") or {}).items() if v.get("measured_bytes") and v.get("predicted_bytes")]


def cell(arm: dict[str, Any], metric: str, fmt: str, scale: float = 1.0) -> str:
    """The median, with [min–max] when the passes differ; "–" when not measured."""
    med, lo, hi = arm.get("median"), arm.get("min"), arm.get("max")
    if not med or med.get(metric) is None:
        return "–"
    text = fmt.format(med[metric] / scale)
    if lo and hi and lo.get(metric) is not None and hi.get(metric) is not None and lo[metric] != hi[metric]:
        text += f" [{fmt.format(lo[metric] / scale)}–{fmt.format(hi[metric] / scale)}]"
    return text


def times(v: float | None) -> str:
    """A ratio as ``1.23×``; "–" when not measured."""
    return "–" if v is None else f"{v:.2f}×"


def holds(v: bool | None, bar: str) -> str:
    return f"bar {bar}: " + {True: "holds", False: "misses", None: "not measured"}[v]
