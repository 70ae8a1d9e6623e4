"""The run's artifact (schema ``edgectl.bench/1``), its summary and ratios, the text table, the plot.

Rules that keep a ratio from being quoted wrongly:

- an arm's median/min/max are computed only when *every* pass of that arm is ``ok``;
- the grid is ``complete`` only when every pass of every arm that ran is ``ok`` (an arm skipped
  before it ran, e.g. llama.cpp unavailable, is listed under ``skipped`` and does not count);
- ``ratios`` exist only for a complete grid with the control arm (``stock``); otherwise the
  artifact says why under ``incomplete_reasons``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgectl.atomic import write_text_atomic
from edgectl.bench import llama_log, stats
from edgectl.bench.arms import CONTROL
from edgectl.bench.prediction import check_label
from edgectl.bench.speed_prediction import STALE_AT, speed_prediction, stale
from edgectl.llamacpp import held_isa

SCHEMA = "edgectl.bench/1"
# Per-pass numbers summarised per arm (median, min, max) and divided by the control's.
# A compiled arm's pass has a cold start (empty compile cache) and a warm one (the cache it left):
# ready_s and the rest are the warm start's; ready_cold_s, decode_cold_tok_s and prefill_cold_tok_s
# the cold one's (runner.py).
METRICS = ("decode_tok_s", "prefill_tok_s", "decode_long_tok_s", "ready_s", "pss_steady_bytes", "pss_peak_bytes", "load_peak_ratio",
           "processes", "ready_cold_s", "ready_warm_s", "decode_cold_tok_s", "prefill_cold_tok_s",
           "aggregate_decode_tok_s", "soak_pss_drift")
FIDELITY_METRICS = ("top1_agreement", "mean_kl", "perplexity", "next_token_top1_agreement", "next_token_mean_kl")
RATIO_METRICS = ("decode_tok_s", "prefill_tok_s", "decode_long_tok_s", "ready_s", "pss_steady_bytes", "pss_peak_bytes")


def pass_value(rec: dict[str, Any], metric: str) -> float | None:
    if metric in FIDELITY_METRICS:
        return (rec.get("fidelity") or {}).get(metric)
    return rec.get(metric)


def summarise_arm(passes: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [p for p in passes if p["status"] == "ok"]
    out: dict[str, Any] = {"passes_ok": len(ok), "passes_run": len(passes)}
    if not passes or len(ok) != len(passes):
        out.update(median=None, min=None, max=None,
                   note="not summarised: not every pass of this arm is ok")
        return out
    for name, fn in (("median", stats.median), ("min", stats.minimum), ("max", stats.maximum)):
        out[name] = {m: fn([pass_value(p, m) for p in ok]) for m in (*METRICS, *FIDELITY_METRICS)}
    return out


def incomplete_reasons(records: dict[str, list[dict[str, Any]]], passes: int) -> list[str]:
    out = []
    for name, recs in records.items():
        if len(recs) < passes:
            out.append(f"{name}: {len(recs)} of {passes} passes ran")
        for r in recs:
            if r["status"] != "ok":
                why = "; ".join(r.get("problems") or []) or r.get("error") or "no reason recorded"
                out.append(f"{name} pass {r['pass'] + 1}: {r['status']}: {why}")
    return out


def ratios(records: dict[str, list[dict[str, Any]]], summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each arm / the control, of medians and pass by pass (pass i with the control's pass i)."""
    control = summaries[CONTROL]["median"]
    out: dict[str, Any] = {}
    for name, recs in records.items():
        if name == CONTROL:
            continue
        med = summaries[name]["median"]
        by_pass = []
        for i, rec in enumerate(recs):
            ctl = records[CONTROL][i] if i < len(records[CONTROL]) else None
            by_pass.append({m: stats.ratio(pass_value(rec, m), pass_value(ctl, m) if ctl else None)
                            for m in RATIO_METRICS})
        out[name] = {"median": {m: stats.ratio(med[m], control[m]) for m in RATIO_METRICS}, "passes": by_pass}
    return out


def llama_label(arm: Mapping[str, Any]) -> str:
    """How a llama.cpp arm is named wherever a figure is against it: its format and thread count."""
    threads = arm.get("threads")
    return (f"llama.cpp {arm.get('gguf_type') or '(format unknown)'} at {threads} thread{'s' if threads != 1 else ''}")


# Each figure compared with llama.cpp: its key in a ratio record, the per-pass metric (higher is better).
LLAMA_FIGURES = (("decode", "decode_tok_s"), ("prefill", "prefill_tok_s"), ("decode_long", "decode_long_tok_s"),
                 ("aggregate_decode", "aggregate_decode_tok_s"))


def best_llama(arms: Mapping[str, Mapping[str, Any]], gguf_type: str | None = None,
               metric: str = "decode_tok_s") -> str | None:
    """The llama.cpp arm with the best median ``metric`` (of the format ``gguf_type``, if given):
    llama.cpp at its best for that figure, its format and thread count chosen by the sweep."""
    ran = [(a["median"][metric], n) for n, a in arms.items()
           if a.get("launcher") == "llama.cpp" and (a.get("median") or {}).get(metric) is not None
           and (gguf_type is None or a.get("gguf_type") == gguf_type)]
    return max(ran)[1] if ran else None


def versus_llama(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """Every other arm against llama.cpp at its best, and each arm that reads a GGUF against
    llama.cpp's best on that same file. Its best is chosen per figure (decode, prefill, decode at a
    long context, the N-stream aggregate: each against the llama.cpp arm, of formats × thread
    counts, with the best median of that figure; the ratio record's ``against_by_figure`` names it);
    ``against`` at the top is the best one-stream decode, the headline's anchor."""
    best = best_llama(arms)
    if best is None:
        return None
    swept = {n: {"gguf_type": a.get("gguf_type"), "threads": a.get("threads"),
                 "decode_tok_s": (a.get("median") or {}).get("decode_tok_s")}
             for n, a in arms.items() if a.get("launcher") == "llama.cpp"}
    out: dict[str, Any] = {
        "against": _against(best, arms[best]),
        "chosen_by": (f"per figure, the best median of the {len(swept)} llama.cpp arm(s) (formats x thread counts); "
                      "`against`: the best one-stream decode"),
        "llama_cpp_arms": swept, "arms": {}, "same_file": {}}
    for name, a in arms.items():
        if a.get("launcher") == "llama.cpp" or not a.get("median"):
            continue
        out["arms"][name] = _ratios_to(a, arms)
        same = best_llama(arms, a["gguf_type"]) if a.get("gguf_type") else None
        if same is not None:
            out["same_file"][name] = {"against": _against(same, arms[same]), **_ratios_to(a, arms, a["gguf_type"])}
    return out


def _against(name: str, arm: Mapping[str, Any]) -> dict[str, Any]:
    return {"arm": name, "gguf_type": arm.get("gguf_type"), "threads": arm.get("threads"),
            "label": llama_label(arm), "decode_tok_s": arm["median"]["decode_tok_s"],
            "prefill_tok_s": arm["median"]["prefill_tok_s"],
            "decode_long_tok_s": arm["median"].get("decode_long_tok_s")}


def _ratios_to(arm: Mapping[str, Any], arms: Mapping[str, Mapping[str, Any]],
               gguf_type: str | None = None) -> dict[str, Any]:
    """``arm``'s medians over llama.cpp's best for each figure its arms measured (of ``gguf_type``, if
    given), and which arm that was (``against_by_figure``: figure -> arm name)."""
    out: dict[str, Any] = {"against_by_figure": {}}
    for key, metric in LLAMA_FIGURES:
        best = best_llama(arms, gguf_type, metric)
        if best is None:  # no llama.cpp arm measured it (a context too short; one stream only)
            continue
        out[key] = stats.ratio(arm["median"].get(metric), arms[best]["median"][metric])
        out["against_by_figure"][key] = best
    return out


def bandwidth_ceiling(records: dict[str, list[dict[str, Any]]], summaries: dict[str, dict[str, Any]],
                      bandwidth_gbps: float | None) -> dict[str, Any]:
    """Decode as a share of what memory bandwidth allows if every weight byte is read once per token."""
    out: dict[str, Any] = {"bandwidth_gbps": bandwidth_gbps, "method": (
        "ceiling tok/s = probe bandwidth (GB/s, read + write bytes of a multi-threaded copy, "
        "`edgectl probe --bandwidth`) / bytes read per token, taken as the resident weights "
        "(parameters incl. the tied embedding/LM head, plus weights vLLM moved outside them; "
        "llama.cpp: the GGUF file); KV and activations are not counted, so the real ceiling is lower"),
        "arms": {}}
    if bandwidth_gbps is None:
        out["note"] = "the bandwidth could not be measured: no ceiling"
        return out
    for name, s in summaries.items():
        if not s.get("median"):
            continue
        w = stats.median([r.get("weights_bytes_per_token") for r in records[name]])
        decode = s["median"]["decode_tok_s"]
        ceiling = bandwidth_gbps * 1e9 / w if w else None
        out["arms"][name] = {"weights_bytes_per_token": w, "ceiling_tok_s": ceiling,
                             "decode_fraction_of_ceiling": stats.ratio(decode, ceiling)}
    return out


@dataclass
class BenchResult:
    artifact: dict[str, Any]
    path: Path | None = None
    messages: list[str] = field(default_factory=list)  # e.g. the plot was skipped, a profile was recorded

    def to_dict(self) -> dict[str, Any]:
        return self.artifact

    def render_text(self) -> str:
        return render_text(self.artifact, self.path, self.messages)


def render_text(a: dict[str, Any], path: Path | None, messages: list[str]) -> str:
    lines = [*_heading(a), *_arm_table(a), *_noise_lines(a), *_ratio_lines(a), *_concurrency_and_llama_lines(a), *_soak_lines(a),
             *_memory_prediction_lines(a), *_speed_prediction_lines(a), *_bandwidth_lines(a)]
    if path:
        lines.append(f"artifact: {path}")
    lines += messages
    return "\n".join(lines)


def machine_line(prov: Mapping[str, Any]) -> str:
    """The machine a run measured: its class, and the silicon (one class spans several CPUs)."""
    probe = prov.get("probe") or {}
    cpu, topology = probe.get("cpu") or {}, probe.get("topology") or {}
    silicon = cpu.get("model_name") or "CPU unnamed"
    if cpu.get("signature"):
        silicon += f", {cpu['signature']}"
    usable = topology.get("usable_cpus")
    cpus = f"{len(usable)} usable CPUs" if usable else "usable CPUs unknown"
    return f"machine: {probe.get('device_class') or prov.get('device_class')} ({silicon}; {cpus})"


def _heading(a: dict[str, Any]) -> list[str]:
    """What ran and whether it is complete; whether the servers' ISA was held down."""
    prov = a["provenance"]
    n_arms = len(a["arms"])
    head = (f"edgectl bench {prov['model']}: {n_arms} arm(s) × {prov['passes']} pass(es), interleaved, "
            f"{prov['max_model_len']} tokens context — " + ("complete" if a["complete"] else "INCOMPLETE"))
    if a["complete"] and not a.get("quotable"):
        noisy = [n for n, v in ((a.get("noise") or {}).get("arms") or {}).items() if v["noisy"]]
        head += (f" (noisy: {', '.join(noisy)}: not a figure to quote, see the noise gate below)" if noisy else
                 " (fewer than 3 passes per arm: indicative only, not a figure to quote)")
    lines = [head, machine_line(prov)]
    isa = prov.get("runtime_isa") or {}
    if isa.get("ATEN_CPU_CAPABILITY") or isa.get("ONEDNN_MAX_CPU_ISA"):
        lines.append(f"ISA held down: the servers' PyTorch ran at {isa.get('torch_cpu_capability')} "
                     f"(ATEN_CPU_CAPABILITY={isa.get('ATEN_CPU_CAPABILITY', 'unset')}, ONEDNN_MAX_CPU_ISA="
                     f"{isa.get('ONEDNN_MAX_CPU_ISA', 'unset')}), edgectl's kernels at EDGECTL_KERNEL_ISA="
                     f"{isa.get('EDGECTL_KERNEL_ISA', 'auto')}, on a {prov['probe'].get('device_class')} host: "
                     "emulated figures, not that class's")
        if isa.get("torch_avx512_supported"):
            # vLLM picks its C library and attention kernel from torch.cpu._is_avx512_supported(),
            # which reads cpuid, not ATEN_CPU_CAPABILITY (tests/isa_avx2/sitecustomize.py)
            lines.append("  but vLLM was not held: torch.cpu._is_avx512_supported() said True, so its C library and "
                         "attention ran AVX-512 code; for the whole AVX2 path add PYTHONPATH=tests/isa_avx2 of an "
                         "edgectl checkout")
    return lines


def _arm_table(a: dict[str, Any]) -> list[str]:
    """One row per arm, what the rows mean, each compiled arm's two starts, the arms skipped."""
    rows = [("arm", "passes", "decode tok/s", "prefill tok/s", _long_heading(a), "ready s", "PSS steady", "PSS peak", "procs",
             "top-1", "KL", "ppl")]
    for name, arm in a["arms"].items():
        gb = " GB" if arm.get("median") else ""
        rows.append((name, f"{arm.get('passes_ok', 0)}/{arm.get('passes_run', len(arm['passes']))} ok",
                     _cell(arm, "decode_tok_s", "{:.1f}"), _cell(arm, "prefill_tok_s", "{:.1f}"),
                     _cell(arm, "decode_long_tok_s", "{:.1f}"), _ready_cell(arm), _cell(arm, "pss_steady_bytes", "{:.2f}", 1e9) + gb,
                     _cell(arm, "pss_peak_bytes", "{:.2f}", 1e9) + gb, _cell(arm, "processes", "{:.0f}"),
                     _cell(arm, "top1_agreement", "{:.3f}"), _cell(arm, "mean_kl", "{:.4f}"),
                     _cell(arm, "perplexity", "{:.2f}")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("  (medians [min–max] of the passes; PSS of the server's whole process tree; top-1/KL against "
                 f"{a['fidelity'].get('reference_arm') or 'no reference'})")
    for name, arm in a["arms"].items():
        if (arm.get("median") or {}).get("ready_cold_s") is not None:
            lines.append(f"  {name}: compiled mode, two starts per pass: cold (empty compile cache) ready in "
                         f"{_cell(arm, 'ready_cold_s', '{:.1f}')} s, decode {_cell(arm, 'decode_cold_tok_s', '{:.1f}')} "
                         f"tok/s; warm (the graph loaded from the cache) ready in {_cell(arm, 'ready_warm_s', '{:.1f}')} s, "
                         f"decode {_cell(arm, 'decode_tok_s', '{:.1f}')} tok/s (the row's figures)")
    for name, why in a.get("skipped", {}).items():
        lines.append(f"  skipped {name}: {why}")
    return lines


def _long_heading(a: dict[str, Any]) -> str:
    """The long-context decode column's heading: its context, from the first pass that measured it."""
    for arm in a["arms"].values():
        for p in arm.get("passes") or []:
            n = (p.get("decode_long") or {}).get("context_tokens")
            if n:
                return f"decode @{n} tok/s"
    return "decode @long tok/s"


def _noise_lines(a: dict[str, Any]) -> list[str]:
    """Per arm, the spread of its passes and whether the noise gate (bench/noise.py) passed it."""
    gate = a.get("noise") or {}
    if not gate.get("arms"):
        return []
    bound = gate["max_decode_spread"]
    lines = [f"noise gate: max/min of the passes; an arm whose decode spread exceeds {bound} is noisy, not quotable"]
    for name, v in gate["arms"].items():
        parts = [f"decode {_spread(v.get('decode_tok_s'))}"]
        if v.get("aggregate_decode_tok_s") is not None:
            parts.append(f"aggregate decode {_spread(v['aggregate_decode_tok_s'])}")
        parts.append(f"prefill {_spread(v.get('prefill_tok_s'))}")
        if v.get("decode_long_tok_s") is not None:
            parts.append(f"long-context decode {_spread(v['decode_long_tok_s'])}")
        control = " (control)" if name == gate.get("control") else ""
        lines.append(f"  {name}{control}: {', '.join(parts)} — " + ("noisy, not quotable" if v["noisy"] else "quiet"))
    return lines


def _spread(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _ratio_lines(a: dict[str, Any]) -> list[str]:
    """The ratios to the control arm, or why there are none."""
    if not a["complete"]:
        return ["no ratios: the grid is incomplete —", *[f"  - {r}" for r in a["incomplete_reasons"]]]
    if not a.get("ratios"):
        return [f"no ratios: the control arm `{CONTROL}` was not run"]
    lines = [f"ratios to {CONTROL} (medians; pass by pass in the JSON):"]
    for name, r in a["ratios"].items():
        m = r["median"]
        arm = a["arms"].get(name) or {}
        if arm.get("launcher") == "llama.cpp":
            name = f"{name} ({llama_label(arm)})"
        lines.append(f"  {name:<16} decode {_x(m['decode_tok_s'])}  prefill {_x(m['prefill_tok_s'])}  "
                     + (f"long-context decode {_x(m['decode_long_tok_s'])}  " if m.get("decode_long_tok_s") else "")
                     + f"PSS {_x(m['pss_steady_bytes'])}  peak {_x(m['pss_peak_bytes'])}  ready {_x(m['ready_s'])}")
    return lines


def _concurrency_and_llama_lines(a: dict[str, Any]) -> list[str]:
    """The aggregate decode of concurrent streams, and each arm relative to llama.cpp."""
    lines = []
    streams = a.get("concurrency") or 1
    if streams > 1:
        lines.append(f"{streams} concurrent streams, aggregate decode tok/s (medians [min–max]): " + ", ".join(
            f"{n} {_cell(arm, 'aggregate_decode_tok_s', '{:.1f}')}" for n, arm in a["arms"].items()))
    return lines + _llama_lines(a, streams)


def _llama_lines(a: dict[str, Any], streams: int) -> list[str]:
    """llama.cpp at its best (format and threads named), every arm against it and against llama.cpp
    on the same file, and what llama.cpp repacked."""
    v = a.get("versus_llama_cpp")
    lines = []
    if v and "against" not in v:  # an artifact from before the sweep: {arm: ratios} against its one arm
        lines.append("relative to llama.cpp on the catalog's GGUF at every usable CPU (its format not recorded; "
                     "medians): " + ", ".join(
                         f"{n} decode {_x(r['decode'])} prefill {_x(r['prefill'])}"
                         + (f" {streams}-stream aggregate {_x(r['aggregate_decode'])}" if "aggregate_decode" in r else "")
                         for n, r in v.items()))
    elif v:
        best = v["against"]
        swept = "; ".join(f"{x['gguf_type'] or '?'} at {x['threads']}: {_f(x['decode_tok_s'])}"
                          for x in v["llama_cpp_arms"].values())
        lines.append(f"llama.cpp at its best: {best['label']} ({best['arm']}), decode {best['decode_tok_s']:.1f} tok/s "
                     f"— the best median decode of its arms (format at threads: tok/s — {swept})")

        def ratios(r: dict[str, Any]) -> str:
            names = {"decode": "decode", "prefill": "prefill", "decode_long": "long-context decode",
                     "aggregate_decode": f"{streams}-stream aggregate"}
            # artifacts before 2026-12-05: every figure against the one arm named
            against = r.get("against_by_figure") or {}
            anchor = (r.get("against") or best)["arm"]

            def vs(key: str) -> str:
                other = against.get(key)
                if not other or other == anchor:
                    return ""
                return f" (vs {llama_label(a['arms'][other])})" if other in a["arms"] else f" (vs {other})"

            return " ".join(f"{names[k]} {_x(r[k])}{vs(k)}" for k, _ in LLAMA_FIGURES if r.get(k) is not None)

        if v["arms"]:
            lines.append(f"relative to {best['label']} (medians; a figure where another llama.cpp arm was faster "
                         "is against that one, named): "
                         + ", ".join(f"{n} {ratios(r)}" for n, r in v["arms"].items()))
        for n, r in v["same_file"].items():
            lines.append(f"  {n} on the same {r['against']['gguf_type']} file, relative to {r['against']['label']}: "
                         f"{ratios(r)}")
    repacks = []
    for n, arm in a["arms"].items():
        first = next((p for p in arm["passes"] if p.get("llama_cpp")), None)
        if first:
            repacks.append(f"  {n} ({llama_label(arm)}): {llama_log.describe(first['llama_cpp']['repack'])}")
    if repacks:
        lines += ["llama.cpp's repack at load (its log, first pass):", *repacks]
    return lines


def _soak_lines(a: dict[str, Any]) -> list[str]:
    lines = []
    soaks = [(n, p["soak"]) for n, arm in a["arms"].items() for p in arm["passes"] if p.get("soak")]
    for n, sk in soaks:
        d = sk.get("pss_drift")
        lines.append(f"soak {n}: {sum(sk['requests'].values())} requests in {sk['seconds']:.0f} s from {sk['clients']} "
                     f"clients, {sk['errors']} failed; PSS settled {_gbv(sk.get('pss_settled_bytes'))} → final "
                     f"{_gbv(sk.get('pss_final_bytes'))} ({'–' if d is None else f'{d:+.2%}'})")
    return lines


def _memory_prediction_lines(a: dict[str, Any]) -> list[str]:
    mp = a.get("memory_prediction") or {}
    if not mp.get("arms"):
        return []
    return ["memory, the plan's steady prediction vs the measured PSS (median): " + ", ".join(
        f"{n} {v['predicted_bytes'] / 1e9:.2f} vs {v['measured_bytes'] / 1e9:.2f} GB ({v['error']:+.1%}, "
        f"{check_label(v)})"
        for n, v in mp["arms"].items() if v.get("measured_bytes"))]


def _speed_prediction_lines(a: dict[str, Any]) -> list[str]:
    """The plan's decode, prefill and ready figures (the profile's) against the run's medians; the
    way to bring a profile up to date when one is off by more than STALE_AT."""
    if not a.get("complete"):
        return []
    checked = speed_prediction(a.get("arms") or {})
    if not checked:
        return []
    lines = ["speed, the plan's prediction (its profile's figures) vs the measured median: " + "; ".join(
        f"{n} " + ", ".join(f"{what} {f['predicted']:.4g} vs {f['measured']:.4g} {f['unit']} ({f['error']:+.0%})"
                            for what, f in v["figures"].items())
        for n, v in checked.items())]
    model = a["provenance"]["model"]
    off = {n: figures for n, v in checked.items() if (figures := stale(v))}
    # figures measured on another model were moved to this one by the planner's rule: a miss may be the rule's
    moved = {n: w for n, w in off.items() if checked[n].get("measured_on") not in (None, model)}
    same = {n: w for n, w in off.items() if n not in moved}
    if same:
        profiles = sorted({checked[n]["profile"] or "?" for n in same})
        lines.append(f"  off by more than {STALE_AT:.0%}: " + "; ".join(f"{n} {', '.join(w)}" for n, w in same.items())
                     + f" — the profile ({', '.join(profiles)}) no longer describes this box as it runs now; "
                     f"`edgectl bench {model} --record-profile` measures it again")
    if moved:
        sources = sorted({checked[n]["measured_on"] for n in moved})
        lines.append(f"  off by more than {STALE_AT:.0%}: " + "; ".join(f"{n} {', '.join(w)}" for n, w in moved.items())
                     + f" — figures measured on {', '.join(sources)}, moved to {model} by the planner's rule "
                     "(edgectl/planner/speed.py; the time to ready is not moved): on another model a miss can be "
                     "the rule's, not the profile's age "
                     "(docs/facts.md \"The plan's speed figures, checked\"); `python -m edgectl.bench.decode_rate` "
                     f"fits the decode rate from this run and one of {', '.join(sources)} on the same occasion")
    return lines


def _bandwidth_lines(a: dict[str, Any]) -> list[str]:
    bw = a.get("bandwidth_ceiling") or {}
    if not bw.get("arms"):
        return []
    return [f"decode vs the bandwidth ceiling ({bw['bandwidth_gbps']:.1f} GB/s ÷ resident weights): " + ", ".join(
        f"{n} {_pct(v['decode_fraction_of_ceiling'])} of {_f(v['ceiling_tok_s'])} tok/s"
        for n, v in bw["arms"].items())]


def _cell(arm: dict[str, Any], metric: str, fmt: str, scale: float = 1.0) -> str:
    """The median, with [min–max] when the passes differ; "–" when not measured."""
    med, lo, hi = arm.get("median"), arm.get("min"), arm.get("max")
    if not med or med.get(metric) is None:
        return "–"
    text = fmt.format(med[metric] / scale)
    if lo and hi and lo.get(metric) is not None and hi.get(metric) is not None and lo[metric] != hi[metric]:
        text += f" [{fmt.format(lo[metric] / scale)}–{fmt.format(hi[metric] / scale)}]"
    return text


def _ready_cell(arm: dict[str, Any]) -> str:
    """Time to ready; for a compiled arm both starts, cold (compiling) and warm (from the cache)."""
    if (arm.get("median") or {}).get("ready_cold_s") is not None:
        return f"{_cell(arm, 'ready_cold_s', '{:.0f}')} cold / {_cell(arm, 'ready_warm_s', '{:.0f}')} warm"
    return _cell(arm, "ready_s", "{:.0f}")


def _gbv(v: float | None) -> str:
    return "–" if v is None else f"{v / 1e9:.3f} GB"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def _f(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


# -- files ------------------------------------------------------------------------------------------


def class_label(device_class: str, environ: Mapping[str, str]) -> str:
    """What an artifact's name says it was measured on: the probed device class, prefixed by the ISA
    the run was held to when it was (``avx2-on-x86_64-amx``, ``avxvnni-on-x86_64-amx``: emulated
    figures, not that class's; :func:`edgectl.llamacpp.held_isa`, or PyTorch's capability as asked)."""
    held = held_isa(environ) or environ.get("ATEN_CPU_CAPABILITY")
    return f"{held}-on-{device_class}" if held else device_class


def artifact_path(out_dir: Path, date: str, label: str, model: str) -> Path:
    """``<out>/<date>-<device class>-<model>.json``; a second run that day gets ``-2``, ``-3``, …"""
    stem = f"{date}-{_safe(label)}-{_safe(model)}"
    path = out_dir / f"{stem}.json"
    n = 2
    while path.exists() or path.with_suffix(".logs").exists():
        path = out_dir / f"{stem}-{n}.json"
        n += 1
    return path


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def plot(artifact: dict[str, Any], png: Path) -> str:
    """A PNG of decode, prefill and steady PSS per arm (median, min–max bars); a message either way."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("--plot: matplotlib is not installed, so no plot was written "
                "(install it with `pip install matplotlib` next to edgectl)")
    arms = [(n, a) for n, a in artifact["arms"].items() if a.get("median")]
    if not arms:
        return "--plot: no arm has a complete set of passes: nothing to plot"
    panels = (("decode_tok_s", "decode tok/s", 1.0), ("prefill_tok_s", "prefill tok/s", 1.0),
              ("pss_steady_bytes", "steady PSS (GB)", 1e9))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    names = [n for n, _ in arms]
    for ax, (metric, label, scale) in zip(axes, panels):
        med = [(s["median"][metric] or 0) / scale for _, s in arms]
        lo = [m - (s["min"][metric] or 0) / scale for m, (_, s) in zip(med, arms)]
        hi = [(s["max"][metric] or 0) / scale - m for m, (_, s) in zip(med, arms)]
        ax.bar(range(len(names)), med, yerr=[lo, hi], capsize=3, color="#4a7ab5")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
    prov = artifact["provenance"]
    fig.suptitle(f"{prov['model']} on {prov['host']} ({prov['probe'].get('device_class')}), "
                 f"{prov['passes']} interleaved passes, medians with min–max"
                 + ("" if artifact["complete"] else " — INCOMPLETE")
                 + ("" if artifact.get("quotable") else " — indicative only"), fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return f"plot: {png}"
