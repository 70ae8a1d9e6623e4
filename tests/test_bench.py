"""`edgectl bench`: the integrity rules, with real server processes that speak the bench's HTTP.

The servers here are ``tests/fake_server.py``, started as real processes on real ports,
each taking the real launcher's command line (the worker's plan file, vLLM's arguments,
llama-server's flags): they test the harness's rules — read-back checks, crashes, the
whole-tree memory, the prompts, the arithmetic, the artifact — not any measurement. Plans
come from the real planner on a captured host (tests/fixtures/hosts) and a model directory
written by the tests. Nothing here asserts a timing.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import pytest
from bench_helpers import HOST, bench, environ, fake_launchers, tiny_model
from models_helpers import REPO, run_cli

from edgectl.bench import measure, report
from edgectl.bench.arms import ARMS, DEFAULT_ARMS, cache_config_info, parse_arm_names
from edgectl.bench.core import BenchOptions, run_bench
from edgectl.bench.prompts import (
    DECODE_TOKENS,
    LONG_CONTEXT_TOKENS,
    PREFILL_TOKENS,
    long_context_tokens,
    prefill_token_ids,
    prompt_set,
)
from edgectl.bench.runner import interleaved
from edgectl.client import Stream
from edgectl.errors import EdgectlError
from edgectl.probe import probe


@pytest.fixture(scope="module")
def facts():
    return probe(str(HOST), environ={})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path)


def test_an_artifact_is_named_for_the_device_class_and_the_isa_it_was_held_to(tmp_path) -> None:
    assert report.class_label("x86_64-amx", {}) == "x86_64-amx"
    assert report.class_label("x86_64-amx", {"ATEN_CPU_CAPABILITY": "avx2"}) == "avx2-on-x86_64-amx"
    assert report.class_label("x86_64-amx", {"ATEN_CPU_CAPABILITY": "avx2", "EDGECTL_KERNEL_ISA": "avxvnni"}) \
        == "avxvnni-on-x86_64-amx"
    first = report.artifact_path(tmp_path, "2026-12-02", "x86_64-amx", "smollm2-135m")
    assert first.name == "2026-12-02-x86_64-amx-smollm2-135m.json"
    first.write_text("{}")
    assert report.artifact_path(tmp_path, "2026-12-02", "x86_64-amx", "smollm2-135m").name == \
        "2026-12-02-x86_64-amx-smollm2-135m-2.json"


# -- a complete grid ---------------------------------------------------------------------------------


def test_a_complete_grid_has_medians_ratios_and_a_full_artifact(tmp_path, model_dir, facts) -> None:
    result = bench(tmp_path, model_dir, facts, "stock,planned,llama.cpp", llama_threads="2")
    a = result.to_dict()
    assert a["schema"] == "edgectl.bench/1"
    assert a["complete"] is True and a["finished"] is True and a["incomplete_reasons"] == []
    # 3 passes, complete: quotable exactly when the noise gate passed every arm (the fake servers'
    # rates depend on this host's load, so which way it goes is not asserted here: test_bench_noise.py)
    assert set(a["noise"]["arms"]) == {"stock", "planned", "llama.cpp-t2"}
    assert a["quotable"] is a["noise"]["quiet"]
    # the artifact on disk is the result, named <date>-<device class>-<model>.json
    assert result.path is not None and result.path.parent == tmp_path / "results"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-x86_64-avx512-tiny-llama\.json", result.path.name), result.path.name
    assert json.loads(result.path.read_text()) == json.loads(json.dumps(a))
    prov = a["provenance"]
    for key in ("probe", "edgectl", "vllm", "torch", "command", "started_at", "ended_at", "model", "passes"):
        assert key in prov, key
    assert prov["probe"]["device_class"] == "x86_64-avx512"
    assert prov["command"] == "edgectl bench test"
    assert prov["environment"]["stock_VLLM_SERVER_DEV_MODE"] == "1"
    for name in ("stock", "planned", "llama.cpp-t2"):
        arm = a["arms"][name]
        assert [p["status"] for p in arm["passes"]] == ["ok"] * 3
        for key in ("decode_tok_s", "prefill_tok_s", "ready_s", "pss_steady_bytes", "pss_peak_bytes"):
            values = [p[key] for p in arm["passes"]]
            assert arm["median"][key] == sorted(values)[1]
            assert arm["min"][key] == min(values) and arm["max"][key] == max(values)
        for p in arm["passes"]:
            assert p["effective"]["max_model_len"] == 1024
            assert Path(p["log"]).is_file()
    # an edgectl worker's idle trim, read back again after the steady PSS (the planned arm's plan has it on)
    assert a["arms"]["planned"]["plan"]["levers"]["idle_trim"] is True
    assert [p["idle_trim"]["enabled"] for p in a["arms"]["planned"]["passes"]] == [True] * 3
    assert "idle_trim" not in a["arms"]["stock"]["passes"][0] and a["arms"]["stock"]["plan"]["levers"]["idle_trim"] is False
    # every arm runs the planned arm's context; stock carries its KV bytes exactly
    assert a["arms"]["stock"]["plan"]["kv_cache_bytes"] == a["arms"]["planned"]["plan"]["kv_cache_bytes"]
    assert a["arms"]["stock"]["passes"][0]["effective"]["kv_cache_bytes"] == a["arms"]["planned"]["plan"]["kv_cache_bytes"]
    # ratios: of medians, and pass by pass against the control's pass of the same round
    r = a["ratios"]
    assert set(r) == {"planned", "llama.cpp-t2"}
    for name in r:
        for m in report.RATIO_METRICS:
            assert r[name]["median"][m] == pytest.approx(a["arms"][name]["median"][m] / a["arms"]["stock"]["median"][m])
            for i in range(3):
                assert r[name]["passes"][i][m] == pytest.approx(
                    a["arms"][name]["passes"][i][m] / a["arms"]["stock"]["passes"][i][m])
    assert a["versus_llama_cpp"]["against"]["arm"] == "llama.cpp-t2"
    assert a["versus_llama_cpp"]["arms"]["planned"]["decode"] == pytest.approx(
        a["arms"]["planned"]["median"]["decode_tok_s"] / a["arms"]["llama.cpp-t2"]["median"]["decode_tok_s"])
    # fidelity against the bf16 reference (stock here: no bf16 arm); stock agrees with itself
    assert a["fidelity"]["reference_arm"] == "stock"
    assert a["arms"]["stock"]["median"]["top1_agreement"] == 1.0
    assert a["arms"]["stock"]["median"]["mean_kl"] == pytest.approx(0.0, abs=1e-9)
    assert a["arms"]["stock"]["median"]["perplexity"] > 1
    assert a["arms"]["llama.cpp-t2"]["passes"][0]["fidelity"]["over"] == "next token after each prompt"
    text = result.render_text()
    assert "complete" in text and "ratios to stock" in text and "INCOMPLETE" not in text


def test_the_passes_are_interleaved_and_every_pass_is_a_fresh_process(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned", passes=3).to_dict()
    runs = sorted((p["order"], p["arm"], p["pass"], p["pid"], p["port"])
                  for arm in a["arms"].values() for p in arm["passes"])
    assert [(arm, i) for _, arm, i, _, _ in runs] == interleaved(["stock", "planned"], 3)
    assert [(arm, i) for _, arm, i, _, _ in runs] == [("stock", 0), ("planned", 0), ("stock", 1), ("planned", 1),
                                                       ("stock", 2), ("planned", 2)]
    assert len({pid for *_, pid, _ in runs}) == 6
    assert a["provenance"]["order"] == ["stock#1", "planned#1", "stock#2", "planned#2", "stock#3", "planned#3"]


# -- integrity: a setting that does not take effect, a crash --------------------------------------


def test_a_setting_that_does_not_take_effect_makes_the_pass_invalid_and_the_grid_incomplete(
        tmp_path, model_dir, facts) -> None:
    result = bench(tmp_path, model_dir, facts, "stock,planned", options={"planned": ["--sabotage", "kv"]})
    a = result.to_dict()
    planned = a["arms"]["planned"]
    assert [p["status"] for p in planned["passes"]] == ["invalid"] * 3
    assert all(any("KV cache bytes" in x for x in p["problems"]) for p in planned["passes"])
    assert all("decode_tok_s" not in p for p in planned["passes"])  # nothing to quote
    assert planned["median"] is None
    assert a["complete"] is False and a["ratios"] is None
    assert any(r.startswith("planned pass 1: invalid: KV cache bytes") for r in a["incomplete_reasons"])
    text = result.render_text()
    assert "INCOMPLETE" in text and "no ratios" in text


def test_the_stock_arm_reads_its_kv_back_too(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned", passes=1, options={"stock": ["--sabotage", "kv"]}).to_dict()
    (p,) = a["arms"]["stock"]["passes"]
    assert p["status"] == "invalid" and any("KV cache bytes" in x for x in p["problems"])
    assert a["complete"] is False and a["ratios"] is None


def test_a_crashed_pass_makes_the_grid_incomplete_with_no_ratios(tmp_path, model_dir, facts) -> None:
    state = tmp_path / "starts"
    result = bench(tmp_path, model_dir, facts, "stock,planned",
                   options={"planned": ["--crash-on-start", "2", "--state", str(state)]})
    a = result.to_dict()
    statuses = [p["status"] for p in a["arms"]["planned"]["passes"]]
    assert statuses == ["ok", "crashed", "ok"]
    crashed = a["arms"]["planned"]["passes"][1]
    assert "exited with code 1" in crashed["error"] and crashed["exit_code"] == 1
    assert any("crashing on start 2" in line for line in crashed["log_tail"])
    # the two good passes of the arm are not summarised, and nothing is divided
    assert a["arms"]["planned"]["median"] is None
    assert a["arms"]["stock"]["median"] is not None
    assert a["complete"] is False and a["ratios"] is None and a["versus_llama_cpp"] is None
    assert "planned pass 2: crashed" in result.render_text()


def test_a_server_that_cannot_even_start_is_a_crashed_pass(tmp_path, model_dir, facts) -> None:
    opts = BenchOptions(model=str(model_dir), arms="planned", passes=1, out=tmp_path / "results", max_model_len=1024)
    a = run_bench(opts, environ(tmp_path), lambda line: None, facts=facts,
                  launchers={"worker": lambda arm, port, d: [str(tmp_path / "no-such-binary")]}).to_dict()
    (p,) = a["arms"]["planned"]["passes"]
    assert p["status"] == "crashed" and "cannot start" in p["error"]
    assert a["complete"] is False


# -- memory: the whole tree ------------------------------------------------------------------------


def test_pss_is_taken_from_the_whole_server_tree(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock", passes=1, options={"stock": ["--child-alloc-mb", "200"]}).to_dict()
    assert a["complete"] and not a["quotable"]  # one pass: indicative only
    (p,) = a["arms"]["stock"]["passes"]
    assert p["status"] == "ok"
    assert p["processes"] == 2
    parent, child = sorted(p["process_tree"], key=lambda m: m["pss_bytes"])
    assert parent["pid"] == p["pid"]
    assert child["pss_bytes"] >= 200 * 10**6 > parent["pss_bytes"]
    assert p["pss_steady_bytes"] == parent["pss_bytes"] + child["pss_bytes"]
    assert p["pss_peak_bytes"] >= 200 * 10**6


def test_a_single_process_plan_served_by_two_processes_is_invalid(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "planned", passes=1, options={"planned": ["--child-alloc-mb", "1"]}).to_dict()
    (p,) = a["arms"]["planned"]["passes"]
    assert p["status"] == "invalid"
    assert any("single-process topology has 1" in x for x in p["problems"])


# -- prompts ---------------------------------------------------------------------------------------


def test_prefill_prompts_never_repeat_across_passes_or_arms(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned,llama.cpp", passes=3, llama_threads="2").to_dict()
    digests = [p["prefill_prompt"]["digest"] for arm in a["arms"].values() for p in arm["passes"]]
    assert len(digests) == 9 and len(set(digests)) == 9
    # the rule itself, over a larger grid: no two passes share even their first KV block (128 tokens)
    orders = range(len(ARMS) * 10)
    prompts = [prefill_token_ids(0, o, 49152) for o in orders]
    assert all(len(p) == PREFILL_TOKENS for p in prompts)
    assert len({tuple(p[:128]) for p in prompts}) == len(prompts)
    assert prefill_token_ids(0, 5, 49152) == prefill_token_ids(0, 5, 49152)  # reproducible
    assert prefill_token_ids(1, 5, 49152) != prefill_token_ids(0, 5, 49152)  # and seeded
    assert all(256 <= t < 4096 for t in prefill_token_ids(0, 1, 4096))


def test_decode_at_a_long_context_has_its_own_fresh_prompt_in_every_pass(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "stock,planned", passes=2).to_dict()
    passes = [p for arm in a["arms"].values() for p in arm["passes"]]
    # the helper's context is 1024 tokens: the long prompt leaves room for the decode's tokens
    assert {p["decode_long"]["context_tokens"] for p in passes} == {1024 - DECODE_TOKENS - 1}
    assert all(p["decode_long_tok_s"] > 0 and p["decode_long"]["tokens"] == DECODE_TOKENS for p in passes)
    digests = [p["decode_long"]["digest"] for p in passes] + [p["prefill_prompt"]["digest"] for p in passes]
    assert len(set(digests)) == len(digests) == 8
    assert a["arms"]["planned"]["median"]["decode_long_tok_s"] > 0
    assert a["ratios"]["planned"]["median"]["decode_long_tok_s"] > 0
    assert "decode @895 tok/s" in report.render_text(a, None, [])
    # the length: LONG_CONTEXT_TOKENS where the context has room, none where it is no longer than prefill's
    assert long_context_tokens(4096) == LONG_CONTEXT_TOKENS
    assert long_context_tokens(PREFILL_TOKENS + DECODE_TOKENS + 1) == 0
    assert prefill_token_ids(0, 3, 49152, 600, purpose="long-context")[:PREFILL_TOKENS] != prefill_token_ids(0, 3, 49152)


def test_the_int4_head_arm_is_skipped_where_the_plan_already_quantizes_its_head(tmp_path, model_dir, facts) -> None:
    from types import SimpleNamespace

    from edgectl.bench.arms import _unavailable

    # the stand-in's plan is an int4-family one (w4a16): there the arm holds the head in int4
    a = bench(tmp_path, model_dir, facts, "planned,lm-head-int4", passes=1).to_dict()
    assert (a["arms"]["planned"]["plan"]["weight_format"], a["arms"]["planned"]["plan"]["quantize_lm_head"]) == (
        "w4a16", False)
    assert a["arms"]["lm-head-int4"]["plan"]["quantize_lm_head"] is True and not a.get("skipped")
    # beside edgectl's layers the quantized head is their 8-bit blocks, the plan's own: the arm would repeat it
    for fmt, head in (("w4a8", "int8"), ("w8a8", "int8")):
        ctx = SimpleNamespace(planned=SimpleNamespace(weight_format=fmt, lm_head_format=head), variants={},
                              launchers={})
        assert "already holds its output head in edgectl's 8-bit blocks" in _unavailable(ARMS["lm-head-int4"], ctx)
    ctx = SimpleNamespace(planned=SimpleNamespace(weight_format="w4a16", lm_head_format="dense"), variants={},
                          launchers={})
    assert _unavailable(ARMS["lm-head-int4"], ctx) is None


class _OneStream:
    """A client whose one stream is ``chunks`` (test double of edgectl.client.Client.stream)."""

    def __init__(self, chunks: list[dict]) -> None:
        self.chunks = chunks

    def stream(self, path: str, body: dict, timeout: float = 600.0) -> Stream:
        return Stream(t_sent=0.0, chunks=[(0.5 + i * 0.01, c) for i, c in enumerate(self.chunks)])


def _decode_chunks(prompt_tokens: int, **usage) -> list[dict]:
    tokens = [{"choices": [{"text": "x"}]} for _ in range(DECODE_TOKENS)]
    return [*tokens, {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": DECODE_TOKENS, **usage}}]


def test_decode_after_token_ids_refuses_a_short_count_or_a_cached_prompt() -> None:
    ids = list(range(300, 1300))
    d = measure.decode(_OneStream(_decode_chunks(1000)), "m", ids)
    assert d["decode_tok_s"] == pytest.approx((DECODE_TOKENS - 1) / ((DECODE_TOKENS - 1) * 0.01))
    assert "after 1000 fresh random token ids" in d["method"]
    with pytest.raises(measure.MeasurementFailed, match="counted 999 prompt tokens of the decode prompt, 1000"):
        measure.decode(_OneStream(_decode_chunks(999)), "m", ids)
    with pytest.raises(measure.MeasurementFailed, match="640 of the 1000 prompt tokens came from the prefix cache"):
        measure.decode(_OneStream(_decode_chunks(1000, prompt_tokens_details={"cached_tokens": 640})), "m", ids)
    # a text prompt is counted by the server's tokenizer: neither check applies
    assert measure.decode(_OneStream(_decode_chunks(7)), "m", "Once upon a time")["decode_tok_s"] > 0


def test_the_shipped_prompt_set_loads() -> None:
    ps = prompt_set()
    assert len(ps.prompts) >= 16 and len(set(ps.prompts)) == len(ps.prompts)
    assert len(ps.perplexity_text.split()) > 80 and ps.decode_prompt


def test_plot_writes_a_png_next_to_the_json_or_says_why_not(tmp_path, model_dir, facts) -> None:
    result = bench(tmp_path, model_dir, facts, "stock,planned", passes=1, plot=True)
    png = result.path.with_suffix(".png")
    try:
        import matplotlib  # noqa: F401  (not a dependency of edgectl)
    except ImportError:
        assert not png.exists()
        assert any("matplotlib is not installed" in m for m in result.messages)
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plot: {png}" in result.messages


# -- small pieces --------------------------------------------------------------------------------------


def test_arm_names() -> None:
    assert parse_arm_names(None) == list(DEFAULT_ARMS)
    assert parse_arm_names("all") == list(ARMS)
    assert parse_arm_names("planned, stock") == ["planned", "stock"]
    with pytest.raises(EdgectlError, match="unknown arm"):
        parse_arm_names("stock,nope")
    with pytest.raises(EdgectlError, match="given twice"):
        parse_arm_names("stock,stock")


def test_bench_help_lists_every_arm_of_the_table() -> None:
    done = run_cli(["bench", "--help"], env={"COLUMNS": "400"}, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if "--arms" in ln)
    # the option's row, and the rows its text wraps onto (indented, no option name of their own)
    rows = [lines[first]] + list(itertools.takewhile(lambda ln: re.match(r"│\s{5,}[^\s-]", ln), lines[first + 1:]))
    line = " ".join(row.strip(" │") for row in rows)
    assert f"(default {','.join(DEFAULT_ARMS)}; `all` for every one): " in line
    listed = line.split("`all` for every one): ", 1)[1].removesuffix(".")
    names = listed.split(", ")
    assert names == list(ARMS), listed
    assert {"w4a8", "w4a8-compiled"} <= set(names)  # the two the hand-written list had left out


def test_llama_server_is_found_in_the_build_cache_or_on_path_or_explained(tmp_path) -> None:
    import os
    import stat
    import tarfile

    from edgectl.llamacpp import _extract_vendor, find_llama_server

    env = {"EDGECTL_MODEL_CACHE": str(tmp_path / "edgectl" / "models"), "PATH": str(tmp_path / "bin")}
    missing = find_llama_server(env)
    assert missing.path is None and "--build-llama-cpp" in missing.origin
    (tmp_path / "bin").mkdir()
    on_path = tmp_path / "bin" / "llama-server"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(on_path.stat().st_mode | stat.S_IXUSR)
    assert find_llama_server(env).path == str(on_path)
    built = tmp_path / "edgectl" / "llama.cpp" / "0.3.36" / "bin" / "llama-server"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    assert find_llama_server(env) == type(missing)(str(built), "cache (0.3.36)")
    # a native build is used only on a CPU that has every ISA extension of the one that built it
    host = ["fpu", "sse2", "avx", "avx2", "fma", "avx512f", "hypervisor"]
    passed = find_llama_server(env, host_flags=host)
    assert passed.path == str(on_path) and "built before edgectl recorded the building CPU" not in passed.origin
    (built.parent.parent / "CPU_FLAGS").write_text("sse2 avx avx2 fma avx512f avx512_vnni amx_tile\n")
    assert find_llama_server(env, host_flags=host).path == str(on_path)  # the cache is passed over
    on_path.unlink()
    refused = find_llama_server(env, host_flags=host)
    assert refused.path is None and "amx_tile, avx512_vnni, which this one lacks" in refused.origin
    assert find_llama_server(env, host_flags=[*host, "avx512_vnni", "amx_tile", "rtm"]).path == str(built)
    with pytest.raises(EdgectlError, match="not an executable"):
        find_llama_server(env, str(tmp_path / "nope"))
    # a run held to AVX2 takes only a build held to AVX2, and a run on the CPU's own ISA never takes one
    held_run = find_llama_server(env, host_flags=[*host, "avx512_vnni", "amx_tile"], held_to="avx2")
    assert held_run.path is None and "--llama-cpp-isa avx2" in held_run.origin
    assert "0.3.36: built for this CPU's own ISA" in held_run.origin
    held_build = tmp_path / "edgectl" / "llama.cpp" / "0.3.36-avx2" / "bin" / "llama-server"
    held_build.parent.mkdir(parents=True)
    held_build.write_text("#!/bin/sh\n")
    held_build.chmod(0o755)
    (held_build.parent.parent / "CPU_FLAGS").write_text("sse2 avx avx2 fma\n")
    assert find_llama_server(env, host_flags=[*host, "avx512_vnni", "amx_tile"], held_to="avx2") == \
        type(missing)(str(held_build), "cache (0.3.36-avx2)")
    assert find_llama_server(env, host_flags=[*host, "avx512_vnni", "amx_tile"]).path == str(built)
    os.utime(built.parent.parent / "CPU_FLAGS")
    held_build.touch()  # the newest build, and still not taken by a run on the CPU's own ISA
    assert find_llama_server(env, host_flags=[*host, "avx512_vnni", "amx_tile"]).path == str(built)
    # a source archive member escaping the extraction directory is refused
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        info = tarfile.TarInfo("pkg-1/vendor/llama.cpp/../../../escape")
        tar.addfile(info, None)
    with pytest.raises(EdgectlError, match="refusing to extract"):
        _extract_vendor(bad, tmp_path / "x")
    assert not (tmp_path / "escape").exists() and not os.path.exists(tmp_path / "x" / "escape")


def test_cache_config_info_parses_vllm_metrics() -> None:
    text = ('# HELP x\nvllm:num_requests_running{engine="0"} 0.0\n'
            'vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="17",sliding_window="None"} 1.0\n')
    assert cache_config_info(text) == {"block_size": "128", "engine": "0", "num_gpu_blocks": "17",
                                       "sliding_window": "None"}
    assert cache_config_info("nothing here") == {}


def test_ratio_math_by_hand() -> None:
    def rec(i, d, p):
        return {"status": "ok", "pass": i, "decode_tok_s": d, "prefill_tok_s": p, "ready_s": 10.0,
                "pss_steady_bytes": 1000, "pss_peak_bytes": 1100, "load_peak_ratio": 1.1, "processes": 1}

    records = {"stock": [rec(0, 10.0, 30.0), rec(1, 12.0, 36.0), rec(2, 11.0, 33.0)],
               "planned": [rec(0, 20.0, 60.0), rec(1, 30.0, 72.0), rec(2, 22.0, 66.0)]}
    summaries = {n: report.summarise_arm(r) for n, r in records.items()}
    assert summaries["stock"]["median"]["decode_tok_s"] == 11.0
    r = report.ratios(records, summaries)["planned"]
    assert r["median"]["decode_tok_s"] == pytest.approx(22.0 / 11.0)
    assert [x["decode_tok_s"] for x in r["passes"]] == pytest.approx([2.0, 2.5, 2.0])
    assert [x["prefill_tok_s"] for x in r["passes"]] == pytest.approx([2.0, 2.0, 2.0])
    assert r["median"]["pss_steady_bytes"] == 1.0


def test_a_context_without_room_for_the_prefill_prompt_is_refused(tmp_path, model_dir, facts) -> None:
    opts = BenchOptions(model=str(model_dir), arms="planned", passes=1, out=tmp_path / "results", max_model_len=512)
    with pytest.raises(EdgectlError, match="no room for the 512-token prefill prompt.*--max-model-len 1024"):
        run_bench(opts, environ(tmp_path), lambda line: None, facts=facts, launchers=fake_launchers())
    assert not (tmp_path / "results").exists()


def test_the_bench_control_plane_imports_neither_torch_nor_vllm() -> None:
    import subprocess

    code = ("import sys, edgectl.cli, edgectl.bench.core, edgectl.bench.profile_record, edgectl.llamacpp; "
            "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'numpy')])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": f"{REPO}:{REPO / 'runtime'}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path) -> None:
    out = tmp_path / "results"
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path / "cache"), "EDGECTL_PROFILES_DIR": str(tmp_path / "profiles")}
    for args, message in [
        (["bench", "smollm2-135m", "--arms", "stock,nope", "--out", str(out)], "unknown arm(s) nope"),
        (["bench", "smollm2-135m", "--record-profile", "--passes", "1", "--out", str(out)], "at least 3 passes"),
        (["bench", "smollm2-135m", "--arms", "stock", "--record-profile", "--out", str(out)], "needs the `planned` arm"),
        (["bench", "smollm2-135m", "--passes", "0", "--out", str(out)], "--passes 0"),
        (["bench", "smollm2-135m", "--out", str(out)], "not pulled"),
        (["bench"], "give the MODEL"),
        (["bench", "smollm2-135m", "--llama-cpp-isa", "avx2", "--out", str(out)], "goes with --build-llama-cpp"),
        (["bench", "--build-llama-cpp", "--llama-cpp-isa", "sse2"], "--llama-cpp-isa sse2: use avx2"),
    ]:
        done = run_cli(args, env=env, timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and message in lines[-1], (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not out.exists() and not (tmp_path / "profiles").exists()


def test_the_stock_arm_with_the_plans_threads(tmp_path, model_dir, facts) -> None:
    """`stock` runs vLLM's own threading (one OpenMP thread on 2 cores); `stock-threads` the plan's."""
    a = bench(tmp_path, model_dir, facts, "stock,stock-threads,planned").to_dict()
    planned = a["arms"]["planned"]["plan"]["threads"]
    assert planned == 2
    assert [p["effective"]["threads"] for p in a["arms"]["stock"]["passes"]] == [1] * 3
    arm = a["arms"]["stock-threads"]
    assert [p["status"] for p in arm["passes"]] == ["ok"] * 3
    assert [p["effective"]["threads"] for p in arm["passes"]] == [planned] * 3
    assert arm["plan"]["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


# -- int4 groups ------------------------------------------------------------------------------------


def test_the_group_arms_run_w4a16_at_their_group_and_read_it_back_per_layer(tmp_path, model_dir, facts) -> None:
    """The tiny model's K are 64 (qkv, o_proj) and 128 (down_proj): groups of 128 apply to down_proj
    only, the others take 64 (int4_layout.choose_group_size)."""
    a = bench(tmp_path, model_dir, facts, "w4a16-g64,w4a16-g128", passes=1).to_dict()
    assert a["complete"] is True, a["incomplete_reasons"]
    plans = {n: a["arms"][n]["plan"] for n in ("w4a16-g64", "w4a16-g128")}
    assert {n: (p["weight_format"], p["group_size"]) for n, p in plans.items()} == {
        "w4a16-g64": ("w4a16", 64), "w4a16-g128": ("w4a16", 128)}
    # more groups, more scale bytes: the planner sizes each arm's weights by its own group
    assert plans["w4a16-g64"]["memory"]["weights_bytes"] > plans["w4a16-g128"]["memory"]["weights_bytes"]
    for name, want in (("w4a16-g64", {64: 64, 128: 64}), ("w4a16-g128", {64: 64, 128: 128})):
        (p,) = a["arms"][name]["passes"]
        assert p["status"] == "ok", p.get("problems")
        eff = p["effective"]
        body = {n: f for n, f in eff["linear_formats"].items() if n != "lm_head"}
        assert {n: f"cpu_int4/g{want[eff['linear_in_features'][n]]}" for n in body} == body


def test_a_group_that_did_not_take_effect_makes_the_pass_invalid(tmp_path, model_dir, facts) -> None:
    a = bench(tmp_path, model_dir, facts, "w4a16-g128", passes=1,
              options={"w4a16-g128": ["--sabotage", "group"]}).to_dict()
    (p,) = a["arms"]["w4a16-g128"]["passes"]
    assert p["status"] == "invalid"
    assert any("differ in group size" in x and "group size 128" in x for x in p["problems"]), p["problems"]
    assert a["complete"] is False


def test_only_formats_with_a_group_have_group_arms() -> None:
    """edgectl's w4a8 blocks are 32 columns by their layout: no arm claims another size for them."""
    grouped = {n: a.overrides for n, a in ARMS.items() if "group_size" in a.overrides}
    assert set(grouped) == {"w4a16-g64", "w4a16-g128"}
    assert all(o.get("weight_format") == "w4a16" for o in grouped.values())


@pytest.mark.runtime
def test_an_isa_held_down_is_recorded_and_said() -> None:
    """The servers' PyTorch ISA goes into the artifact; an AVX2 path forced on a wider CPU is
    named in the report as emulated (the AVX2 tier's environment, tests/isa_avx2)."""
    import os

    from installed import RUNTIME_PYTHON

    from edgectl.bench import provenance

    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    native = provenance.runtime_info(RUNTIME_PYTHON, env)["isa"]
    assert "ATEN_CPU_CAPABILITY" not in native and native["torch_cpu_capability"] in ("DEFAULT", "AVX2", "AVX512")
    held = provenance.runtime_info(RUNTIME_PYTHON, {**env, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                                    "PYTHONPATH": str(REPO / "tests" / "isa_avx2")})["isa"]
    assert held["torch_cpu_capability"] == "AVX2" and held["torch_avx512_supported"] is False
    assert held["ATEN_CPU_CAPABILITY"] == "avx2"
    a = {"provenance": {"model": "m", "passes": 3, "max_model_len": 1024, "runtime_isa": held,
                        "probe": {"device_class": "x86_64-amx"}}, "arms": {}, "complete": False, "fidelity": {},
         "incomplete_reasons": ["no arm ran"]}
    text = report.render_text(a, None, [])
    assert "ISA held down: the servers' PyTorch ran at AVX2" in text and "x86_64-amx host" in text
    assert "vLLM was not held" not in text
    # without tests/isa_avx2, PyTorch is held but vLLM picks its library from cpuid
    half = provenance.runtime_info(RUNTIME_PYTHON, {**env, "ATEN_CPU_CAPABILITY": "avx2"})["isa"]
    a["provenance"]["runtime_isa"] = half
    text = report.render_text(a, None, [])
    assert "ISA held down: the servers' PyTorch ran at AVX2" in text  # on every host
    if half["torch_avx512_supported"]:
        # an AVX-512 CPU: vLLM still loads its AVX-512 library and attention, and the report says so
        assert "but vLLM was not held" in text
    else:
        # no AVX-512 in this CPU: vLLM has no wider code to pick, so there is nothing to warn of
        assert "but vLLM was not held" not in text
    a["provenance"]["runtime_isa"] = native
    assert "ISA held down" not in report.render_text(a, None, [])


def test_llama_cpp_is_built_for_this_cpu_without_amx() -> None:
    from edgectl.llamacpp import isa_options

    amx_box = "fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8".split()
    opts = isa_options(amx_box)
    assert "-DGGML_NATIVE=OFF" in opts and "-DGGML_AVX512_VNNI=ON" in opts and "-DGGML_AVX512_BF16=ON" in opts
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(opts)
    assert not any(o.startswith("-DGGML_AMX") and o.endswith("=ON") for o in opts)
    avx2_box = isa_options("fpu sse4_2 avx avx2 fma f16c bmi2".split())
    assert "-DGGML_AVX2=ON" in avx2_box and "-DGGML_AVX512=OFF" in avx2_box and "-DGGML_AVX_VNNI=OFF" in avx2_box
    assert isa_options("fp asimd sve".split()) == ["-DGGML_NATIVE=ON"]  # Arm: the compiler's native choice


def test_a_build_held_to_avx2_leaves_out_every_extension_above_it() -> None:
    from edgectl.llamacpp import held_flags, isa_options

    amx_box = "fpu sse4_2 avx avx2 fma f16c bmi2 avx_vnni avx512f avx512vbmi avx512_vnni avx512_bf16 amx_tile".split()
    held = held_flags(amx_box, "avx2")
    assert held == "fpu sse4_2 avx avx2 fma f16c bmi2".split()
    opts = isa_options(held)
    assert "-DGGML_AVX2=ON" in opts and "-DGGML_FMA=ON" in opts
    assert not any(o.endswith("=ON") for o in opts if "AVX512" in o or "VNNI" in o or "AMX" in o), opts
    assert held_flags(amx_box, None) == amx_box and held_flags(amx_box, "avx512") == amx_box


def test_a_build_held_to_avx_vnni_keeps_that_one_extension() -> None:
    """An AVX2 box with AVX-VNNI (an N100): the run held so (ATEN_CPU_CAPABILITY=avx2 with
    EDGECTL_KERNEL_ISA=avxvnni) compares against llama.cpp built with GGML_AVX_VNNI and nothing above."""
    from edgectl.llamacpp import held_flags, held_isa, isa_options

    amx_box = "fpu sse4_2 avx avx2 fma f16c bmi2 avx_vnni avx512f avx512vbmi avx512_vnni avx512_bf16 amx_tile".split()
    held = held_flags(amx_box, "avxvnni")
    assert held == "fpu sse4_2 avx avx2 fma f16c bmi2 avx_vnni".split()
    opts = isa_options(held)
    assert "-DGGML_AVX_VNNI=ON" in opts and "-DGGML_AVX512=OFF" in opts and "-DGGML_AVX512_VNNI=OFF" in opts
    assert held_isa({}) is None and held_isa({"EDGECTL_KERNEL_ISA": "avxvnni"}) is None
    assert held_isa({"ATEN_CPU_CAPABILITY": "avx2"}) == "avx2"
    assert held_isa({"ATEN_CPU_CAPABILITY": "avx2", "EDGECTL_KERNEL_ISA": "avx2"}) == "avx2"
    assert held_isa({"ATEN_CPU_CAPABILITY": "avx2", "EDGECTL_KERNEL_ISA": "avxvnni"}) == "avxvnni"
