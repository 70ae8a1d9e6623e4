"""The speech bench's artifact (schema ``edgectl.bench.speech/1``), its summary and the text table.

The text bench's rules (bench/report.py) hold as they are: an arm is summarised (median, min,
max) only when every pass of it is ``ok``; the grid is complete only when every pass of every arm
that ran is; comparisons exist only for a complete grid; a figure is quotable only from ≥ 3
passes that the noise gate (bench/noise.py) finds quiet, here gated on the figures a speech
claim quotes (the 30 s clip's real-time factor, four clips' aggregate).

``versus_faster_whisper``: the issue's bars for each vLLM arm against faster-whisper on the same
weights (its best arm for each figure): word error rate within ``WER_POINTS`` points, the 30 s
clip's RTF at most faster-whisper's best, four clips' aggregate ≥ ``AGGREGATE_BAR`` × its best.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgectl.bench import stats
from edgectl.bench.noise import noise_gate
from edgectl.bench.prediction import check_label
from edgectl.bench.report import incomplete_reasons

SCHEMA = "edgectl.bench.speech/1"
QUOTABLE_PASSES = 3
METRICS = ("wer", "rtf_5s", "rtf_30s", "transcript_s", "aggregate_audio_s_per_s", "ready_s", "pss_steady_bytes",
           "pss_peak_bytes", "processes")
GATED = ("rtf_30s", "aggregate_audio_s_per_s")  # what the claims quote
RECORDED = ("rtf_5s", "transcript_s")
ANCHOR_PREFIX = "faster-whisper"
WER_POINTS = 1.0  # issue 30: the planned arm's WER within 1.0 point of faster-whisper's
AGGREGATE_BAR = 1.5  # issue 30: four clips at once ≥ 1.5× faster-whisper's best way of doing four
MEMORY_BAR = 0.10  # issue 30: memory predicted within ±10%


def summarise_arm(passes: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [p for p in passes if p["status"] == "ok"]
    out: dict[str, Any] = {"passes_ok": len(ok), "passes_run": len(passes)}
    if not passes or len(ok) != len(passes):
        out.update(median=None, min=None, max=None, note="not summarised: not every pass of this arm is ok")
        return out
    for name, fn in (("median", stats.median), ("min", stats.minimum), ("max", stats.maximum)):
        out[name] = {m: fn([p.get(m) for p in ok]) for m in METRICS}
    best = [p.get("together_best") for p in ok]
    out["together_best"] = max(set(best), key=best.count) if any(best) else None
    return out


def versus_faster_whisper(summaries: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Each vLLM arm's figures against faster-whisper's best arm for each figure (medians)."""
    fw = {n: s["median"] for n, s in summaries.items() if n.startswith(ANCHOR_PREFIX) and s.get("median")}
    if not fw:
        return None

    def best(metric: str, lowest: bool) -> str | None:
        have = [n for n in fw if fw[n].get(metric) is not None]
        return (min if lowest else max)(have, key=lambda n: fw[n][metric]) if have else None

    ref = {"wer": best("wer", True), "rtf_30s": best("rtf_30s", True),
           "aggregate_audio_s_per_s": best("aggregate_audio_s_per_s", False)}
    out: dict[str, Any] = {"reference_arms": ref, "bars": {
        "wer_points": WER_POINTS, "rtf_30s_ratio_at_most": 1.0, "aggregate_ratio_at_least": AGGREGATE_BAR},
        "method": ("medians; WER points = 100 × (arm − faster-whisper's lowest); RTF ratio = arm / faster-whisper's "
                   "lowest (below 1: faster); aggregate ratio = arm / faster-whisper's highest (its better way of "
                   "doing four: workers or the batched pipeline)"), "arms": {}}
    for name, s in summaries.items():
        med = s.get("median")
        if name.startswith(ANCHOR_PREFIX) or name == "whisper.cpp" or not med:
            continue
        wer_points = (100 * (med["wer"] - fw[ref["wer"]]["wer"])
                      if ref["wer"] and med.get("wer") is not None else None)
        rtf = stats.ratio(med.get("rtf_30s"), fw[ref["rtf_30s"]]["rtf_30s"]) if ref["rtf_30s"] else None
        agg = (stats.ratio(med.get("aggregate_audio_s_per_s"), fw[ref["aggregate_audio_s_per_s"]]["aggregate_audio_s_per_s"])
               if ref["aggregate_audio_s_per_s"] else None)
        out["arms"][name] = {
            "wer_points": wer_points, "wer_holds": None if wer_points is None else wer_points <= WER_POINTS,
            "rtf_30s_ratio": rtf, "rtf_30s_holds": None if rtf is None else rtf <= 1.0,
            "aggregate_ratio": agg, "aggregate_holds": None if agg is None else agg >= AGGREGATE_BAR}
    return out


def finish(artifact: dict[str, Any], records: dict[str, list[dict[str, Any]]], passes: int) -> None:
    """Summaries, completeness, the noise gate, the comparisons (in place)."""
    summaries = {}
    for name, recs in records.items():
        artifact["arms"][name]["passes"] = recs
        summaries[name] = summarise_arm(recs)
        artifact["arms"][name].update(summaries[name])
    reasons = incomplete_reasons(records, passes)
    artifact["finished"] = True
    artifact["complete"] = not reasons and bool(records)
    artifact["incomplete_reasons"] = reasons
    artifact["noise"] = noise_gate(artifact["arms"], gated=GATED, recorded=RECORDED)
    artifact["quotable"] = artifact["complete"] and passes >= QUOTABLE_PASSES and artifact["noise"]["quiet"]
    artifact["versus_faster_whisper"] = versus_faster_whisper(summaries) if artifact["complete"] else None


@dataclass
class SpeechBenchResult:
    artifact: dict[str, Any]
    path: Path | None = None
    messages: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return self.artifact

    def render_text(self) -> str:
        return render_text(self.artifact, self.path, self.messages)


def render_text(a: dict[str, Any], path: Path | None, messages: list[str]) -> str:
    lines = [*_heading(a), *_arm_table(a), *_noise_lines(a), *_versus_lines(a), *_memory_lines(a)]
    if path:
        lines.append(f"artifact: {path}")
    return "\n".join([*lines, *messages])


def _heading(a: dict[str, Any]) -> list[str]:
    prov = a["provenance"]
    head = (f"edgectl bench {prov['model']} (speech): {len(a['arms'])} arm(s) × {prov['passes']} pass(es), "
            f"interleaved, arm order rotated each pass, on {prov['device_class']} — "
            + ("complete" if a["complete"] else "INCOMPLETE"))
    if a["complete"] and not a.get("quotable"):
        noisy = [n for n, v in ((a.get("noise") or {}).get("arms") or {}).items() if v["noisy"]]
        head += (f" (noisy: {', '.join(noisy)}: not a figure to quote, see the noise gate below)" if noisy else
                 f" (fewer than {QUOTABLE_PASSES} passes per arm: indicative only, not a figure to quote)")
    clips = prov.get("clips") or {}
    return [head, f"clips: {clips.get('count')} ({clips.get('audio_s', 0):.0f} s of audio) from {clips.get('dir')}; "
                  f"RTF on {clips.get('short')} and {clips.get('window')}, whole transcript of {clips.get('longest')}, "
                  f"four at once: {', '.join(clips.get('together') or [])}"]


def _arm_table(a: dict[str, Any]) -> list[str]:
    rows = [("arm", "passes", "WER %", "RTF 5 s", "RTF 30 s", "transcript s", "4 at once audio-s/s", "ready s",
             "PSS steady", "PSS peak", "procs")]
    for name, arm in a["arms"].items():
        gb = " GB" if arm.get("median") else ""
        four = _cell(arm, "aggregate_audio_s_per_s", "{:.1f}")
        if arm.get("together_best") and four != "–":
            four += f" ({arm['together_best']})"
        rows.append((name, f"{arm.get('passes_ok', 0)}/{arm.get('passes_run', len(arm['passes']))} ok",
                     _cell(arm, "wer", "{:.1f}", 0.01), _cell(arm, "rtf_5s", "{:.3f}"), _cell(arm, "rtf_30s", "{:.3f}"),
                     _cell(arm, "transcript_s", "{:.1f}"), four, _cell(arm, "ready_s", "{:.1f}"),
                     _cell(arm, "pss_steady_bytes", "{:.2f}", 1e9) + gb, _cell(arm, "pss_peak_bytes", "{:.2f}", 1e9) + gb,
                     _cell(arm, "processes", "{:.0f}")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("  (medians [min–max] of the passes; RTF = wall / audio seconds, lower is faster; ready: the vLLM "
                 "arms from launch to their first transcription answered, the anchors their model's load; PSS of "
                 "the whole process tree)")
    for name, why in a.get("skipped", {}).items():
        lines.append(f"  skipped {name}: {why}")
    return lines


def _noise_lines(a: dict[str, Any]) -> list[str]:
    gate = a.get("noise") or {}
    if not gate.get("arms"):
        return []
    lines = [f"noise gate: max/min of the passes; an arm whose {' or '.join(GATED)} spread exceeds "
             f"{gate['max_decode_spread']} is noisy, not quotable"]
    for name, v in gate["arms"].items():
        parts = ", ".join(f"{m} {_x(v.get(m))}" for m in (*GATED, *RECORDED))
        lines.append(f"  {name}: {parts} — " + ("noisy, not quotable" if v["noisy"] else "quiet"))
    return lines


def _versus_lines(a: dict[str, Any]) -> list[str]:
    if not a["complete"]:
        return ["no comparisons: the grid is incomplete —", *[f"  - {r}" for r in a["incomplete_reasons"]]]
    vs = a.get("versus_faster_whisper")
    if not vs:
        return ["no comparison with faster-whisper: no faster-whisper arm ran"]
    ref = vs["reference_arms"]
    lines = [f"against faster-whisper (medians; WER vs {ref['wer']}, RTF vs {ref['rtf_30s']}, four at once vs "
             f"{ref['aggregate_audio_s_per_s']}):"]
    for name, v in vs["arms"].items():
        lines.append(f"  {name:<8} WER {_pts(v['wer_points'])} ({_holds(v['wer_holds'], f'≤ +{WER_POINTS:g}')}), "
                     f"RTF 30 s {_x(v['rtf_30s_ratio'])} ({_holds(v['rtf_30s_holds'], '≤ 1×')}), "
                     f"four at once {_x(v['aggregate_ratio'])} ({_holds(v['aggregate_holds'], f'≥ {AGGREGATE_BAR:g}×')})")
    return lines


def _memory_lines(a: dict[str, Any]) -> list[str]:
    mp = a.get("memory_prediction") or {}
    return [f"memory, the plan's steady prediction vs the measured PSS (median): {n} {v['predicted_bytes'] / 1e9:.3f} "
            f"vs {v['measured_bytes'] / 1e9:.3f} GB ({v['error']:+.1%}, {check_label(v)}; bar ±{MEMORY_BAR:.0%})"
            for n, v in (mp.get("arms") or {}).items() if v.get("measured_bytes") and v.get("predicted_bytes")]


def _cell(arm: dict[str, Any], metric: str, fmt: str, scale: float = 1.0) -> str:
    """The median, with [min–max] when the passes differ; "–" when not measured."""
    med, lo, hi = arm.get("median"), arm.get("min"), arm.get("max")
    if not med or med.get(metric) is None:
        return "–"
    text = fmt.format(med[metric] / scale)
    if lo and hi and lo.get(metric) is not None and hi.get(metric) is not None and lo[metric] != hi[metric]:
        text += f" [{fmt.format(lo[metric] / scale)}–{fmt.format(hi[metric] / scale)}]"
    return text


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _pts(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1f} points"


def _holds(v: bool | None, bar: str) -> str:
    return f"bar {bar}: " + {True: "holds", False: "misses", None: "not measured"}[v]
