"""mismatches(): the one comparison of a plan with what the engine read back (edgectl/contract/effective.py).

The plans are the fixtures an earlier edgectl wrote (tests/fixtures/plans/); the read-backs are
what a SmolLM2 engine reports (30 layers: qkv_proj, o_proj and gate_up_proj have K = 576,
down_proj K = 1536), written out here so each field can be made wrong on its own.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edgectl.contract.effective import Effective, group_size_of, mismatches
from edgectl.contract.plan import Plan, WeightFormat
from edgectl.errors import EdgectlError

PLANS = Path(__file__).parent / "fixtures" / "plans"
WIDTHS = {"self_attn.qkv_proj": 576, "self_attn.o_proj": 576, "mlp.gate_up_proj": 576, "mlp.down_proj": 1536}


def plan(name: str = "deployed-w4a16.json", **changes) -> Plan:
    return dataclasses.replace(Plan.load(PLANS / name), **changes)


def read_back(p: Plan, group_of=lambda k, g: g if k % g == 0 else 64) -> dict:
    """What an engine that followed ``p`` reports."""
    formats, widths = {}, {}
    for layer in range(30):
        for kind, k in WIDTHS.items():
            name = f"model.layers.{layer}.{kind}"
            formats[name] = f"cpu_int4/g{group_of(k, p.group_size)}" if p.weight_format.is_int4 else "bf16"
            widths[name] = k
    head = "cpu_int4/g32" if p.quantize_lm_head else "bf16-tied-embedding"
    formats["lm_head"] = head
    return {"max_model_len": p.max_model_len, "max_num_seqs": p.max_num_seqs, "kv_cache_bytes": p.kv_cache_bytes,
            "threads": p.threads, "rope_rows": {"model.rotary_emb": p.rope_rows}, "linear_formats": formats,
            "linear_in_features": widths, "lm_head_format": head,
            "processes": 1 if p.topology == "single-process" else 3,
            # the KV dtype and the memory levers (docs/memory.md), as the plan has them
            "kv_cache_dtype": [str(p.kv_cache_dtype)],
            "kv_tensor_dtypes": ["uint8" if p.kv_cache_dtype == "fp8_e4m3" else "bfloat16"],
            "python_optimize": p.levers.python_optimize,
            "optional_imports": {n: "kept out" if p.levers.optional_imports == "skip" else "loaded"
                                 for n in ("opentelemetry", "cv2", "accelerate")},
            "idle_trim": {"enabled": p.levers.idle_trim, "available": True},
            "tokenizer": {"lean": p.levers.tokenizer == "lean", "processor_loaded": p.levers.tokenizer != "lean",
                          "construction_inputs": {"held": [] if p.levers.tokenizer == "lean" else ["_vocab", "_merges"],
                                                  "read_after_init": []}},
            "embedding_pack": {} if p.quantize_lm_head else {
                "model.embed_tokens": {"state": "not packed" if p.levers.embedding_pack == "lm-head" else "packed",
                                       "lm_head": False},
                "lm_head": {"state": "packed", "lm_head": True}}}


@pytest.mark.parametrize("name", ["deployed-w4a16.json", "bf16-1024.json", "stock-topology.json"])
def test_an_engine_that_followed_the_plan_matches(name):
    p = plan(name)
    assert mismatches(p, read_back(p)) == []


@pytest.mark.parametrize("field, value, says", [
    ("max_model_len", 2048, "max_model_len is 2048, the plan says 4096"),
    ("max_num_seqs", 4, "max_num_seqs is 4"),
    ("kv_cache_bytes", 1, "KV cache bytes is 1"),
    ("threads", 1, "threads is 1, the plan says 2"),
    ("thread_wait", "passive", "the OpenMP threads' wait is 'passive', the plan says 'spin'"),
    ("rope_rows", {"model.rotary_emb": 8192}, "RoPE table model.rotary_emb has 8192 rows"),
    ("rope_rows", {}, "RoPE table rows could not be read back"),
    ("linear_formats", {}, "linear layer formats could not be read back"),
    ("lm_head_format", "cpu_int4/g32", "the output head is cpu_int4/g32, the plan keeps it unquantized"),
    ("processes", 3, "3 processes serve, the plan's single-process topology has 1"),
    ("linear_in_features", None, "input widths could not be read back"),
    ("compile", {"mode": "DYNAMO_TRACE_ONCE", "wrapper": "cpp"},
     "the compiled graph's wrapper is 'cpp', the plan says 'python'"),
    ("lean_attention", {"path": "lean", "calls": {"lean": 300, "vllm": 0}},
     "the path of the attention's calls into vLLM's ops is 'lean', the plan says 'vllm'"),
])
def test_each_difference_is_named(field, value, says):
    p = plan()
    got = {**read_back(p), field: value}
    problems = mismatches(p, got)
    assert len(problems) == 1 and says in problems[0], problems


def test_a_compiled_graph_with_the_wrapper_the_plan_asks_matches_and_eager_reports_none():
    p = plan()
    asked = dataclasses.replace(p, levers=dataclasses.replace(p.levers, cpp_wrapper=True))
    assert mismatches(asked, {**read_back(asked), "compile": {"mode": "DYNAMO_TRACE_ONCE", "wrapper": "cpp"}}) == []
    assert mismatches(p, {**read_back(p), "compile": {"mode": "NONE"}}) == []


def test_a_layer_left_dense_is_named():
    p = plan()
    got = read_back(p)
    got["linear_formats"]["model.layers.3.mlp.down_proj"] = "bf16"
    assert mismatches(p, got) == ["1 linear layers are not 4-bit although the plan quantizes them "
                                  "(e.g. model.layers.3.mlp.down_proj: bf16)"]


def test_the_group_size_is_checked_per_layer_by_the_plans_rule():
    p = plan(group_size=128)
    # the plan's rule: 576 is not a multiple of 128 → 64; 1536 is → 128
    assert mismatches(p, read_back(p)) == []
    everywhere_128 = read_back(p, group_of=lambda k, g: 128)
    problems = mismatches(p, everywhere_128)
    assert len(problems) == 1 and problems[0].startswith("90 int4 layer(s) differ in group size"), problems
    default_instead = read_back(plan(), group_of=lambda k, g: 128)  # the plan asked for 32
    assert any("differ in group size" in m for m in mismatches(plan(), default_instead))


def test_bf16_plan_with_int4_layers():
    p = plan("bf16-1024.json")
    got = read_back(plan())  # an int4 engine
    got.update(max_model_len=p.max_model_len, kv_cache_bytes=p.kv_cache_bytes, threads=p.threads,
               rope_rows={"model.rotary_emb": p.rope_rows}, max_num_seqs=p.max_num_seqs)
    assert any("linear layers are 4-bit, the plan says bf16" in m for m in mismatches(p, got))


def test_vllms_topology_with_one_process_is_named():
    p = plan("stock-topology.json")
    problems = mismatches(p, {**read_back(p), "processes": 1})
    assert problems == ["1 process(es) serve, vLLM's own topology has an API server and an engine"]


@pytest.mark.parametrize("fmt, group", [("cpu_int4/g32", 32), ("cpu_int4/g128", 128), ("bf16", None),
                                        ("cpu_int4/g32-tied-embedding", None), (None, None)])
def test_group_size_of(fmt, group):
    assert group_size_of(fmt) == group


def test_a_4bit_checkpoint_keeps_its_own_groups():
    p = plan(group_size=32)
    p = dataclasses.replace(p, model=dataclasses.replace(p.model, checkpoint_format="gptq"))
    assert mismatches(p, read_back(p, group_of=lambda k, g: 128 if k % 128 == 0 else 64)) == []


def _gguf(p: Plan) -> Plan:
    return dataclasses.replace(p, model=dataclasses.replace(p.model, checkpoint_format="gguf"))


def test_a_gguf_keeps_its_wider_layers_in_8_bit_blocks():
    # A Q4_K_M file's 5-8-bit layers are held in edgectl's W8 blocks (docs/gguf.md): that is the
    # plan taking effect for a GGUF, and a mismatch for a checkpoint quantized at load.
    base = plan()
    for p, expected in ((_gguf(base), []), (base, ["1 linear layers are not 4-bit although the plan quantizes them "
                                                   "(e.g. model.layers.0.mlp.down_proj: w8a8/b32)"])):
        got = read_back(p)
        got["linear_formats"]["model.layers.0.mlp.down_proj"] = "w8a8/b32"
        assert mismatches(p, got) == expected
    got = read_back(_gguf(base))
    got["linear_formats"]["model.layers.0.mlp.down_proj"] = "bf16"
    assert len(mismatches(_gguf(base), got)) == 1
    # its Q5_0 layers in edgectl's W5 blocks, likewise
    for p, n in ((_gguf(base), 0), (base, 1)):
        got = read_back(p)
        got["linear_formats"]["model.layers.0.mlp.gate_up_proj"] = "w5a8/b32"
        assert len(mismatches(p, got)) == n


def test_a_w8a8_plan_wants_every_linear_layer_in_8_bit_blocks():
    p = plan(weight_format=WeightFormat.W8A8, group_size=32)
    got = read_back(p)
    got["linear_formats"] = {n: "bf16-tied-embedding" if n == "lm_head" else "w8a8/b32"
                             for n in got["linear_formats"]}
    assert mismatches(p, got) == []
    got["linear_formats"]["model.layers.3.mlp.down_proj"] = "w4a8/b32"
    assert mismatches(p, got) == ["1 linear layers are not edgectl's W8 although the plan says w8a8 "
                                  "(e.g. model.layers.3.mlp.down_proj: w4a8/b32)"]
    got["kernel_isa"] = None
    assert "edgectl's kernel library is not loaded, the plan's w8a8 runs on it" in mismatches(p, got)


def test_a_gguf_must_be_loaded_by_edgectls_loader():
    p = _gguf(plan())
    assert mismatches(p, {**read_back(p), "load_format": "edgectl_gguf"}) == []
    assert mismatches(p, {**read_back(p), "load_format": "auto"}) == [
        "the model was loaded with 'auto', a GGUF is served by 'edgectl_gguf'"]


# -- the read-back's type ----------------------------------------------------------------------------

RESULTS = Path(__file__).parent.parent / "results"


def _read_backs(artifact: object):
    """Every pass's ``effective`` in a bench artifact (passes sit at several depths)."""
    if isinstance(artifact, dict):
        if isinstance(artifact.get("effective"), dict):
            yield artifact["effective"]
        for value in artifact.values():
            yield from _read_backs(value)
    elif isinstance(artifact, list):
        for value in artifact:
            yield from _read_backs(value)


@pytest.mark.parametrize("artifact", sorted(RESULTS.glob("*.json"))[::4], ids=lambda p: p.name)
def test_the_type_reads_real_read_backs(artifact):
    # Read-backs the bench kept, from the edgectl worker, unmodified vLLM and llama.cpp, written by
    # the edgectl of their day: each one fits the type, field for field.
    read_backs = list(_read_backs(json.loads(artifact.read_text())))
    for data in read_backs:
        got, problems = Effective.read(data)
        assert problems == [] and got is not None
        assert got.reported == set(data)
        assert got.max_model_len == data["max_model_len"]


def test_a_read_back_that_does_not_fit_names_every_bad_field():
    p = plan()
    got = {**read_back(p), "threads": "2", "tokenizer": {"lean": 1}, "surprise": True}
    assert mismatches(p, got) == [
        "effective.surprise: unknown field (known: " + ", ".join(sorted(
            f.name for f in dataclasses.fields(Effective) if f.init)) + ")",
        "effective.threads: expected an integer, got a string '2'",
        "effective.tokenizer.lean: expected a boolean, got an integer 1",
    ]
    with pytest.raises(EdgectlError, match=r"^the engine's read-back does not fit edgectl.effective/1: effective.surprise"):
        Effective.from_dict(got)


def test_a_field_not_read_back_is_not_checked_and_a_null_one_is():
    # kernel_isa None: the kernel library is not loaded; absent: an engine that does not report it
    p = dataclasses.replace(plan(), weight_format=WeightFormat.W4A8)
    assert mismatches(p, read_back(p)) == []
    assert mismatches(p, {**read_back(p), "kernel_isa": None}) == [
        "edgectl's kernel library is not loaded, the plan's w4a8 runs on it"]


def test_no_packed_copy_at_all_when_the_plan_says_none():
    levers = dataclasses.replace(plan().levers, embedding_pack="none")
    p = plan(levers=levers)
    got = read_back(p)
    got["embedding_pack"] = {"model.embed_tokens": {"state": "not packed", "lm_head": False},
                             "lm_head": {"state": "not packed", "lm_head": True}}
    assert mismatches(p, got) == []
    got["embedding_pack"]["lm_head"]["state"] = "packed"
    (problem,) = mismatches(p, got)
    assert "lm_head: packed" in problem and "embedding_pack is none" in problem


def test_a_vision_plan_quantizes_its_language_model_and_keeps_the_tower_dense():
    """--format w8a8 on a vision-language model: the language model's layers in 8-bit blocks, the head int8, and
    the layers under the parts the runtime says it kept dense (vLLM's map of the model) read back bf16."""
    from edgectl.contract.vision import ImageLimits, VisionServe

    p = plan(weight_format=WeightFormat.W8A8, group_size=32, quantize_lm_head=True,
             vision=VisionServe(images=ImageLimits()))
    assert p.lm_head_format == "int8"
    got = read_back(p)
    got["linear_formats"] = {n: "w8a8/b32-tied-embedding" if n == "lm_head" else "w8a8/b32"
                             for n in got["linear_formats"]}
    got["lm_head_format"] = "w8a8/b32-tied-embedding"
    tower = {"model.vision_model.encoder.layers.0.self_attn.qkv_proj": "bf16",
             "model.vision_model.encoder.layers.0.mlp.fc1": "bf16", "model.connector.modality_projection.proj": "bf16"}
    got["linear_formats"].update(tower)
    got["quantization_readback"] = {"method": "cpu_int4", "parts": "language-model",
                                    "dense_parts": ["model.connector", "model.vision_model"]}
    assert mismatches(p, got) == []
    got["linear_formats"]["model.vision_model.encoder.layers.0.mlp.fc1"] = "w8a8/b32"
    assert mismatches(p, got) == ["1 layers of the vision tower or connector are quantized, the plan keeps them bf16 "
                                  "(e.g. model.vision_model.encoder.layers.0.mlp.fc1: w8a8/b32)"]
    got["linear_formats"].update(tower)
    got["linear_formats"]["model.layers.2.mlp.down_proj"] = "bf16"  # a language model layer left dense
    assert mismatches(p, got) == ["1 linear layers are not edgectl's W8 although the plan says w8a8 "
                                  "(e.g. model.layers.2.mlp.down_proj: bf16)"]
    got["linear_formats"]["model.layers.2.mlp.down_proj"] = "w8a8/b32"
    del got["quantization_readback"]["dense_parts"]
    assert mismatches(p, got)[0] == "the runtime did not say which parts of the vision-language model it kept dense"


def test_a_vision_towers_batches_are_checked_against_the_plan():
    """A vision plan's tower_tiles against what the worker installed; a text plan's read-back is not asked."""
    from edgectl.contract.vision import VisionServe

    p = plan(vision=VisionServe(tower_tiles=2))
    others = mismatches(p, read_back(p))  # this text fixture's read-back says nothing of a vision model's parts
    assert mismatches(p, {**read_back(p), "tower_tiles": {"tiles": 2, "calls": 1, "batches": 9}}) == others
    problems = mismatches(p, {**read_back(p), "tower_tiles": {"tiles": 0, "calls": 1, "batches": 1}})
    assert problems == [*others, "the tiles the vision tower encodes at once (0: all) is 0, the plan says 2"]
    text = plan()
    assert mismatches(text, {**read_back(text), "tower_tiles": {"tiles": 0, "calls": 0, "batches": 0}}) == []
