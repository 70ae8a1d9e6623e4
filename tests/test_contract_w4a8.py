"""The contract for plans on edgectl's own kernels (w4a8): the vLLM arguments they become
(edgectl/contract/vllm_args.py), the runtime's variables (environment.py), and the check
against the settings read back from the engine (effective.py): the output head's format by
name (int4, edgectl's int8, dense) and the kernel ISA level of edgectl's library."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from edgectl.contract import environment
from edgectl.contract.effective import head_family, mismatches
from edgectl.contract.int4_layout import choose_group_size
from edgectl.contract.plan import Compilation, Plan, WeightFormat
from edgectl.contract.vllm_args import server_args

PLAN = Plan.from_dict(json.loads((Path(__file__).parent / "fixtures" / "plans" / "deployed-w4a16.json").read_text()))


def _effective(plan: Plan, body: str, head: str, **extra) -> dict:
    return {"max_model_len": plan.max_model_len, "max_num_seqs": plan.max_num_seqs,
            "kv_cache_bytes": plan.kv_cache_bytes, "threads": plan.threads, "processes": 1,
            "rope_rows": {"model.layers.0.self_attn.rotary_emb": plan.rope_rows},
            "linear_formats": {"model.layers.0.mlp.down_proj": body, "lm_head": head},
            "linear_in_features": {"model.layers.0.mlp.down_proj": 1536},
            "lm_head_format": head,
            # the KV dtype and the memory levers (docs/memory.md) as the plan has them; a quantized head
            # is no dense embedding table, so no prepacked copy is reported
            "kv_cache_dtype": [str(plan.kv_cache_dtype)],
            "kv_tensor_dtypes": ["uint8" if plan.kv_cache_dtype == "fp8_e4m3" else "bfloat16"],
            "python_optimize": plan.levers.python_optimize,
            "optional_imports": {n: "kept out" if plan.levers.optional_imports == "skip" else "loaded"
                                 for n in ("opentelemetry", "cv2", "accelerate")},
            "idle_trim": {"enabled": plan.levers.idle_trim, "available": True},
            "tokenizer": {"lean": plan.levers.tokenizer == "lean", "processor_loaded": plan.levers.tokenizer != "lean",
                          "construction_inputs": {"held": [] if plan.levers.tokenizer == "lean" else ["_vocab", "_merges"],
                                                  "read_after_init": []}},
            "embedding_pack": {} if head_family(head) != "dense" else {
                "model.embed_tokens": {"state": "not packed" if plan.levers.embedding_pack == "lm-head" else "packed",
                                       "lm_head": False},
                "lm_head": {"state": "packed", "lm_head": True}},
            **extra}


def test_head_family_names_the_read_back_formats():
    assert head_family("cpu_int4/g64-tied-embedding") == "int4"
    assert head_family("w4a8/b32-tied-embedding") == "int4"
    assert head_family("w8a8/b32-tied-embedding") == "int8"
    assert head_family("bf16-tied-embedding") == "dense"
    assert head_family(None) == "dense"


def test_a_w4a8_plan_with_its_int8_head_took_effect():
    plan = replace(PLAN, weight_format=WeightFormat.W4A8, quantize_lm_head=True)
    assert plan.topology == "single-process" and plan.lm_head_format == "int8"
    assert mismatches(plan, _effective(plan, "w4a8/b32", "w8a8/b32-tied-embedding", kernel_isa="avx2")) == []


def test_a_head_in_another_format_than_planned_is_named():
    plan = replace(PLAN, weight_format=WeightFormat.W4A8, quantize_lm_head=True)
    got = mismatches(plan, _effective(plan, "w4a8/b32", "bf16-tied-embedding", kernel_isa="avx2"))
    assert got == ["the output head is bf16-tied-embedding, the plan has it int8"]
    plan = replace(PLAN, weight_format=WeightFormat.W4A8, quantize_lm_head=False)
    got = mismatches(plan, _effective(plan, "w4a8/b32", "w8a8/b32-tied-embedding", kernel_isa="avx2"))
    assert got == ["the output head is w8a8/b32-tied-embedding, the plan keeps it unquantized"]
    plan = replace(PLAN, weight_format=WeightFormat.W4A16, quantize_lm_head=True)
    group = choose_group_size(1536, plan.group_size)
    got = mismatches(plan, _effective(plan, f"cpu_int4/g{group}", "w8a8/b32-tied-embedding"))
    assert got == ["the output head is w8a8/b32-tied-embedding, the plan has it int4"]


def test_w4a8_without_edgectls_library_loaded_is_a_mismatch():
    plan = replace(PLAN, weight_format=WeightFormat.W4A8, quantize_lm_head=True)
    got = mismatches(plan, _effective(plan, "w4a8/b32", "w8a8/b32-tied-embedding", kernel_isa=None))
    assert got == ["edgectl's kernel library is not loaded, the plan's w4a8 runs on it"]


def _after(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_a_w4a8_plan_runs_cpu_int4_on_edgectls_kernels_and_norms():
    plan = replace(PLAN, weight_format=WeightFormat.W4A8, quantize_lm_head=True)
    args = server_args(plan)
    assert _after(args, "--quantization") == "cpu_int4"
    assert json.loads(_after(args, "--ir-op-priority")) == {"rms_norm": ["edgectl"], "fused_add_rms_norm": ["edgectl"]}
    env = environment.runtime_levers(plan)
    assert env["EDGECTL_INT4_KERNEL"] == "edgectl" and env["EDGECTL_LM_HEAD"] == "int8"
    # unmodified vLLM (the bench's control) gets neither
    stock = server_args(plan, stock=True)
    assert "--quantization" not in stock and "--ir-op-priority" not in stock
    # compiled: inductor fuses the norms itself; w4a16: vLLM's own norms
    assert "--ir-op-priority" not in server_args(replace(plan, compilation=Compilation.DEFAULT))
    w4a16 = replace(PLAN, weight_format=WeightFormat.W4A16, quantize_lm_head=True)
    assert "--ir-op-priority" not in server_args(w4a16)
    assert environment.runtime_levers(w4a16)["EDGECTL_LM_HEAD"] == "int4"
