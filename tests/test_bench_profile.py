"""`edgectl bench --record-profile`: the profile round-trips through parse_profile, the planner then
predicts the measured steady PSS of the arm it was solved from (the calibration itself, exact by
construction) and of a configuration it was not solved from (held out); timing is never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bench_helpers import bench, environ, tiny_model
from models_helpers import REPO

from edgectl.bench import stats
from edgectl.bench.prediction import memory_prediction
from edgectl.contract.plan import ProfileKind, ProfileRef, Request
from edgectl.errors import EdgectlError
from edgectl.inputs import make_plan
from edgectl.models.inspect import inspect_model
from edgectl.probe import probe
from edgectl.profiles import load_profile, parse_profile

HOSTS = REPO / "tests" / "fixtures" / "hosts"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path)


def test_a_recorded_profile_validates_and_the_plan_then_matches_the_measured_memory(tmp_path, model_dir) -> None:
    facts = probe(str(HOSTS / "kvm-xeon-avx512-2c"), environ={})
    result = bench(tmp_path, model_dir, facts, "stock,planned,bf16,reserve-core-on,reserve-core-off,topology-stock",
                   passes=3, record_profile=True)
    a = result.to_dict()
    assert a["complete"], a["incomplete_reasons"]
    path = tmp_path / "profiles" / "x86_64-avx512.yaml"
    assert any(m == f"profile recorded: {path}" for m in result.messages)

    raw = yaml.safe_load(path.read_text())
    profile, errors = parse_profile(raw, str(path))
    assert errors == [] and profile is not None
    assert profile.kind == "measured" and profile.device_class == "x86_64-avx512"
    assert load_profile(path).name == "x86_64-avx512"

    planned, bf16 = a["arms"]["planned"], a["arms"]["bf16"]
    fmt = planned["plan"]["weight_format"]
    assert fmt == "w4a16"
    assert profile.formats[fmt].decode_tok_s.median == pytest.approx(planned["median"]["decode_tok_s"], abs=0.01)
    assert profile.formats[fmt].prefill_tok_s.passes == 3
    assert profile.formats["bf16"].decode_tok_s.median == pytest.approx(bf16["median"]["decode_tok_s"], abs=0.01)
    # the figures' sources carry the provenance and the weights they were measured with
    src = profile.formats[fmt].decode_tok_s.source
    assert src.artifact == result.path.name and src.edgectl_commit and src.vllm and src.torch
    assert src.model_weights_bytes == planned["plan"]["memory"]["weights_bytes"]
    assert profile.formats["bf16"].decode_tok_s.source.model_weights_bytes == bf16["plan"]["memory"]["weights_bytes"]
    # and the parameters a prompt token multiplies (planner/speed.py moves prefill figures by them)
    assert src.model_linear_params == inspect_model(model_dir).linear_params > 0
    peaks = [max(p["pss_peak_bytes"], p["pss_steady_bytes"]) / p["pss_steady_bytes"] for p in planned["passes"]]
    assert profile.load_peak_ratio.median == pytest.approx(stats.median(peaks), abs=1e-4)
    assert profile.load_peak_ratio.min >= 1.0
    assert profile.ready_s.passes == 3
    assert profile.reserve_frontend_core in (True, False) and "tok/s" in profile.reserve_evidence
    on, off = a["arms"]["reserve-core-on"], a["arms"]["reserve-core-off"]
    assert profile.reserve_frontend_core == (on["min"]["decode_tok_s"] > off["max"]["decode_tok_s"])

    # the planner now plans from it. The calibration itself: the configuration the per-process figure
    # was solved from is predicted exactly, by construction (up to the solved figure's rounding to whole
    # bytes) — this checks the solve round-trips through the profile and the planner, not the ledger.
    env = environ(tmp_path)
    # (the format named: from the recorded speeds the planner may pick another, a configuration not solved from)
    replan = make_plan(Request(model=str(model_dir), max_model_len=1024, weight_format=fmt), env, facts=facts).plan
    assert replan.profile == ProfileRef(name="x86_64-avx512", file=str(path), kind=ProfileKind.MEASURED)
    measured = planned["median"]["pss_steady_bytes"]
    assert abs(replan.memory.total_bytes - measured) <= 16
    assert replan.predicted.decode_tok_s is not None
    # Held out: the bf16 arm, measured in the same passes, is a configuration no figure was solved
    # from (another weight format); the ledger predicts it from the recorded figure within ±10%.
    # (The fake servers' memory does not grow with the weights and the tiny model's are small beside
    # a process: this checks the mechanism — a figure solved from one format carried to another, and
    # the check calling it held out — not the ledger's weight arithmetic, which the committed engine
    # runs measure: docs/facts.md, "Every recorded prediction error".)
    replan_bf16 = make_plan(Request(model=str(model_dir), max_model_len=1024, weight_format="bf16"), env,
                            facts=facts).plan
    arms = {"planned": {**planned, "plan": replan.to_dict()}, "bf16": {**bf16, "plan": replan_bf16.to_dict()}}
    check = memory_prediction(arms, result.path, roots=[result.path.parent])["arms"]
    assert check["planned"]["check"] == "calibration"
    assert check["bf16"]["check"] == "held_out"
    assert check["bf16"]["differs"]["runtime.process_bytes"] == {"weight_format": {"calibration": fmt, "here": "bf16"}}
    assert abs(check["bf16"]["error"]) <= 0.10


def test_formats_not_measured_are_carried_over_from_the_installed_profile(tmp_path, model_dir) -> None:
    facts = probe(str(HOSTS / "kvm-epyc-avx2-2c"), environ={})
    # the plan there compiles (compiled mode from the emulated AVX2 profile): a profile's formats are eager's
    result = bench(tmp_path, model_dir, facts, "planned,eager", passes=3, record_profile=True)
    a = result.to_dict()
    assert a["complete"]
    fmt = a["arms"]["planned"]["plan"]["weight_format"]
    profile = load_profile(tmp_path / "profiles" / "x86_64-avx2.yaml")
    assert profile.kind == "measured"
    # the shipped x86_64-avx2 profile says vLLM's int4 kernel does not run there: still said
    assert profile.formats["w4a16-vllm"].runs is False and "AVX2" in profile.formats["w4a16-vllm"].reason
    # and a format it records but edgectl does not serve is carried too, still apart from the formats
    assert profile.recorded_not_served["w4a8-amx"].runs is False and "w4a8-amx" not in profile.formats
    assert profile.match.isa_none == ("avx512f",)
    assert profile.formats[fmt].decode_tok_s.source.external is False
    eager = "planned" if a["arms"]["planned"]["plan"]["compilation"] == "eager" else "eager"
    assert profile.formats[fmt].decode_tok_s.median == pytest.approx(a["arms"][eager]["median"]["decode_tok_s"],
                                                                     abs=0.01)


def test_no_profile_is_recorded_from_an_incomplete_grid(tmp_path, model_dir) -> None:
    facts = probe(str(HOSTS / "kvm-xeon-avx512-2c"), environ={})
    result = bench(tmp_path, model_dir, facts, "planned", passes=3, record_profile=True,
                   options={"planned": ["--sabotage", "kv"]})
    assert not result.to_dict()["complete"]
    assert any("not recorded" in m for m in result.messages)
    assert not (tmp_path / "profiles" / "x86_64-avx512.yaml").exists()


def test_compiled_mode_is_recorded_beside_eager_and_the_planner_chooses_from_both(tmp_path, model_dir) -> None:
    facts = probe(str(HOSTS / "kvm-xeon-avx512-2c"), environ={})
    result = bench(tmp_path, model_dir, facts, "planned,compiled", passes=3, record_profile=True)
    a = result.to_dict()
    assert a["complete"], a["incomplete_reasons"]
    path = tmp_path / "profiles" / "x86_64-avx512.yaml"
    profile = load_profile(path)
    planned, compiled = a["arms"]["planned"], a["arms"]["compiled"]
    c = profile.compiled
    assert c is not None and c.weight_format == planned["plan"]["weight_format"]
    assert profile.compilation == "eager"  # the format figures are eager mode's
    assert profile.formats[c.weight_format].decode_tok_s.median == pytest.approx(planned["median"]["decode_tok_s"], abs=0.01)
    for figure, metric in ((c.decode_tok_s, "decode_tok_s"), (c.ready_cold_s, "ready_cold_s"),
                           (c.ready_warm_s, "ready_warm_s")):
        assert figure.median == pytest.approx(compiled["median"][metric], abs=0.06) and figure.passes == 3
    extra = [cp["pss_steady_bytes"] - ep["pss_steady_bytes"] for cp, ep in zip(compiled["passes"], planned["passes"])]
    assert c.extra_bytes.median == stats.median(extra)
    assert c.decode_tok_s.source.artifact == result.path.name

    # the planner chooses by the rule, from these figures
    env = environ(tmp_path)
    replan = make_plan(Request(model=str(model_dir), max_model_len=1024), env, facts=facts).plan
    faster = c.decode_tok_s.min > profile.formats[c.weight_format].decode_tok_s.max
    assert str(replan.compilation) == ("default" if faster else "eager")

    # a profile where compiled decodes faster: the plan is compiled, and recording again needs
    # the eager arm (the profile's format figures are eager mode's)
    raw = yaml.safe_load(path.read_text())
    raw["compiled"]["decode_tok_s"].update(median=1e6, min=1e6, max=1e6)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert str(make_plan(Request(model=str(model_dir), max_model_len=1024), env, facts=facts).plan.compilation) == "default"
    # refused before anything runs
    with pytest.raises(EdgectlError, match="add the `eager` arm"):
        bench(tmp_path, model_dir, facts, "planned", passes=3, record_profile=True)
    third = bench(tmp_path, model_dir, facts, "planned,eager", passes=3, record_profile=True)
    t = third.to_dict()
    assert t["complete"], t["incomplete_reasons"]
    recorded = load_profile(path)
    assert recorded.compilation == "eager"
    assert recorded.formats[c.weight_format].decode_tok_s.median == pytest.approx(
        t["arms"]["eager"]["median"]["decode_tok_s"], abs=0.01)
    assert recorded.compiled.ready_warm_s.median == pytest.approx(t["arms"]["planned"]["median"]["ready_warm_s"], abs=0.06)


def _arm(plan: dict, fmt: str, compilation: str, decode: float, pss: int) -> dict:
    passes = [{"decode_tok_s": decode + d, "prefill_tok_s": 100.0, "ready_cold_s": 90.0, "ready_warm_s": 18.0,
               "pss_steady_bytes": pss} for d in (-1.0, 0.0, 1.0)]
    return {"plan": {**plan, "weight_format": fmt, "compilation": compilation}, "description": f"{fmt} {compilation}",
            "passes": passes, "median": {"decode_tok_s": decode}, "launcher": "worker"}


def test_the_compiled_section_is_for_the_format_the_planner_will_pick() -> None:
    """Two formats measured in both modes: the compiled figures recorded are the fastest eager
    format's (w4a8 here), paired pass by pass with that format's eager arm."""
    import json

    from edgectl.bench.profile_record import _compiled

    plan = json.loads((REPO / "tests" / "fixtures" / "plans" / "deployed-w4a16.json").read_text())
    arms = {"planned": _arm(plan, "w4a16", "eager", 50.0, 900),
            "w4a8": _arm(plan, "w4a8", "eager", 65.0, 800),
            "compiled": _arm(plan, "w4a16", "default", 80.0, 1000),
            "w4a8-compiled": _arm(plan, "w4a8", "default", 95.0, 850)}
    sources: dict = {}
    out = _compiled(arms, {"w4a16": "planned", "w4a8": "w4a8"}, {}, sources, "2026-12-01")
    assert out is not None and out["weight_format"] == "w4a8"
    assert out["decode_tok_s"]["median"] == 95.0 and out["extra_bytes"]["median"] == 50
    assert "w4a8-compiled" in sources["bench-2026-12-01-w4a8-compiled"]["notes"]
    assert "cold_peak_ratio" not in out  # the passes carry no cold start's peak
    # with each pass's cold start (it compiled) peaking above the steady PSS: their ratio, per pass
    for p, peak in zip(arms["w4a8-compiled"]["passes"], (1000, 1100, 1275)):
        p["cold"] = {"pss_peak_bytes": peak}
    out = _compiled(arms, {"w4a16": "planned", "w4a8": "w4a8"}, {}, {}, "2026-12-01")
    assert out["cold_peak_ratio"] == {"median": round(1100 / 850, 4), "min": round(1000 / 850, 4),
                                      "max": 1.5, "passes": 3, "source": "bench-2026-12-01-w4a8-compiled"}
    # with w4a8 slower in eager mode, the w4a16 pair is recorded
    arms["w4a8"]["median"]["decode_tok_s"] = 40.0
    out = _compiled(arms, {"w4a16": "planned", "w4a8": "w4a8"}, {}, {}, "2026-12-01")
    assert out["weight_format"] == "w4a16" and out["extra_bytes"]["median"] == 100
    # no format measured compiled: no section
    assert _compiled({"planned": arms["planned"]}, {"w4a16": "planned"}, {}, {}, "2026-12-01") is None


def test_the_cpp_wrapper_is_recorded_beside_the_python_one_and_carried_over() -> None:
    """A run with the plan on inductor's C++ wrapper (``planned``) and the ``python-wrapper`` control: the
    compiled figures are the Python wrapper's (an arm on the C++ one is never taken for them), and
    ``compiled.cpp_wrapper`` holds both decodes, the C++ wrapper's first start and its compile-time peak;
    a run without the pair carries the installed profile's block over, its source with it."""
    import json

    from edgectl.bench.profile_record import _compiled, _compiled_section

    plan = json.loads((REPO / "tests" / "fixtures" / "plans" / "deployed-w4a16.json").read_text())
    cpp_plan = {**plan, "levers": {**plan["levers"], "cpp_wrapper": True}}
    arms = {"eager": _arm(plan, "w4a8", "eager", 60.0, 800),
            "planned": _arm(cpp_plan, "w4a8", "default", 110.0, 850),
            "python-wrapper": _arm(plan, "w4a8", "default", 100.0, 850)}
    for p, peak in zip(arms["planned"]["passes"], (1700, 1785, 1870)):
        p["cold"] = {"pss_peak_bytes": peak}
    out = _compiled(arms, {"w4a8": "eager"}, {}, {}, "2026-12-07")
    assert out is not None and out["decode_tok_s"]["median"] == 100.0  # python-wrapper's, not the plan's
    sources: dict = {}
    out = _compiled_section(arms, "eager", "w4a8", {"w4a8": {}}, {"cpu_model": "t"}, sources, "2026-12-07", {})
    cpp = out["cpp_wrapper"]
    assert cpp["decode_tok_s"]["median"] == 110.0 and cpp["control_decode_tok_s"]["median"] == 100.0
    assert cpp["ready_cold_s"]["median"] == 90.0
    assert cpp["cold_peak_ratio"]["median"] == round(1785 / 850, 4)
    assert "`planned`" in sources["bench-2026-12-07-cpp-wrapper"]["notes"]
    # no pair in this run: the installed profile's block comes along, with its source
    installed = {"sources": {"old": {"cpu_model": "t"}},
                 "compiled": {"weight_format": "w4a8", "cpp_wrapper": {**cpp, "decode_tok_s": {
                     **cpp["decode_tok_s"], "source": "old"}}}}
    del arms["python-wrapper"]
    sources = {}
    out = _compiled_section(arms, "eager", "w4a8", {"w4a8": {}}, {"cpu_model": "t"}, sources, "2026-12-08", installed)
    assert out is not None and out["cpp_wrapper"]["decode_tok_s"]["source"] == "old" and "old" in sources


def _wait_arm(wait: str | None, decodes: tuple[float, ...]) -> dict:
    passes = [{"status": "ok", "decode_tok_s": d, "effective": {"thread_wait": wait}} for d in decodes]
    return {"passes": passes, "median": {"decode_tok_s": sorted(decodes)[len(decodes) // 2]},
            "min": {"decode_tok_s": min(decodes)}, "max": {"decode_tok_s": max(decodes)}}


def test_the_way_of_waiting_is_recorded_only_where_it_beat_the_other_in_every_pass() -> None:
    """``threads.wait``: the plan's wait and a ``wait-*`` arm, each named by the wait the engine read back;
    recorded where one's whole decode range lies above the other's, with the figures; nothing where the
    ranges overlap, where an arm's passes disagree, or with one way measured."""
    from edgectl.bench.profile_record import _thread_wait

    arms = {"planned": _wait_arm("spin-short", (94.3, 105.1, 111.2)),
            "wait-spin": _wait_arm("spin", (116.9, 136.1, 138.2)),
            "llama.cpp-q4_0-t1": _wait_arm(None, (179.5, 178.6, 159.2))}
    out = _thread_wait(arms, "run.json")
    assert out is not None and out["wait"] == "spin"
    assert "spin 136.1 [116.9–138.2]" in out["wait_evidence"] and "run.json" in out["wait_evidence"]
    arms["planned"] = _wait_arm("spin-short", (94.3, 105.1, 120.0))  # overlapping: no decision
    assert _thread_wait(arms, "run.json") is None
    arms["planned"] = _wait_arm("spin-short", (94.3, 105.1, 111.2))
    arms["wait-spin"]["passes"][0]["effective"]["thread_wait"] = "spin-short"  # a pass that waited otherwise
    assert _thread_wait(arms, "run.json") is None
    assert _thread_wait({"planned": arms["planned"]}, "run.json") is None
