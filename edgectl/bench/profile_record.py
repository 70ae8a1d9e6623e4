"""``--record-profile``: the device class's profile (``edgectl.profile/1``) from a complete run.

What is written, each figure the median of the run's passes with min, max and the pass count,
each naming a source that carries the run's provenance:

- ``formats.<planned format>`` decode/prefill from the ``planned`` arm (and its measured
  resident/planned weight ratio), ``formats.bf16`` / ``w4a16`` / ``w4a8`` from the arms of those
  names (the plan with that weight format, measured in the same passes); formats the run did
  not measure are carried over from the profile of that name already installed, if any;
- ``runtime.process_bytes``: solved so that the planner's ledger for the planned request
  (runtime × processes + weights + KV + RoPE + workspace) equals the measured steady PSS —
  the planner itself computes the model-dependent parts, so nothing is estimated twice;
- ``runtime.tokenizer_bytes``: what the model's tokenizer costs the worker, as its pull measured it
  (the per-process figure carries it; the ledger adds another model's difference from it);
- ``runtime.processes.stock``: with a ``topology-stock`` arm, the process count whose ledger is
  closest to that arm's steady PSS (process-equivalents: vLLM's processes differ in size);
- ``runtime.load_peak_ratio`` (peak PSS launch→ready / steady PSS, at least 1) and ``runtime.ready_s``;
- ``threads.reserve_frontend_core`` from the ``reserve-core-on``/``-off`` pair: reserved only
  if its decode range lies entirely above the other's, with the numbers as evidence;
- ``threads.wait`` from the ``planned`` arm and the ``wait-*`` arms beside it (each's wait read back
  from the engine): the way of waiting whose decode range lies entirely above every other's, with the
  numbers as evidence; none recorded when the ranges overlap;
- ``bandwidth_gbps`` from the probe;
- ``compiled``: with a compiled arm (``compiled``, ``w4a8-compiled``, or a plan in compiled
  mode) whose format was also measured eager, that format in vLLM's compiled mode — of several,
  the one that decodes fastest eager, which the planner picks: decode, prefill, ``ready_cold_s`` (the first start, on an empty compile cache),
  ``ready_warm_s`` (a start that loaded the saved graph), ``cold_peak_ratio`` (the compiling
  start's peak PSS over the steady one) and ``extra_bytes`` (its steady PSS
  minus the eager arm's, pass by pass), all on inductor's Python wrapper; with an arm on its C++
  wrapper beside one on the Python wrapper (``cpp-wrapper``, ``python-wrapper``, ``planned``),
  ``compiled.cpp_wrapper``: both decodes, the C++ wrapper's first start and its peak (the planner
  turns the lever on from them; an installed profile's are carried over otherwise). The rest of
  the profile is eager mode's: a plan in compiled mode needs the ``eager`` arm beside it.

The document is validated with ``parse_profile``, re-planned to check the ±10% match, and
written atomically to ``<dir>/<device class>.yaml`` (a local profile of the same name
overrides the shipped one).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from edgectl.atomic import write_text_atomic
from edgectl.contract.plan import Compilation, Plan, Request, Topology
from edgectl.errors import EdgectlError
from edgectl.planner import plan as make_plan
from edgectl.probe.facts import AVX512_CORE
from edgectl.profiles import SCHEMA, parse_profile

MiB = 1 << 20
MATCH_TOLERANCE = 0.10

# Match rules per device class, used when no profile of that name exists yet to copy them from
# (the same ISA tests as edgectl.probe.cpu.device_class).
CLASS_MATCH: dict[str, dict[str, Any]] = {
    "x86_64-amx": {"arch": "x86_64", "isa_all": [*AVX512_CORE, "amx_tile", "amx_bf16"]},
    "x86_64-avx512-bf16": {"arch": "x86_64", "isa_all": [*AVX512_CORE, "avx512_bf16"], "isa_none": ["amx_tile"]},
    "x86_64-avx512": {"arch": "x86_64", "isa_all": [*AVX512_CORE], "isa_none": ["avx512_bf16", "amx_tile"]},
    "x86_64-avx2": {"arch": "x86_64", "isa_all": ["avx2", "fma"], "isa_none": ["avx512f"]},
    "aarch64-sve": {"arch": "aarch64", "isa_all": ["sve"]},
    "aarch64-neon": {"arch": "aarch64", "isa_all": ["asimd"], "isa_none": ["sve"]},
}


def record_profile(artifact: dict[str, Any], artifact_path: Path, profiles_dir: Path, facts: Any, model: Any,
                   environ: Any) -> Path:
    doc, check = build_profile(artifact, artifact_path, facts, model, environ, profiles_dir)
    profiles_dir.mkdir(parents=True, exist_ok=True)
    path = profiles_dir / f"{doc['name']}.yaml"
    header = (f"# Recorded by `edgectl bench --record-profile` from {artifact_path.name}\n"
              f"# ({artifact['provenance']['command']}).\n"
              f"# Check: the plan's steady memory {check['planned_total_bytes'] / MiB:.0f} MiB vs measured "
              f"{check['measured_steady_bytes'] / MiB:.0f} MiB ({100 * check['error']:+.1f}%).\n")
    text = header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110)
    write_text_atomic(path, text)
    return path


def build_profile(artifact: dict[str, Any], artifact_path: Path, facts: Any, model: Any,
                  environ: Any, profiles_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The profile document, and the ledger check against the measured steady PSS."""
    from edgectl.inputs import profile_dirs
    from edgectl.profiles import load_profiles

    arms = artifact["arms"]
    base_name = _eager_arm_name(arms)
    prov = artifact["provenance"]
    device_class = str(facts.device_class)
    name = device_class
    existing_profiles = {p.name: p for p in load_profiles([*profile_dirs(environ), profiles_dir])}
    existing_raw = _raw_profile(existing_profiles.get(name))
    date = prov["started_at"][:10]
    planned = arms[base_name]
    plan = _plan_of(planned)
    fmt = str(plan.weight_format)  # plain text: it becomes a YAML key
    planned_key = f"bench-{date}-{fmt}"

    base_source = _base_source(prov, facts, model, artifact_path.name, date)
    sources: dict[str, Any] = {}
    formats = _formats_section(arms, base_name, fmt, base_source, sources, date, prov["max_model_len"], existing_raw)
    runtime = _runtime_section(planned, plan, model, existing_raw, planned_key)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "name": name,
        "device_class": device_class,
        "kind": "measured",
        "description": (f"Measured with `edgectl bench` on {base_source['cpu_model']}, {base_source['cores']} CPUs, "
                        f"{date}: {prov['model']} at {prov['max_model_len']} tokens, {prov['passes']} interleaved passes."),
        "match": existing_raw.get("match") or CLASS_MATCH.get(device_class) or {"arch": facts.cpu.arch or "any"},
        "sources": sources,
        "formats": formats,
        "runtime": runtime,
        "compilation": str(plan.compilation),
    }
    compiled = _compiled_section(arms, base_name, fmt, formats, base_source, sources, date, existing_raw)
    if compiled is not None:
        doc["compiled"] = compiled
    threads = {**(existing_raw.get("threads") or {}), **(_reserve_core(arms, artifact_path.name) or {}),
               **(_thread_wait(arms, artifact_path.name) or {})}
    if threads:
        doc["threads"] = threads
    if facts.bandwidth_gbps is not None:
        doc["bandwidth_gbps"] = {"median": round(float(facts.bandwidth_gbps), 2), "passes": 1, "source": planned_key}

    # eager mode's ledger: the request names the mode, or a profile with compiled figures could pick the other
    request = replace(plan.request, weight_format=fmt, compilation=str(plan.compilation))
    runtime["process_bytes"] = _process_bytes(doc, facts, model, request, existing_profiles, planned, planned_key)
    if "topology-stock" in arms and arms["topology-stock"].get("median"):
        runtime["processes"]["stock"] = _stock_processes(doc, facts, model, arms["topology-stock"], existing_profiles)
    return doc, _ledger_check(doc, existing_profiles, facts, model, request, planned)


# -- sections ----------------------------------------------------------------------------------------


def _eager_arm_name(arms: dict[str, Any]) -> str:
    """The arm the profile's format figures and ledger come from: they are eager mode's (compiled
    mode's go under ``compiled``), so a plan in compiled mode needs the ``eager`` arm beside it."""
    if "planned" not in arms or not arms["planned"].get("median"):
        raise EdgectlError("--record-profile: the planned arm has no complete set of passes")
    if _plan_of(arms["planned"]).compilation is Compilation.EAGER:
        return "planned"
    if "eager" not in arms or not arms["eager"].get("median"):
        raise EdgectlError("--record-profile: the plan is in compiled mode and a profile's figures are eager "
                           "mode's (compiled mode's are recorded beside them): add the `eager` arm to --arms")
    return "eager"


def _base_source(prov: dict[str, Any], facts: Any, model: Any, artifact_name: str, date: str) -> dict[str, Any]:
    """What every source of this run says: the host, the versions, the command, the artifact, the model (and
    the parameters its prefill figures are moved to another model by: planner/speed.py)."""
    return {
        "cpu_model": facts.cpu.model_name or "unknown",
        "cores": len(facts.topology.usable_cpus or []),
        "ram_bytes": int(facts.memory.total_bytes or 0),
        "date": date,
        "command": prov["command"],
        "vllm": prov.get("vllm") or "unknown",
        "torch": prov.get("torch") or "unknown",
        "edgectl_commit": _commit(prov.get("edgectl") or {}),
        "artifact": str(artifact_name),
        "model": prov["model"],
        **({"model_linear_params": model.linear_params} if model.linear_params else {}),
    }


def _format_from_arm(arm_name: str, arm: dict[str, Any], arm_fmt: str, base_source: dict[str, Any], key: str,
                     max_model_len: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One format's source and entry, from the arm that ran it: decode, prefill, and (a quantized
    format on the worker) the measured resident/planned weight ratio."""
    weights_bytes = _plan_of(arm).memory.weights_bytes
    source = {**base_source, "model_weights_bytes": weights_bytes,
              "notes": f"arm `{arm_name}` ({arm['description']}), {max_model_len} tokens context"}
    entry: dict[str, Any] = {"runs": True}
    for metric in ("decode_tok_s", "prefill_tok_s"):
        entry[metric] = _figure(arm, metric, key)
    ratios = [(p.get("weights_bytes_per_token") or 0) / weights_bytes for p in arm["passes"]]
    if arm_fmt != "bf16" and all(r > 0 for r in ratios) and arm["launcher"] == "worker":
        entry["weights_bytes_ratio"] = _figure_values(ratios, key, digits=4)
    return source, entry


def _formats_section(arms: dict[str, Any], base_name: str, fmt: str, base_source: dict[str, Any],
                     sources: dict[str, Any], date: str, max_model_len: int,
                     existing_raw: dict[str, Any]) -> dict[str, Any]:
    """``formats``: the planned format, the format arms the run measured, then the installed
    profile's entries for the formats it did not (their sources added to ``sources``)."""
    formats: dict[str, Any] = {}
    measured = [(base_name, fmt)]
    # the format arms (the plan with another weight format), each where the run measured it
    measured += [(other, other) for other in ("bf16", "w4a16", "w4a8")
                 if other != fmt and other in arms and arms[other].get("median")]
    for arm_name, arm_fmt in measured:
        key = f"bench-{date}-{arm_fmt}"
        sources[key], formats[arm_fmt] = _format_from_arm(arm_name, arms[arm_name], arm_fmt, base_source, key,
                                                          max_model_len)
    # formats this run did not measure: keep what the installed profile of this name says
    for other, entry in (existing_raw.get("formats") or {}).items():
        if other not in formats:
            formats[other] = _carry(entry, existing_raw, sources)
    return formats


def _runtime_section(planned: dict[str, Any], plan: Plan, model: Any, existing_raw: dict[str, Any],
                     planned_key: str) -> dict[str, Any]:
    """``runtime`` but ``process_bytes`` (solved last, from the whole draft): processes per
    topology, the load peak, the time to ready, the tokenizer the figures carry."""
    runtime: dict[str, Any] = {"processes": dict((existing_raw.get("runtime") or {}).get("processes")
                                                 or {"single-process": 1, "stock": 4})}
    runtime["processes"][str(plan.topology)] = 1 if plan.topology is Topology.SINGLE_PROCESS else \
        int(planned["median"]["processes"])
    # The peak is sampled from launch to ready; serving can grow past it (activations of the first
    # long prompt), and the planner's MemoryHigh/MemoryMax multiply the steady total by this ratio:
    # a ratio below 1 would put MemoryHigh under the steady state, so it is taken as ≥ 1.
    peak = [max(p["pss_peak_bytes"], p["pss_steady_bytes"]) / p["pss_steady_bytes"] for p in planned["passes"]]
    runtime["load_peak_ratio"] = _figure_values(peak, planned_key, digits=4)
    runtime["ready_s"] = _figure(planned, "ready_s", planned_key, digits=1)
    if model.tokenizer_bytes is not None and str(plan.levers.tokenizer) == "lean":
        # the per-process figure below carries this model's tokenizer, as its pull measured it
        runtime["tokenizer_bytes"] = {"median": model.tokenizer_bytes, "passes": 1, "source": planned_key}
    return runtime


def _compiled_section(arms: dict[str, Any], base_name: str, fmt: str, formats: dict[str, Any],
                      base_source: dict[str, Any], sources: dict[str, Any], date: str,
                      existing_raw: dict[str, Any]) -> dict[str, Any] | None:
    """``compiled`` from this run (``_compiled``), else the installed profile's for the planned format."""
    eager_arms = {fmt: base_name, **{other: other for other in formats
                                     if other != fmt and (arms.get(other) or {}).get("median")}}
    compiled = _compiled(arms, eager_arms, base_source, sources, date)
    old = existing_raw.get("compiled") or {}
    if compiled is None and old.get("weight_format") == fmt:
        compiled = {"weight_format": fmt, **_carry({k: v for k, v in old.items()
                                                    if k not in ("weight_format", "cpp_wrapper")}, existing_raw, sources)}
    if compiled is not None:
        cpp = _cpp_wrapper(arms, compiled["weight_format"], base_source, sources, date)
        if cpp is None and old.get("cpp_wrapper") and old.get("weight_format") == compiled["weight_format"]:
            cpp = _carry(old["cpp_wrapper"], existing_raw, sources)
        if cpp is not None:
            compiled["cpp_wrapper"] = cpp
    return compiled


def _process_bytes(doc: dict[str, Any], facts: Any, model: Any, request: Request, existing: dict[str, Any],
                   planned: dict[str, Any], source: str) -> dict[str, Any]:
    """``runtime.process_bytes``: per pass, solved so that the planner's ledger for the planned
    request equals the measured steady PSS."""
    steady = [p["pss_steady_bytes"] for p in planned["passes"]]
    n, rest = _ledger_parts(doc, facts, model, request, existing, source)
    per_pass = [(s - rest) / n for s in steady]
    if min(per_pass) <= 0:
        raise EdgectlError(
            f"--record-profile: the measured steady PSS ({min(steady) / MiB:.0f} MiB) is below the plan's "
            f"model-dependent parts ({rest / MiB:.0f} MiB): the ledger cannot be solved; not recorded")
    return _figure_values([round(v) for v in per_pass], source, digits=0)


def _ledger_check(doc: dict[str, Any], existing: dict[str, Any], facts: Any, model: Any, request: Request,
                  planned: dict[str, Any]) -> dict[str, Any]:
    """The plan from the recorded profile against the measured steady PSS: within ±10%, or not recorded."""
    total = _plan_total(_candidate(doc, existing), facts, model, request)
    measured = planned["median"]["pss_steady_bytes"]
    error = (total - measured) / measured
    if abs(error) > MATCH_TOLERANCE:
        raise EdgectlError(f"--record-profile: the plan from the recorded profile predicts {total / MiB:.0f} MiB, "
                           f"measured {measured / MiB:.0f} MiB ({100 * error:+.0f}%): not recorded")
    return {"planned_total_bytes": total, "measured_steady_bytes": measured, "error": error}


# -- pieces ------------------------------------------------------------------------------------------


def _figure(arm: dict[str, Any], metric: str, source: str, digits: int = 2) -> dict[str, Any]:
    values = [p[metric] for p in arm["passes"]]
    return _figure_values(values, source, digits)


def _figure_values(values: list[float], source: str, digits: int) -> dict[str, Any]:
    from edgectl.bench.stats import median

    def r(v: float) -> float | int:
        return int(round(v)) if digits == 0 else round(float(v), digits)

    med = median(values)
    assert med is not None
    return {"median": r(med), "min": r(min(values)), "max": r(max(values)), "passes": len(values), "source": source}


def _commit(ed: dict[str, Any]) -> str:
    if ed.get("commit"):
        return ed["commit"] + ("+dirty" if ed.get("dirty") else "")
    return f"edgectl {ed.get('version') or 'unknown version'} (no git checkout)"


def _plan_of(arm: dict[str, Any]) -> Plan:
    """The plan an arm of the artifact ran."""
    return Plan.from_dict(arm["plan"], source="the artifact's plan")


def _candidate(doc: dict[str, Any], existing: dict[str, Any]) -> list[Any]:
    profile, errors = parse_profile(doc, f"{doc['name']}.yaml")
    if errors:
        raise EdgectlError("--record-profile: the recorded profile does not validate: " + errors[0],
                           details=errors[1:])
    return [p for n, p in existing.items() if n != doc["name"]] + [profile]


def _plan_total(profiles: list[Any], facts: Any, model: Any, request: Request) -> int:
    """The plan's total from ``profiles`` (the recorded one last), on the host it was recorded on."""
    from edgectl.profiles import select_profile

    profile = profiles[-1]
    chosen, _ = select_profile(profiles, facts)
    if chosen.name != profile.name:
        raise EdgectlError(f"--record-profile: the planner would pick profile {chosen.name}, not the recorded "
                           f"{profile.name}, on this host: check its match rules")
    return make_plan(facts, model, profiles, request).memory.total_bytes


def _ledger_parts(doc: dict[str, Any], facts: Any, model: Any, request: Request, existing: dict[str, Any],
                  source: str) -> tuple[int, int]:
    """(processes, everything but runtime) of the planner's ledger, from a draft with 1 MiB per process."""
    draft = {**doc, "runtime": {**doc["runtime"], "process_bytes": {"median": MiB, "passes": 1, "source": source}}}
    profiles = _candidate(draft, existing)
    p = make_plan(facts, model, profiles, request)
    n = p.memory.runtime_bytes // MiB
    return n, p.memory.total_bytes - p.memory.runtime_bytes


def _stock_processes(doc: dict[str, Any], facts: Any, model: Any, arm: dict[str, Any], existing: dict[str, Any]) -> int:
    arm_plan = _plan_of(arm)
    request = replace(arm_plan.request, weight_format=str(arm_plan.weight_format),
                      compilation=str(arm_plan.compilation))
    measured = arm["median"]["pss_steady_bytes"]
    best, best_err = 1, None
    for k in range(1, 9):
        trial = {**doc, "runtime": {**doc["runtime"], "processes": {**doc["runtime"]["processes"], "stock": k}}}
        total = make_plan(facts, model, _candidate(trial, existing), request).memory.total_bytes
        err = abs(total - measured)
        if best_err is None or err < best_err:
            best, best_err = k, err
    return best


# The arms that run a format in vLLM's compiled mode (``planned`` when the plan itself is compiled) on
# inductor's Python wrapper: the compiled figures are that wrapper's, the C++ one's go under
# ``compiled.cpp_wrapper`` (``_cpp_wrapper``).
COMPILED_ARMS = ("compiled", "w4a8-compiled", "python-wrapper", "planned")


def _compiled(arms: dict[str, Any], eager_arms: dict[str, str], base_source: dict[str, Any],
              sources: dict[str, Any], date: str) -> dict[str, Any] | None:
    """The ``compiled`` section: of the formats this run measured in both modes (``eager_arms``:
    format → its eager arm), the one whose eager decode is fastest — the format the planner will
    pick — with its compiled arm's figures; None when no format was measured compiled."""
    measured: list[tuple[float, str, str]] = []  # (eager decode, format, compiled arm)
    for name in COMPILED_ARMS:
        arm = arms.get(name)
        if not arm or not arm.get("median"):
            continue
        arm_plan = _plan_of(arm)
        arm_fmt = str(arm_plan.weight_format)
        eager_name = eager_arms.get(arm_fmt)
        if arm_plan.compilation is not Compilation.DEFAULT or eager_name is None or eager_name == name:
            continue
        if arm_plan.levers.cpp_wrapper:
            continue
        if any(m[1] == arm_fmt for m in measured):
            continue
        measured.append((arms[eager_name]["median"]["decode_tok_s"], arm_fmt, name))
    if not measured:
        return None
    _, fmt, name = max(measured)
    arm, eager = arms[name], arms[eager_arms[fmt]]
    arm_plan = _plan_of(arm)
    key = f"bench-{date}-{fmt}-compiled"
    sources[key] = {**base_source, "model_weights_bytes": arm_plan.memory.weights_bytes,
                    "notes": f"arm `{name}` ({arm['description']}) in vLLM's compiled mode: per pass a cold start "
                             "(empty compile cache) and a warm start (the graph it saved, loaded)"}
    out: dict[str, Any] = {"weight_format": fmt}
    for metric, digits in (("decode_tok_s", 2), ("prefill_tok_s", 2), ("ready_cold_s", 1), ("ready_warm_s", 1)):
        if all(p.get(metric) is not None for p in arm["passes"]):
            out[metric] = _figure(arm, metric, key, digits)
    extra = [c["pss_steady_bytes"] - e["pss_steady_bytes"] for c, e in zip(arm["passes"], eager["passes"])]
    out["extra_bytes"] = _figure_values(extra, key, digits=0)
    ratio = _cold_peak_ratio(arm, key)
    if ratio is not None:
        out["cold_peak_ratio"] = ratio
    return out


def _cold_peak_ratio(arm: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The first start's peak (it compiles) over the steady PSS of a start that loaded the graph, per pass."""
    cold_peaks = [(p.get("cold") or {}).get("pss_peak_bytes") for p in arm["passes"]]
    if not (all(cold_peaks) and all(p.get("pss_steady_bytes") for p in arm["passes"])):
        return None
    return _figure_values([peak / p["pss_steady_bytes"] for peak, p in zip(cold_peaks, arm["passes"])], key, digits=4)


def _cpp_wrapper(arms: dict[str, Any], fmt: str, base_source: dict[str, Any], sources: dict[str, Any],
                 date: str) -> dict[str, Any] | None:
    """``compiled.cpp_wrapper`` from this run: an arm of format ``fmt`` compiled on inductor's C++ wrapper
    (``cpp-wrapper``, or ``planned`` when the plan has it) beside one on the Python wrapper
    (``python-wrapper``, or ``planned``), interleaved; None unless both ran."""
    def arm_on(cpp: bool) -> str | None:
        for name in ("cpp-wrapper" if cpp else "python-wrapper", "planned"):
            arm = arms.get(name)
            if not arm or not arm.get("median"):
                continue
            arm_plan = _plan_of(arm)
            if (arm_plan.compilation is Compilation.DEFAULT and bool(arm_plan.levers.cpp_wrapper) is cpp
                    and str(arm_plan.weight_format) == fmt):
                return name
        return None

    ours, control = arm_on(True), arm_on(False)
    if ours is None or control is None:
        return None
    key = f"bench-{date}-cpp-wrapper"
    sources[key] = {**base_source, "model_weights_bytes": _plan_of(arms[ours]).memory.weights_bytes,
                    "notes": f"arm `{ours}` (inductor's C++ graph wrapper) beside `{control}` (its Python wrapper), "
                             "compiled, interleaved: per pass a cold start (it compiles) and a warm start"}
    out = {"decode_tok_s": _figure(arms[ours], "decode_tok_s", key),
           "control_decode_tok_s": _figure(arms[control], "decode_tok_s", key)}
    if all(p.get("ready_cold_s") is not None for p in arms[ours]["passes"]):
        out["ready_cold_s"] = _figure(arms[ours], "ready_cold_s", key, 1)
    ratio = _cold_peak_ratio(arms[ours], key)
    if ratio is not None:
        out["cold_peak_ratio"] = ratio
    return out


def _reserve_core(arms: dict[str, Any], artifact_name: str) -> dict[str, Any] | None:
    on, off = arms.get("reserve-core-on"), arms.get("reserve-core-off")
    if not (on and off and on.get("median") and off.get("median")):
        return None
    reserve = on["min"]["decode_tok_s"] > off["max"]["decode_tok_s"]
    evidence = (f"decode {on['median']['decode_tok_s']:.1f} tok/s [{on['min']['decode_tok_s']:.1f}–"
                f"{on['max']['decode_tok_s']:.1f}] with a core reserved for the front end vs "
                f"{off['median']['decode_tok_s']:.1f} [{off['min']['decode_tok_s']:.1f}–{off['max']['decode_tok_s']:.1f}] "
                f"without ({len(on['passes'])} interleaved passes each, {artifact_name}); reserved only if every "
                "pass with it beats every pass without")
    return {"reserve_frontend_core": bool(reserve), "evidence": evidence}


def _thread_wait(arms: dict[str, Any], artifact_name: str) -> dict[str, Any] | None:
    """The way of waiting that beat every other in every pass: from the ``planned`` and ``wait-*`` arms,
    each named by the wait its engine read back (one arm per way; none if the passes disagree)."""
    by_wait: dict[str, dict[str, Any]] = {}
    for name, arm in arms.items():
        if not (name == "planned" or name.startswith("wait-")) or not arm.get("median"):
            continue
        read = {(p.get("effective") or {}).get("thread_wait") for p in arm.get("passes") or () if p.get("status") == "ok"}
        if len(read) == 1 and None not in read:
            by_wait.setdefault(str(read.pop()), arm)
    if len(by_wait) < 2:
        return None
    decode = {w: (a["median"]["decode_tok_s"], a["min"]["decode_tok_s"], a["max"]["decode_tok_s"]) for w, a in by_wait.items()}
    best = max(decode, key=lambda w: decode[w][0])
    if any(decode[best][1] <= hi for w, (_, _, hi) in decode.items() if w != best):
        return None
    shown = "; ".join(f"{w} {med:.1f} [{lo:.1f}–{hi:.1f}]" for w, (med, lo, hi) in decode.items())
    evidence = (f"decode tok/s waiting with {shown} ({len(by_wait[best]['passes'])} interleaved passes each, "
                f"{artifact_name}); a way of waiting is recorded only if every pass with it beats every pass of the others")
    return {"wait": best, "wait_evidence": evidence}


def _raw_profile(profile: Any) -> dict[str, Any]:
    if profile is None:
        return {}
    try:
        return yaml.safe_load(Path(profile.file).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _carry(entry: dict[str, Any], raw: dict[str, Any], sources: dict[str, Any]) -> dict[str, Any]:
    """A format entry of an installed profile, its figures' sources made explicit and copied along."""
    raw_sources = raw.get("sources") or {}
    default = next(iter(raw_sources)) if len(raw_sources) == 1 else None
    out = dict(entry)
    for key, value in entry.items():
        if isinstance(value, dict) and "median" in value:
            src = value.get("source", default)
            if src in raw_sources:
                sources.setdefault(src, raw_sources[src])
                out[key] = {**value, "source": src}
    return out
