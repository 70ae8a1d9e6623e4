"""`edgectl plan` as a user runs it (a subprocess): the JSON contract (edgectl.plan/1), exit codes
and one-line errors; plan() is pure; a probe taken on another host plans the same as its facts;
and the plan for this machine, from the pulled model or from the catalog before the pull.

The CLI plans with the SHIPPED profiles (profiles/), which are re-recorded from benchmarks and grow
with new device classes: what it prints is compared with plan() over ``shipped_profiles()`` in
process, never with numbers worked out for today's profiles. The worked numbers are in
test_plan_table.py and test_plan_context.py (over the frozen copies)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from models_helpers import SHAPES, run_cli
from plan_helpers import (
    QWEN3_17B,
    SMOLLM2,
    host_facts,
    make_plan,
    plan_cli,
    reasons_by_decision,
    shape,
    shipped_profiles,
    write_facts,
    write_profile,
)
from probe_helpers import FIXTURE_NAMES

from edgectl.errors import EdgectlError
from edgectl.inputs import render_plan
from edgectl.models.inspect import inspect_model
from edgectl.probe import HostFacts, probe
from edgectl.profiles import select_profile

# ---- the JSON contract (edgectl/contract/plan.py: every field, units in the names) -----------------

TOP = {
    "schema": str, "model": dict, "device_class": str, "profile": dict, "weight_format": str, "group_size": int,
    "quantize_lm_head": bool, "max_model_len": int, "max_num_seqs": int, "max_num_batched_tokens": int,
    "kv_cache_bytes": int, "kv_bytes_per_token": int, "kv_cache_dtype": str, "block_size": int, "rope_rows": int, "threads": int,
    "cpus": list, "topology": str, "compilation": str, "levers": dict, "memory": dict, "predicted": dict,
    "serve": dict, "timeouts": dict, "env": dict, "reasons": list, "request": dict,
}
MODEL = {"name", "path", "architecture", "checkpoint_format"}
PROFILE = {"name", "file", "kind"}
LEVERS = {"rope_cap", "kv_exact", "layerwise_repack", "topology", "reserve_frontend_core", "embedding_pack",
          "optional_imports", "python_optimize", "tokenizer", "idle_trim", "thread_wait", "huge_pages", "decode_attention",
          "lean_attention", "cpp_wrapper"}
MEMORY = {"weights_bytes", "kv_cache_bytes", "rope_bytes", "runtime_bytes", "workspace_bytes", "total_bytes",
          "high_bytes", "limit_bytes"}
PREDICTED = {"decode_tok_s", "prefill_tok_s", "ready_s", "measured_on"}
SERVE = {"name", "host", "port"}
TIMEOUTS = {"start_s", "watchdog_s", "stop_s"}
SOURCES = {"profile", "model-config", "flag", "probe", "default", "fallback"}


def check_plan_json(d: dict) -> None:
    assert set(d) == set(TOP), set(d) ^ set(TOP)
    for key, kind in TOP.items():
        assert isinstance(d[key], kind) and not (kind is int and isinstance(d[key], bool)), (key, d[key])
    assert d["schema"] == "edgectl.plan/1"
    assert set(d["model"]) == MODEL and d["model"]["checkpoint_format"] in ("bf16", "cpu_int4", "gptq", "awq", "gguf")
    assert set(d["profile"]) == PROFILE and d["profile"]["kind"] in ("measured", "external", "fallback")
    assert d["weight_format"] in ("w4a16", "w4a8", "w4a16-vllm", "bf16")
    assert d["topology"] in ("single-process", "stock") and d["compilation"] in ("eager", "default")
    assert set(d["levers"]) == LEVERS
    assert set(d["memory"]) == MEMORY and all(isinstance(v, int) for v in d["memory"].values())
    assert set(d["predicted"]) == PREDICTED
    assert all(v is None or isinstance(v, float | int) for k, v in d["predicted"].items() if k != "measured_on")
    assert d["predicted"]["measured_on"] is None or isinstance(d["predicted"]["measured_on"], str)
    assert set(d["serve"]) == SERVE and set(d["timeouts"]) == TIMEOUTS
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in d["env"].items())
    assert "VLLM_CPU_OMP_THREADS_BIND" in d["env"]
    assert all(isinstance(c, int) for c in d["cpus"]) and d["threads"] <= len(d["cpus"])
    for r in d["reasons"]:
        assert set(r) == {"decision", "value", "source", "detail"} and r["source"] in SOURCES, r
    assert {"model", "max_model_len", "max_num_seqs"} <= set(d["request"])
    # the ledger adds up, and the KV / RoPE fields agree with the ledger
    m = d["memory"]
    assert m["total_bytes"] == sum(m[k] for k in ("weights_bytes", "kv_cache_bytes", "rope_bytes", "runtime_bytes",
                                                  "workspace_bytes"))
    assert m["total_bytes"] <= m["high_bytes"] <= m["limit_bytes"]
    assert d["kv_cache_bytes"] == m["kv_cache_bytes"]


def test_plan_json_has_every_field_and_equals_the_plan_of_the_facts(tmp_path: Path):
    facts = host_facts("kvm-epyc-avx2-2c")
    model_dir = SHAPES / SMOLLM2
    done = plan_cli([str(model_dir), "--facts", str(write_facts(facts, tmp_path)), "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    d = json.loads(done.stdout)
    check_plan_json(d)
    # a probe of another host, read back from JSON, plans exactly as its facts do in-process
    assert d == make_plan(facts, inspect_model(model_dir), shipped_profiles(), spec=str(model_dir)).to_dict()


def test_plan_text_names_the_decisions(tmp_path: Path):
    facts = host_facts("kvm-xeon-avx512-2c")
    done = plan_cli([str(SHAPES / SMOLLM2), "--facts", str(write_facts(facts, tmp_path))], tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # the profile the shipped set selects for this host, whichever that is today
    profile, _ = select_profile(list(shipped_profiles()), facts)
    assert out.startswith(f"plan for smollm2-135m on x86_64-avx512 (profile {profile.name}, {profile.kind})\n")
    p = make_plan(facts, shape(SMOLLM2), shipped_profiles())
    assert out == render_plan(p) + "\n"  # the text of the very plan, nothing lost or added on the way
    groups = f", int4 groups of {p.group_size}" if p.weight_format != "bf16" else ""
    assert f"\n  weights     {p.weight_format}{groups}\n" in out
    assert f"\n  context     {p.max_model_len} tokens × 1 sequence(s); RoPE rows {p.max_model_len}\n" in out
    assert ("nobody has measured this class" in out) == (profile.kind == "fallback")


@pytest.mark.parametrize("host", FIXTURE_NAMES)
def test_facts_read_back_from_json_plan_the_same(host: str):
    facts = host_facts(host)
    again = HostFacts.from_dict(json.loads(json.dumps(facts.to_dict())))
    model = shape(SMOLLM2)
    assert make_plan(again, model).to_dict() == make_plan(facts, model).to_dict()


def test_plan_is_pure():
    facts, model = host_facts("xeon-spr-amx-2s"), shape(QWEN3_17B)
    first = make_plan(facts, model).to_dict()
    assert make_plan(facts, model).to_dict() == first
    # and planning something else in between changes nothing (no state kept)
    make_plan(host_facts("arm64-board"), shape(SMOLLM2), max_num_seqs=3)
    assert make_plan(facts, model).to_dict() == first
    assert json.loads(json.dumps(first)) == first  # plain JSON values only


def test_the_facts_of_this_host_from_another_root_do_not_leak(tmp_path: Path):
    # --facts wins over the probe of this machine: the plan is the fixture's (2 usable CPUs 2-3)
    facts = host_facts("container-cgroup2")
    done = plan_cli([str(SHAPES / SMOLLM2), "--facts", str(write_facts(facts, tmp_path)), "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cpus"] == [2, 3]


# ---- refusals: exit 2, one line, nothing else ------------------------------------------------------


def _one_error_line(done) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_unknown_model_name(tmp_path: Path):
    line = _one_error_line(plan_cli(["no-such-model"], tmp_path))
    assert line == ("error: no model 'no-such-model': it is neither a catalog name (gemma3-270m, smollm2-135m, synth-llama-1b, synth-smolvlm-256m, whisper-base, whisper-tiny-en) nor a "
                    "directory; see `edgectl models list`")


def test_model_dir_with_a_broken_config(tmp_path: Path):
    broken = tmp_path / "broken"
    shutil.copytree(SHAPES / SMOLLM2, broken)
    (broken / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    line = _one_error_line(plan_cli([str(broken)], tmp_path))
    assert line.startswith(f"error: {broken.resolve()}/config.json: not valid JSON")


def test_over_large_request_through_the_cli(tmp_path: Path):
    # host-cgroup1 (budget 4187593114 B = 3994 MiB, test_probe_fixtures) × Qwen3-1.7B at its full 40960
    # tokens: the KV alone is 28 × (320 + 1) × 128 × 4096 B = 4712300544 B, more than the budget
    # whatever a profile says. (The worked numbers of this refusal at 4096 tokens, over the frozen
    # profiles, are in test_plan_context.) Here: the CLI refuses with the planner's own line, and its
    # hint holds through the CLI too.
    host = host_facts("host-cgroup1")
    facts = write_facts(host, tmp_path)
    model = str(SHAPES / QWEN3_17B)
    line = _one_error_line(plan_cli([model, "--facts", str(facts), "--max-model-len", "40960"], tmp_path))
    with pytest.raises(EdgectlError) as exc:
        make_plan(host, shape(QWEN3_17B), shipped_profiles(), spec=model, max_model_len=40960)
    assert line == f"error: {exc.value.message}"
    assert line.startswith(f"error: {model} at --max-model-len 40960 does not fit: needs ")
    assert "budget is 3994 MiB" in line
    if "does not fit at any context" in line:
        return  # a shipped profile whose fixed costs leave no room: nothing to hint (checked above)
    fits = int(line.rsplit("fits with --max-model-len ", 1)[1])
    assert 512 <= fits < 40960 and fits % 256 == 0
    ok = plan_cli([model, "--facts", str(facts), "--max-model-len", str(fits), "--json"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["max_model_len"] == fits
    # and it is the largest: 256 more is refused with the same hint
    over = _one_error_line(plan_cli([model, "--facts", str(facts), "--max-model-len", str(fits + 256)], tmp_path))
    assert over.endswith(f"fits with --max-model-len {fits}")


def test_max_model_len_above_the_models_maximum_through_the_cli(tmp_path: Path):
    facts = write_facts(host_facts("kvm-xeon-avx512-2c"), tmp_path)
    line = _one_error_line(plan_cli([str(SHAPES / SMOLLM2), "--facts", str(facts), "--max-model-len", "9000"],
                                    tmp_path))
    assert "exceeds what smollm2-135m supports (8192" in line


def test_unknown_format_through_the_cli(tmp_path: Path):
    facts = write_facts(host_facts("kvm-xeon-avx512-2c"), tmp_path)
    line = _one_error_line(plan_cli([str(SHAPES / SMOLLM2), "--facts", str(facts), "--format", "int3"], tmp_path))
    assert "unknown weight format 'int3'" in line


@pytest.mark.parametrize("command", ["plan", "deploy"])
def test_w4a8_amx_is_an_unknown_format_for_plan_and_deploy(tmp_path: Path, command: str):
    # W4A8 on AMX has no path in edgectl's runtime: not offered, on the AMX host of the published
    # figure (the shipped SPR profile records it at 74.4 tok/s) as anywhere else; deploy refuses
    # before it writes anything
    facts = write_facts(host_facts("xeon-spr-amx-2s"), tmp_path)
    etc, units = tmp_path / "etc", tmp_path / "units"
    args = ([str(SHAPES / QWEN3_17B), "--facts", str(facts)] if command == "plan" else
            [str(SHAPES / QWEN3_17B), "--dry-run"])
    done = run_cli([command, *args, "--format", "w4a8-amx"],
                   env={"EDGECTL_PROFILES_DIR": str(tmp_path / "no-local-profiles"),
                        "EDGECTL_MODEL_CACHE": str(tmp_path / "model-cache"),
                        "EDGECTL_CONFIG_DIR": str(etc), "EDGECTL_UNIT_DIR": str(units)})
    line = _one_error_line(done)
    assert line == "error: unknown weight format 'w4a8-amx': use one of w4a16, w4a8, w8a8, w4a16-vllm, bf16"
    assert not etc.exists() and not units.exists()


@pytest.mark.parametrize("command", ["plan", "deploy"])
def test_format_help_lists_only_the_formats_edgectl_serves(command: str):
    done = run_cli([command, "--help"], env={"COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "Weight format: w4a16, w4a8, w4a16-vllm or bf16 (default:" in text
    assert "a speech model: float16, bfloat16, float32, w4a8 or w8a8;" in text
    assert "a vision-language model: bf16, or its language model as w4a8 or w8a8." in text
    assert "w4a8-amx" not in text


def test_facts_file_problems_name_the_file(tmp_path: Path):
    garbled = tmp_path / "garbled.json"
    garbled.write_text("not json")
    line = _one_error_line(plan_cli([str(SHAPES / SMOLLM2), "--facts", str(garbled)], tmp_path))
    assert line.startswith(f"error: {garbled}: not JSON") and "edgectl probe --json" in line
    partial = tmp_path / "partial.json"
    d = host_facts("kvm-xeon-avx512-2c").to_dict()
    del d["cpu"]["isa"]
    partial.write_text(json.dumps(d))
    line = _one_error_line(plan_cli([str(SHAPES / SMOLLM2), "--facts", str(partial)], tmp_path))
    assert line == f"error: {partial}: cpu.isa: missing"


def test_a_bad_local_profile_reports_every_problem(tmp_path: Path):
    local = tmp_path / "local-profiles"
    write_profile(local, "schema: edgectl.profile/1\nname: broken\ndevice_class: x86_64-avx2\nkind: measured\n"
                         "match: {arch: x86_64, colour: blue}\nsources: {}\n", "broken.yaml")
    facts = write_facts(host_facts("kvm-xeon-avx512-2c"), tmp_path)
    done = plan_cli([str(SHAPES / SMOLLM2), "--facts", str(facts)], tmp_path,
                    env={"EDGECTL_PROFILES_DIR": str(local)})
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == (f"error: {local / 'broken.yaml'}: match.colour: unknown field (known: arch, isa_all, "
                        "isa_none, max_cores, min_cores, model_pattern, vendor)")
    assert lines[-1] == "fix the profile(s) above, or remove them"


# ---- this machine -------------------------------------------------------------------------------------


def _check_plan_for_this_host(d: dict, model_path: Path) -> None:
    check_plan_json(d)
    facts = probe("/", environ=os.environ)
    # the pull serves the GGUF as it is
    assert d["model"] == {"name": "smollm2-135m", "path": str(model_path), "architecture": "LlamaForCausalLM",
                          "checkpoint_format": "gguf"}
    assert d["device_class"] == str(facts.device_class)
    # never a kernel this host cannot run
    if not facts.cpu.isa.avx512f:
        assert d["weight_format"] != "w4a16-vllm"
    if not (facts.cpu.isa.avx2 and facts.cpu.isa.fma):
        assert d["weight_format"] != "w4a8"  # edgectl's kernels: AVX2 + FMA builds only
    if d["profile"]["kind"] == "fallback":
        assert d["weight_format"] == "w4a16"  # nothing measured: 4-bit reads the fewest bytes
    # a context and a KV budget that fit; RoPE rows = the context
    max_len = d["max_model_len"]
    assert 512 <= max_len <= 4096
    # 30 layers × 2 × 3 KV heads × 64 × 2 B = 23040 B per token, in blocks of 128 plus the null block
    assert d["kv_bytes_per_token"] == 23040
    assert d["kv_cache_bytes"] == (math.ceil(max_len / 128) + 1) * 128 * 23040
    assert d["rope_rows"] == max_len
    assert d["memory"]["limit_bytes"] <= facts.memory.budget_bytes
    assert d["cpus"] and set(d["cpus"]) <= set(facts.topology.usable_cpus)
    # a reason for each decision
    why = reasons_by_decision(d)
    for decision in ("profile", "weight_format", "max_model_len", "kv_cache_bytes", "rope_rows", "threads",
                     "cpus", "weights_bytes", "runtime_bytes", "memory_limit"):
        assert decision in why, decision


def test_plan_smollm2_on_this_machine_when_pulled(tmp_path: Path):
    from edgectl.models.cache import resolve_model

    try:
        path = resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")
    done = plan_cli(["smollm2-135m", "--json"], tmp_path, env={"EDGECTL_MODEL_CACHE": str(path.parent)})
    assert done.returncode == 0, done.stderr
    _check_plan_for_this_host(json.loads(done.stdout), path)


def test_plan_before_the_pull_uses_the_catalogs_config(tmp_path: Path):
    cache = tmp_path / "empty-cache"
    done = plan_cli(["smollm2-135m", "--json"], tmp_path, env={"EDGECTL_MODEL_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    # the path is where the pull will put it; nothing was downloaded or created
    _check_plan_for_this_host(d, cache / "smollm2-135m")
    assert not cache.exists()
    text = plan_cli(["smollm2-135m"], tmp_path, env={"EDGECTL_MODEL_CACHE": str(cache)})
    assert "planned from the catalog's configuration" in text.stdout


def test_the_catalog_config_is_the_pulled_models_shape():
    # the shipped config the plan uses before the pull describes the same model as the shape
    from edgectl import paths

    shipped = json.loads((paths.data_dir() / "catalog" / "smollm2-135m" / "config.json").read_text())
    assert shipped == json.loads((SHAPES / SMOLLM2 / "config.json").read_text())


def test_profiles_used_by_the_cli_are_the_shipped_ones():
    # The CLI reads paths.profiles_dir(): the checkout's profiles/ when run from one, the copy
    # installed inside the package otherwise (what CI and users run). Either way, the same files
    # as the repository's profiles/, byte for byte.
    from edgectl import paths

    cli_files = {f.name: f.read_bytes() for f in paths.profiles_dir().glob("*.yaml")}
    repo_files = {Path(p.file).name: Path(p.file).read_bytes() for p in shipped_profiles()}
    assert cli_files == repo_files


def test_a_plan_for_a_model_with_a_different_name_keeps_it(tmp_path: Path):
    # the name in the plan is how the user called the model (a directory: its name)
    renamed = tmp_path / "my-model"
    shutil.copytree(SHAPES / SMOLLM2, renamed)
    facts = write_facts(host_facts("kvm-xeon-avx512-2c"), tmp_path)
    done = plan_cli([str(renamed), "--facts", str(facts), "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    assert d["model"]["name"] == "my-model" and d["model"]["path"] == str(renamed.resolve())
    same = make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), shipped_profiles()).to_dict()
    for key in ("weights_bytes", "kv_cache_bytes", "workspace_bytes", "limit_bytes"):
        assert d["memory"][key] == same["memory"][key], key
    # whatever context the shipped profile leaves: 23040 B per token, whole blocks + the null block
    assert d["kv_cache_bytes"] == (math.ceil(d["max_model_len"] / 128) + 1) * 128 * 23040
