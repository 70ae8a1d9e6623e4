"""Where edgectl's decode-attention lever can take calls: the kernel's shapes written once
(edgectl/contract/decode_attention.py) and read by both the planner and the worker's plugin; the
planner's default off for a model none of whose layers the kernel takes (its name on a lever that would
do nothing); the bench's check, after the warm-up, that an arm with the lever on had decode calls take it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from plan_helpers import (
    MISTRAL_7B,
    SMOLLM2,
    host_facts,
    make_plan,
    reasons_by_decision,
    shape,
)

from edgectl.bench.arms import decode_attention_idle
from edgectl.contract.decode_attention import MAX_GROUP, MAX_HEAD, shape_refused
from edgectl.contract.effective import Effective
from edgectl.contract.plan import Plan
from edgectl.models.facts import FULL_ATTENTION, SLIDING_ATTENTION

AVX2_HOST = "kvm-epyc-avx2-2c"  # edgectl's kernels run, no AMX: the lever's default is on
PLAN = Plan.from_dict(json.loads((Path(__file__).parent / "fixtures" / "plans" / "deployed-w4a16.json").read_text()))


@pytest.mark.parametrize(("heads", "kv_heads", "head", "taken"), [
    (9, 3, 64, True), (32, 8, 128, True), (8, 1, 256, True), (4, 1, MAX_HEAD, True), (16, 16, 96, True),
    (32, 32, 80, False),  # 16 mod 32: vLLM's "vec16" layout
    (8, 8, 48, False),  # likewise
    (8, 8, 72, False), (8, 8, MAX_HEAD + 32, False),  # not a multiple of 16; over the kernel's largest
    (MAX_GROUP + 1, 1, 64, False), (12, 5, 64, False),  # a group over the largest; groups not whole
])
def test_the_kernels_shapes(heads: int, kv_heads: int, head: int, taken: bool):
    assert (shape_refused(heads, kv_heads, head) is None) is taken


@pytest.mark.parametrize(("change", "because"), [
    ({"head_dim": 80}, '"vec16" layout'),
    ({"head_dim": 72}, "multiples of 16"),
    ({"num_attention_heads": 3 * (MAX_GROUP + 1)}, f"up to {MAX_GROUP} query heads per KV head"),
    ({"layer_types": (SLIDING_ATTENTION,) * 30, "sliding_window": 4096}, "sliding window of 4096 tokens"),
])
def test_a_plan_keeps_vllms_attention_for_a_model_the_kernel_takes_no_layer_of(change: dict, because: str):
    model = replace(shape(SMOLLM2), **change)
    p = make_plan(host_facts(AVX2_HOST), model)
    assert p.levers.decode_attention is False
    why = reasons_by_decision(p)["decode_attention"][0]
    assert why["source"] == "default" and because in why["detail"] and SMOLLM2 in why["detail"]


def test_a_model_with_some_full_attention_layers_keeps_the_lever():
    """Gemma-3's five windowed layers of six: the full-attention sixth take the kernel."""
    layers = tuple(FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(30))
    p = make_plan(host_facts(AVX2_HOST), replace(shape(SMOLLM2), layer_types=layers, sliding_window=512))
    assert p.levers.decode_attention is True


def test_mistral_7b_whose_every_layer_slides_keeps_vllms_attention():
    p = make_plan(host_facts(AVX2_HOST), shape(MISTRAL_7B))
    assert p.levers.decode_attention is False
    assert "sliding window of 4096" in reasons_by_decision(p)["decode_attention"][0]["detail"]


def _read_back(calls: dict[str, int] | None, isa: list[str]) -> Effective:
    got, problems = Effective.read({"decode_attention": {"kernel": "edgectl", "calls": calls}, "attention_isa": isa})
    assert got is not None, problems
    return got


def test_the_bench_refuses_an_arm_whose_lever_took_no_call():
    on = replace(PLAN, levers=replace(PLAN.levers, decode_attention=True))
    idle = decode_attention_idle(on, _read_back({"edgectl": 0, "vllm": 480}, ["amx"]))
    assert len(idle) == 1 and "took none of the warm-up's 480 attention calls" in idle[0] and "'amx'" in idle[0]
    assert decode_attention_idle(on, _read_back({"edgectl": 300, "vllm": 180}, ["vec"])) == []
    off = replace(PLAN, levers=replace(PLAN.levers, decode_attention=False))
    assert decode_attention_idle(off, _read_back({"edgectl": 0, "vllm": 480}, ["amx"])) == []
    assert decode_attention_idle(on, _read_back(None, ["vec"])) == []  # a worker from before the counts
