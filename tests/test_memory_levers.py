"""The memory levers (docs/memory.md) and the KV dtype, from the planner to what the worker runs
and what its read-back must show: pure, no engine (the engine tests read them back for real:
test_worker_api.py)."""

from __future__ import annotations

from dataclasses import replace

import isa_helpers
import pytest
from plan_helpers import SMOLLM2, host_facts, make_plan, reasons_by_decision, shape
from probe_helpers import FIXTURE_NAMES

from edgectl import launch
from edgectl.contract import environment
from edgectl.contract.effective import mismatches
from edgectl.contract.plan import EmbeddingPack, KvCacheDtype, OptionalImports
from edgectl.contract.vllm_args import server_args
from edgectl.errors import EdgectlError
from edgectl.units import render_unit

AMX = "xeon-spr-amx-2s"


def test_the_planner_takes_the_kept_levers_by_default_and_each_changes_what_the_worker_runs():
    p = make_plan(host_facts(AMX), shape(SMOLLM2))
    off = make_plan(host_facts(AMX), shape(SMOLLM2), embedding_pack="vllm", optional_imports="load", python_optimize=0,
                    idle_trim=False)
    assert (p.levers.embedding_pack, p.levers.optional_imports, p.levers.python_optimize, p.levers.idle_trim) == (
        EmbeddingPack.LM_HEAD, OptionalImports.SKIP, 2, True)
    why = reasons_by_decision(p)
    for decision in ("embedding_pack", "optional_imports", "python_optimize", "idle_trim"):
        (reason,) = why[decision]  # the planner's own choice, citing where it was measured
        assert reason["source"] == "default" and "docs/memory.md" in reason["detail"]
    # what each lever changes: the worker's command line and environment ...
    assert launch.worker_command("/py", "/plan.json", p.levers.python_optimize)[1] == "-OO"
    assert not any(a.startswith("-O") for a in launch.worker_command("/py", "/plan.json", off.levers.python_optimize))
    assert (environment.runtime_levers(p)["EDGECTL_EMBEDDING_PACK"],
            environment.runtime_levers(off)["EDGECTL_EMBEDDING_PACK"]) == ("lm-head", "vllm")
    # ... and what its read-back must show: a worker running unmodified vLLM's settings fails the
    # default plan on each of the four, and passes the plan that asked for them
    said = mismatches(p, _effective(off))
    for lever in ("Python's optimization level is 0, the plan says 2", "loaded, the plan says skip",
                  "the plan's embedding_pack is lm-head", "the idle trim is off, the plan's idle_trim is on"):
        assert any(lever in line for line in said), (lever, said)
    assert mismatches(off, _effective(off)) == []


@pytest.mark.parametrize("host", FIXTURE_NAMES)
def test_the_embedding_pack_reason_is_true_for_the_hosts_class(host: str):
    # The −55 MiB is the LM head's duplicate packed copy, measured on x86_64-amx. vLLM makes a packed
    # copy only where it has a packed bf16 GEMM (AMX tiles, or oneDNN from AVX-512 up); on an AVX2 box
    # there is no copy, so nothing to save (the worker reads back "no packed kernel" there). The rule
    # the engine tests check against the real read-back (isa_helpers) must agree with the reason.
    facts = host_facts(host)
    p = make_plan(facts, shape(SMOLLM2))
    assert p.levers.embedding_pack is EmbeddingPack.LM_HEAD  # the same setting on every class
    (reason,) = reasons_by_decision(p)["embedding_pack"]
    assert reason["source"] == "default" and "docs/memory.md" in reason["detail"]
    if facts.cpu.arch != "x86_64":
        assert reason["detail"].startswith(f"whether vLLM prepacks embedding tables on {facts.cpu.arch} was not measured")
    elif isa_helpers.vllm_packs_bf16_gemm(facts.cpu.isa.to_dict()):
        assert reason["detail"].startswith("only the LM head keeps vLLM's prepacked copy")
        assert "−55 MiB anonymous for SmolLM2" in reason["detail"]
    else:
        assert reason["detail"].startswith("saves nothing on this host: without AVX-512 or AMX vLLM makes no "
                                           "prepacked copy")


def test_the_embedding_pack_reason_covers_each_kind_of_host():
    # the fixtures hold each case above at least once (else the parametrized test proves less than it says)
    kinds = {("other" if f.cpu.arch != "x86_64" else isa_helpers.vllm_packs_bf16_gemm(f.cpu.isa.to_dict()))
             for f in map(host_facts, FIXTURE_NAMES)}
    assert kinds == {True, False, "other"}


def test_each_lever_can_be_switched_back_to_unmodified_vllm():
    p = make_plan(host_facts(AMX), shape(SMOLLM2), embedding_pack="vllm", optional_imports="load", python_optimize=0,
                  idle_trim=False)
    assert (p.levers.embedding_pack, p.levers.optional_imports, p.levers.python_optimize, p.levers.idle_trim) == (
        "vllm", "load", 0, False)
    assert {r["source"] for d in ("embedding_pack", "optional_imports", "python_optimize", "idle_trim")
            for r in reasons_by_decision(p)[d]} == {"flag"}
    with pytest.raises(EdgectlError, match="^embedding pack 'none': use one of vllm, lm-head$"):
        make_plan(host_facts(AMX), shape(SMOLLM2), embedding_pack="none")
    with pytest.raises(EdgectlError, match="^--kv-cache-dtype 'fp8_e5m2': use one of auto, fp8_e4m3, int8$"):
        make_plan(host_facts(AMX), shape(SMOLLM2), kv_cache_dtype="fp8_e5m2")


def _pulled(p):
    """The plan with its model where `edgectl models pull` keeps it (the shape's directory lies in
    the checkout, which may be under /tmp, where the unit refuses a model)."""
    return replace(p, model=replace(p.model, path="/var/lib/edgectl/models/smollm2-135m"))


def test_the_idle_trim_is_off_where_the_engine_runs_in_vllms_processes():
    # the trim runs on the in-process engine thread's idle beats; vLLM's own topology has none
    p = make_plan(host_facts(AMX), shape(SMOLLM2), topology="stock")
    assert p.levers.idle_trim is False
    (reason,) = reasons_by_decision(p)["idle_trim"]
    assert reason["source"] == "default" and "vLLM's own processes" in reason["detail"]


def test_what_the_worker_is_started_with_carries_the_levers():
    p = make_plan(host_facts(AMX), shape(SMOLLM2))
    assert environment.runtime_levers(p)["EDGECTL_EMBEDDING_PACK"] == "lm-head"
    assert launch.worker_command("/py", "/plan.json", p.levers.python_optimize) == [
        "/py", "-OO", "-P", "-m", "edgectl_runtime.service.worker", "--plan", "/plan.json"]
    assert launch.worker_command("/py", "/plan.json", 0) == ["/py", "-P", "-m", "edgectl_runtime.service.worker", "--plan", "/plan.json"]
    unit = render_unit(_pulled(p), plan_path="/etc/edgectl/default/plan.json", python="/opt/edgectl/venv/bin/python")
    assert "ExecStart=/opt/edgectl/venv/bin/python -OO -P -m edgectl_runtime.service.worker --plan" in unit
    args = server_args(p)
    assert args[args.index("--kv-cache-dtype") + 1] == "auto"
    fp8 = make_plan(host_facts(AMX), shape(SMOLLM2), kv_cache_dtype="fp8_e4m3")
    args = server_args(fp8, stock=True)  # the control arm runs the same KV dtype
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert "Description=edgectl default: smollm2-135m (w4a16) served" in unit
    fp8_unit = render_unit(_pulled(fp8), plan_path="/etc/edgectl/default/plan.json", python="/opt/edgectl/venv/bin/python")
    assert "Description=edgectl default: smollm2-135m (w4a16, fp8_e4m3 KV) served" in fp8_unit
    # MemoryMax follows the ledger, whose KV bytes halved
    assert f"MemoryMax={fp8.memory.limit_bytes}" in fp8_unit and fp8.memory.limit_bytes < p.memory.limit_bytes


def test_fp8_kv_halves_the_bytes_per_token_in_the_ledger():
    bf16 = make_plan(host_facts(AMX), shape(SMOLLM2))
    fp8 = make_plan(host_facts(AMX), shape(SMOLLM2), kv_cache_dtype="fp8_e4m3")
    assert (bf16.kv_cache_dtype, fp8.kv_cache_dtype) == (KvCacheDtype.AUTO, KvCacheDtype.FP8_E4M3)
    assert fp8.max_model_len == bf16.max_model_len
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 23040  # 30 layers × K,V × 3 heads × 64 × 2 B
    assert fp8.kv_cache_bytes * 2 == bf16.kv_cache_bytes
    assert bf16.memory.total_bytes - fp8.memory.total_bytes == fp8.kv_cache_bytes


def _effective(plan) -> dict:
    """What a worker running ``plan`` as planned reads back (the fields compared here)."""
    head_only = plan.levers.embedding_pack == "lm-head"
    skip = plan.levers.optional_imports == "skip"
    return {
        "max_model_len": plan.max_model_len, "max_num_seqs": plan.max_num_seqs, "kv_cache_bytes": plan.kv_cache_bytes,
        "threads": plan.threads, "processes": 1, "rope_rows": {"rotary_emb": plan.rope_rows},
        "linear_formats": {"model.layers.0.mlp.down_proj": f"cpu_int4/g{plan.group_size}",
                           "lm_head": "bf16-tied-embedding"},
        "linear_in_features": {"model.layers.0.mlp.down_proj": 1536},
        "kv_cache_dtype": [str(plan.kv_cache_dtype)],
        "kv_tensor_dtypes": ["uint8" if plan.kv_cache_dtype == "fp8_e4m3" else "bfloat16"],
        "python_optimize": plan.levers.python_optimize,
        "optional_imports": {n: "kept out" if skip else "loaded" for n in ("opentelemetry", "cv2", "accelerate")},
        "idle_trim": {"enabled": plan.levers.idle_trim, "available": True, "trims": 0},
        "tokenizer": {"lean": plan.levers.tokenizer == "lean", "processor_loaded": plan.levers.tokenizer != "lean",
                          "construction_inputs": {"held": [] if plan.levers.tokenizer == "lean" else ["_vocab", "_merges"],
                                                  "read_after_init": []}},
        "embedding_pack": {"model.embed_tokens": {"state": "not packed" if head_only else "packed", "lm_head": False},
                           "lm_head": {"state": "packed", "lm_head": True}},
    }


@pytest.mark.parametrize("levers", [{}, {"embedding_pack": "vllm", "optional_imports": "load", "python_optimize": 0,
                                         "tokenizer": "vllm", "idle_trim": False},
                                    {"kv_cache_dtype": "fp8_e4m3"}])
def test_a_worker_that_runs_the_plan_matches_it(levers):
    p = make_plan(host_facts(AMX), shape(SMOLLM2), **levers)
    assert mismatches(p, _effective(p)) == []


@pytest.mark.parametrize("change, says", [
    (lambda e: e.update(python_optimize=0), "Python's optimization level is 0, the plan says 2"),
    (lambda e: e["optional_imports"].update(cv2="loaded"), "cv2 loaded, the plan says skip"),
    (lambda e: e["embedding_pack"]["model.embed_tokens"].update(state="packed"),
     "embedding table(s) model.embed_tokens: packed, the plan's embedding_pack is lm-head"),
    (lambda e: e["embedding_pack"]["lm_head"].update(state="not packed"),
     "embedding table(s) lm_head: not packed, the plan's embedding_pack is lm-head"),
    (lambda e: e["embedding_pack"]["model.embed_tokens"].update(state="no packed kernel"),
     "embedding table(s) model.embed_tokens: no packed kernel, the plan's embedding_pack is lm-head"),
    (lambda e: e.update(kv_cache_dtype=["fp8_e4m3"]), "the attention layers' KV cache dtype is fp8_e4m3, the plan says auto"),
    (lambda e: e.update(kv_tensor_dtypes=["uint8"]), "the KV tensors are uint8, the plan's auto KV is bfloat16"),
    (lambda e: e.pop("kv_tensor_dtypes"), "the KV cache dtype could not be read back"),
    (lambda e: e.pop("optional_imports"), "the optional imports could not be read back"),
    (lambda e: e.pop("embedding_pack"), "the embedding tables' packed copies could not be read back"),
    (lambda e: e["tokenizer"].update(lean=False), "the tokenizer is as vLLM holds it, the plan's tokenizer is lean"),
    (lambda e: e["tokenizer"]["construction_inputs"].update(held=["_merges"]),
     "the tokenizer still holds _merges, the plan's tokenizer is lean"),
    (lambda e: e.pop("tokenizer"), "the tokenizer's state could not be read back"),
    (lambda e: e.update(idle_trim={"enabled": False}), "the idle trim is off, the plan's idle_trim is on"),
    (lambda e: e["idle_trim"].update(available=False), "the idle trim is on but this C library has no malloc_trim (glibc's)"),
    (lambda e: e.pop("idle_trim"), "the idle trim's state could not be read back"),
])
def test_a_lever_that_did_not_take_effect_is_named(change, says):
    p = make_plan(host_facts(AMX), shape(SMOLLM2))
    eff = _effective(p)
    change(eff)
    assert mismatches(p, eff) == [says]


@pytest.mark.parametrize("embedding_pack", ["lm-head", "vllm"])
def test_a_table_vllm_could_not_pack_on_this_cpu_follows_the_plan(embedding_pack):
    """On AVX2 vLLM has no packed GEMM for a bf16 table (oneDNN builds no bf16 matmul there, no AMX
    for sgl-kernel): a table the plan leaves to vLLM reads back "no packed kernel", and the worker
    still serves (runtime/edgectl_runtime/vllm_plugin/embedding.py)."""
    p = make_plan(host_facts(AMX), shape(SMOLLM2), embedding_pack=embedding_pack)
    eff = _effective(p)
    for layer in eff["embedding_pack"].values():
        if layer["state"] == "packed":
            layer["state"] = "no packed kernel"
    assert mismatches(p, eff) == []


def test_fp8_planned_but_bf16_running_is_a_mismatch():
    p = make_plan(host_facts(AMX), shape(SMOLLM2), kv_cache_dtype="fp8_e4m3")
    eff = _effective(replace(p, kv_cache_dtype=KvCacheDtype.AUTO))
    assert mismatches(p, eff) == ["the attention layers' KV cache dtype is auto, the plan says fp8_e4m3",
                                  "the KV tensors are bfloat16, the plan's fp8_e4m3 KV is uint8"]


def test_the_ledger_adds_what_a_models_tokenizer_holds_beyond_the_profiles():
    """The per-process figure carries the tokenizer of the model it was measured with; a model's own,
    measured at pull, adds the difference (negative for a smaller one), and the reason says which."""
    from plan_helpers import frozen_profiles, shipped_profiles

    profiles = shipped_profiles()
    # a host whose profile was measured (with SmolLM2, saying what its tokenizer held)
    for name in FIXTURE_NAMES:
        host = host_facts(name)
        unmeasured = make_plan(host, replace(shape(SMOLLM2), tokenizer_bytes=None), profiles)
        profile = next(p for p in profiles if p.name == unmeasured.profile.name)
        if profile.tokenizer_bytes is not None:
            break
    else:
        raise AssertionError("no shipped profile says what its model's tokenizer held")
    base = int(profile.tokenizer_bytes.median)
    for own in (base + (359 << 20), base - (14 << 20)):
        p = make_plan(host, replace(shape(SMOLLM2), tokenizer_bytes=own), profiles)
        assert p.memory.runtime_bytes - unmeasured.memory.runtime_bytes == own - base
        assert p.memory.total_bytes - unmeasured.memory.total_bytes == own - base
        assert f"{(own - base) / 2**20:+.0f} MiB for the tokenizer" in reasons_by_decision(p)["runtime_bytes"][0]["detail"]
    assert "not measured" in reasons_by_decision(unmeasured)["runtime_bytes"][0]["detail"]
    # a profile that does not say what its own model's tokenizer held: nothing added, and said so
    older = make_plan(host, replace(shape(SMOLLM2), tokenizer_bytes=base + (359 << 20)), frozen_profiles())
    assert "the profile does not say" in reasons_by_decision(older)["runtime_bytes"][0]["detail"]
