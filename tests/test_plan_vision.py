"""The planner's sizes for a vision-language model (Idefics3 / SmolVLM), computed by hand here.

The shape model's directory (synth-smolvlm-256m: SmolLM2-135M's text model, a 12-layer tower of hidden 768
and MLP 3072, 512x512 tiles of 16x16 patches pixel-shuffled by 4 into 64 tokens, images resized to a
longest edge of 2048) is written by tests/vision_helpers.py without torch; a tiny shape of the same spec
shows the sizes follow the processor's settings.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from models_helpers import run_cli
from plan_helpers import (
    MIB,
    SHAPES,
    frozen_profiles,
    host_facts,
    plan_cli,
    reasons_by_decision,
    with_memory,
    write_facts,
)
from vision_helpers import SPEC, make_vlm, vlm_config

from edgectl.contract.environment import runtime_levers
from edgectl.contract.plan import BenchLevers, Plan, Request, Source, WeightFormat
from edgectl.contract.vision import ImageLimits
from edgectl.contract.vllm_args import server_args
from edgectl.errors import EdgectlError
from edgectl.inputs import render_plan
from edgectl.models.inspect import inspect_model
from edgectl.planner import plan

NAME = "synth-smolvlm-256m"
HOST = "xeon-spr-amx-2s"
# One 4096x4096 image (the largest allowed): resized to 2048x2048, 4x4 tiles of 512 and the global view
TILES, TOKENS_PER_TILE = 17, 64
IMAGE_TOKENS = TILES * TOKENS_PER_TILE  # 1088, as transformers' processor expands it (docs/vision.md)
PROMPT_TOKENS = IMAGE_TOKENS + 3 * TILES + 1  # the tile markers: at most 3 a tile and one more
PROMPT_MIN = PROMPT_TOKENS + 128  # one image and 128 tokens of text


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_vlm(tmp_path_factory.mktemp("vlm") / NAME)


@pytest.fixture(scope="module")
def vlm(vlm_dir: Path):
    return inspect_model(vlm_dir, name=NAME)


def vision_plan(model, host: str = HOST, **asked) -> Plan:
    return plan(host_facts(host), model, frozen_profiles(), Request(model=NAME, **asked))


def test_it_is_planned_as_its_text_model_with_the_tower_in_the_weights(vlm):
    p = vision_plan(vlm, weight_format="bf16")
    text = plan(host_facts(HOST), inspect_model(SHAPES / "smollm2-135m"), frozen_profiles(),
                Request(model="smollm2-135m", weight_format="bf16"))
    assert p.modality == "vision" and p.speech is None and p.dtype == "bfloat16"
    assert p.weight_format is WeightFormat.BF16 and p.group_size == 0 and not p.quantize_lm_head
    # every parameter in bf16: SmolLM2-135M with its table grown to 49280 rows, and the tower and connector
    assert p.memory.weights_bytes == vlm.num_params * 2 == SPEC.parameters * 2
    assert vlm.vision.tower_bytes == vlm.vision.tower_params * 2 == 93_510_912 * 2
    # the text model's decisions: the same KV per token, context, chunk and threads as SmolLM2 in bf16
    assert p.kv_bytes_per_token == text.kv_bytes_per_token == 30 * 2 * 3 * 64 * 2
    assert (p.max_model_len, p.max_num_batched_tokens, p.threads, p.cpus) == \
        (text.max_model_len, text.max_num_batched_tokens, text.threads, text.cpus)
    assert p.memory.kv_cache_bytes == text.memory.kv_cache_bytes
    # a processor beside the tokenizer: the tokenizer as vLLM holds it; dense bf16 is eager unless asked
    assert p.levers.tokenizer == "vllm" and p.compilation == "eager"
    assert p.predicted.decode_tok_s is None  # nobody measured a vision model on this class


@pytest.mark.parametrize("asked", [None, False, True])
def test_decode_steps_take_edgectls_attention_unless_asked_otherwise(vlm, asked):
    """On by default for a vision plan (an image's ~1150 tokens in every decode step's attention), with
    the measurement in its reason; the runtime's variable follows the lever."""
    from edgectl.contract import environment

    p = vision_plan(vlm, "kvm-xeon-avx512-2c", bench=BenchLevers(decode_attention=asked))  # no AMX: on by default
    assert p.levers.decode_attention is (asked is not False)
    assert environment.runtime_levers(p)["EDGECTL_DECODE_ATTENTION"] == ("0" if asked is False else "1")
    why = [r for r in p.reasons if r.decision == "decode_attention"][0]
    assert (str(why.source) == "default") == (asked is None)
    assert asked is not None or "interleaved" in why.detail


@pytest.mark.parametrize("asked", [None, False, True])
def test_the_language_model_calls_vllms_attention_ops_the_lean_way_unless_asked_otherwise(vlm, asked):
    from edgectl.contract import environment

    p = vision_plan(vlm, bench=BenchLevers(lean_attention=asked))
    assert p.levers.lean_attention is (asked is not False)
    assert environment.runtime_levers(p)["EDGECTL_LEAN_ATTENTION"] == ("0" if asked is False else "1")
    why = [r for r in p.reasons if r.decision == "lean_attention"][0]
    assert asked is not None or "synth-smolvlm-256m" in why.detail


@pytest.mark.parametrize("asked", [None, 0, 4])
def test_the_tower_encodes_two_tiles_at_a_time_unless_asked_otherwise(vlm, asked):
    """The plan's vision.tower_tiles, the runtime's variable, the reason; the room for the tower's work
    stays sized for all of an image's tiles at once whatever the lever (an upper bound when it batches)."""
    p = vision_plan(vlm, bench=BenchLevers(tower_tiles=asked))
    want = 2 if asked is None else asked
    assert p.vision is not None and p.vision.tower_tiles == want
    assert runtime_levers(p)["EDGECTL_TOWER_TILES"] == str(want)
    (why,) = reasons_by_decision(p)["tower_tiles"]
    assert why["value"] == want and (why["source"] == "default") == (asked is None)
    assert asked is not None or "interleaved" in why["detail"]
    (work,) = reasons_by_decision(p)["encoder_work_bytes"]
    (whole,) = reasons_by_decision(vision_plan(vlm, bench=BenchLevers(tower_tiles=0)))["encoder_work_bytes"]
    assert work["value"] == whole["value"]
    assert ("upper bound" in work["detail"]) is (want > 0)


def test_a_text_plan_leaves_vllms_tower_as_it_is():
    text = plan(host_facts(HOST), inspect_model(SHAPES / "smollm2-135m"), frozen_profiles(),
                Request(model="smollm2-135m"))
    assert text.vision is None and runtime_levers(text)["EDGECTL_TOWER_TILES"] == "0"


@pytest.mark.parametrize(("host", "on", "because"), [
    ("xeon-spr-amx-2s", False, "vLLM's AMX attention"),  # as fast there, measured
    ("kvm-xeon-avx512-2c", True, "interleaved"),
    ("arm64-board", False, "no vector build for aarch64"),  # edgectl's kernels do not run there
])
def test_decode_attention_by_host(vlm, host: str, on: bool, because: str):
    p = vision_plan(vlm, host)
    assert p.levers.decode_attention is on
    why = [r for r in p.reasons if r.decision == "decode_attention"][0]
    assert str(why.source) == "default" and because in why.detail


def test_image_tokens_come_from_the_processors_tiling_of_the_largest_image(vlm):
    p = vision_plan(vlm)
    assert vlm.vision.tiles_max == TILES and vlm.vision.image_tokens_max == IMAGE_TOKENS
    (why,) = reasons_by_decision(p)["image_tokens"]
    assert why["value"] == PROMPT_TOKENS == 1140 and why["source"] == Source.MODEL_CONFIG
    assert "4096x4096" in why["detail"] and "17 tile(s)" in why["detail"] and f"needs {PROMPT_MIN}" in why["detail"]


def test_the_encoders_memory_is_held_in_the_workspace_and_its_work_under_the_limits(vlm):
    p = vision_plan(vlm)
    # one layer of the tower over every patch of the image's 17 tiles, bf16: max(6 × 768, 2 × 768 + 2 × 3072)
    # values a patch; the float32 pixel values — scaled by what the tower measured against that (660 / 306);
    # the processor's libraries (206 MiB, measured); vLLM's encoder cache: 1088 embeddings of 576 in bf16
    modelled = TILES * 1024 * max(6 * 768, 2 * 768 + 2 * 3072) * 2 + TILES * 3 * 512 * 512 * 4
    assert modelled // MIB == 306  # what the measurement was set against
    work = math.ceil(modelled * 660 / 306)
    cache = max(512, IMAGE_TOKENS) * 576 * 2
    by = reasons_by_decision(p)
    (held,) = by["encoder_bytes"]
    (transient,) = by["encoder_work_bytes"]
    assert held["value"] == 206 * MIB + cache and transient["value"] == work
    assert held["source"] == transient["source"] == Source.DEFAULT and "measured" in held["detail"]
    m = p.memory
    text_workspace = 512 * 4 * (8 * 576 + 4 * 1536)  # the text ledger's fallback per batched token
    # steady: the held part only; the tower's work comes and goes with an image
    assert m.workspace_bytes == text_workspace + held["value"]
    assert m.total_bytes == m.weights_bytes + m.kv_cache_bytes + m.rope_bytes + m.runtime_bytes + m.workspace_bytes
    (limit,) = by["memory_limit"]
    peak = m.total_bytes * _peak_ratio(limit["detail"]) + work
    # the reason prints the ratio to two decimals: within half a hundredth of the total, and a MiB of rounding
    assert abs(m.limit_bytes - peak * 1.25) <= m.total_bytes * 0.005 * 1.25 + MIB
    assert m.limit_bytes - (m.total_bytes * _peak_ratio(limit["detail"]) * 1.25) > work  # the work is under it
    assert m.high_bytes <= m.limit_bytes and "the tower's work on one image 660 MiB" in limit["detail"]
    # the peak measured under systemd while the worker answered its warm-up image fits under MemoryHigh
    assert m.high_bytes > 2354 * MIB


def _peak_ratio(detail: str) -> float:
    """The load peak ratio a memory_limit reason names ("total × load peak 1.11 …")."""
    return float(detail.split("load peak ")[1].split()[0])


def test_the_image_limits_are_the_guards_and_vllm_is_told_the_same(vlm):
    p = vision_plan(vlm)
    assert p.vision is not None and p.vision.images == ImageLimits()
    assert p.env["VLLM_MAX_IMAGE_PIXELS"] == str(4096 * 4096)
    for args in (server_args(p), server_args(p, stock=True)):
        i = args.index("--limit-mm-per-prompt")
        assert json.loads(args[i + 1]) == {"image": 1}
        assert args[args.index("--mm-processor-cache-gb") + 1] == "0"  # no image's pixels kept after its answer
        assert not any(a.startswith("--allowed-local-media-path") for a in args)
    assert Plan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_the_context_must_hold_a_prompt_with_its_image(vlm):
    with pytest.raises(EdgectlError, match=rf"--max-model-len 1024 cannot hold a prompt with 1 image\(s\) of {NAME}: "
                                           rf"it needs {PROMPT_MIN} tokens; use --max-model-len {PROMPT_MIN} or more"):
        vision_plan(vlm, max_model_len=1024)
    assert vision_plan(vlm, max_model_len=PROMPT_MIN).max_model_len == PROMPT_MIN


def test_a_budget_that_holds_no_image_prompt_is_refused(vlm):
    needed = vision_plan(vlm, max_model_len=PROMPT_MIN, kv_cache_dtype="auto").memory.limit_bytes
    # a shorter context fits, not the image's (bf16 KV asked: fp8 KV would make it fit)
    short = with_memory(host_facts(HOST), budget_bytes=needed - MIB)
    with pytest.raises(EdgectlError, match=rf"{NAME} fits a context of \d+ tokens in the budget .*, and a prompt "
                                           rf"with 1 image\(s\) needs {PROMPT_MIN}: free memory"):
        plan(short, vlm, frozen_profiles(), Request(model=NAME, kv_cache_dtype="auto"))
    with pytest.raises(EdgectlError, match=rf"{NAME} at --max-model-len {PROMPT_MIN} does not fit"):
        plan(short, vlm, frozen_profiles(), Request(model=NAME, max_model_len=PROMPT_MIN, kv_cache_dtype="auto"))


@pytest.mark.parametrize("fmt", ["w4a16", "w4a16-vllm"])
def test_other_int4_formats_are_refused_with_one_line(vlm, fmt):
    with pytest.raises(EdgectlError, match=rf"--format {fmt}: a vision-language model is served bf16, or its "
                                           r"language model as w4a8 or w8a8 \(edgectl's kernels\)"):
        vision_plan(vlm, weight_format=fmt)
    assert vision_plan(vlm, weight_format="bf16").weight_format is WeightFormat.BF16


# SmolLM2-135M's linear layers (30 x q, k, v, o, gate, up, down) and its tied table, 49280 x 576 here
LM_LINEAR = 30 * (2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576)
TABLE = 49280 * 576


@pytest.mark.parametrize(("fmt", "bits"), [("w4a8", 4), ("w8a8", 8)])
def test_asked_its_language_model_is_quantized_and_the_tower_stays_bf16(vlm, fmt, bits):
    dense = vision_plan(vlm, weight_format="bf16")
    p = vision_plan(vlm, weight_format=fmt)
    assert p.weight_format == fmt and p.quantize_lm_head and p.lm_head_format == "int8" and p.group_size == 32
    # edgectl's tiles of 16 rows x 32 columns: 320 bytes at 4 bits, 544 at 8 (scales included); every dim divides
    record = {4: 320, 8: 544}[bits]
    lm = LM_LINEAR * record // 512
    head = TABLE * 544 // 512
    assert p.memory.weights_bytes == dense.memory.weights_bytes - 2 * LM_LINEAR + lm - 2 * TABLE + head
    # the tower's 93.5 M parameters are still bf16 in it
    assert p.memory.weights_bytes > vlm.vision.tower_bytes + lm + head
    (why,) = reasons_by_decision(p)["weight_format"]
    assert why["source"] == "flag" and "the vision tower and the connector stay bf16" in why["detail"]
    (weights,) = reasons_by_decision(p)["weights_bytes"]
    assert f"210 linear layers in edgectl's {bits}-bit blocks of 32" in weights["detail"]
    assert "of the vision tower and connector in bf16" in weights["detail"]
    assert "--quantization" in server_args(p) and "cpu_int4" in server_args(p)
    # measured compiled, so compiled unless asked otherwise; the dense plan stays eager
    assert p.compilation == "default" and dense.compilation == "eager"
    assert vision_plan(vlm, weight_format=fmt, compilation="eager").compilation == "eager"
    blocks = "8-bit blocks of 32" if bits == 8 else "int4 groups of 32"
    assert f"\n  weights     {fmt}, {blocks}\n" in render_plan(p)
    env = runtime_levers(p)
    assert env["EDGECTL_INT4_PARTS"] == "language-model" and env["EDGECTL_LINEAR_BITS"] == str(bits)
    assert env["EDGECTL_LM_HEAD"] == "int8"


def test_a_host_without_edgectls_vector_kernels_refuses_the_quantized_formats(vlm):
    with pytest.raises(EdgectlError, match=r"--format w8a8 runs edgectl's kernels: .*serve synth-smolvlm-256m dense"):
        vision_plan(vlm, host="arm64-board", weight_format="w8a8")


def test_the_default_is_w8a8_compiled_where_edgectls_kernels_run_and_dense_elsewhere(vlm):
    p = vision_plan(vlm)
    assert p.weight_format == "w8a8" and p.compilation == "default" and p.lm_head_format == "int8"
    assert runtime_levers(p)["EDGECTL_INT4_PARTS"] == "language-model"
    (here,) = reasons_by_decision(p)["weight_format"]
    # the measured reason: the decode gain, the same answers, and the restart under systemd within the bound
    assert here["source"] == "default" and "111.7 tok/s" in here["detail"] and "kill -9" in here["detail"]
    elsewhere = vision_plan(vlm, host="arm64-board")
    assert elsewhere.weight_format == "bf16" and elsewhere.compilation == "eager"
    (there,) = reasons_by_decision(elsewhere)["weight_format"]
    assert there["source"] == "default" and "do not run here" in there["detail"]
    # asked for dense bf16 where the kernels run: served so, and said to be asked
    asked = vision_plan(vlm, weight_format="bf16")
    assert asked.weight_format == "bf16" and reasons_by_decision(asked)["weight_format"][0]["source"] == "flag"


def test_a_quantized_checkpoint_is_refused(tmp_path):
    d = make_vlm(tmp_path / "q", vlm_config(quantization_config={"quant_method": "gptq", "bits": 4}))
    with pytest.raises(EdgectlError, match=r"checkpoint is gptq \(config.json.s quantization_config\): edgectl serves a vision-language model from its bf16"):
        vision_plan(inspect_model(d, name="q"))


def test_the_sizes_follow_the_processor_settings(tmp_path):
    """A tiny tower (64x64 tiles of 16x16 patches, pixel-shuffled by 2: 4 tokens a tile), images resized to 128:
    2x2 tiles and the global view; without splitting, one tile."""
    vision = {**SPEC.config["vision_config"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "image_size": 64, "patch_size": 16}
    config = vlm_config(vision_config=vision, scale_factor=2)
    settings = {"size": {"longest_edge": 128}, "max_image_size": {"longest_edge": 64},
                "image_processor_type": "Idefics3ImageProcessor"}
    for splitting, tiles in ((True, 5), (False, 1)):
        d = make_vlm(tmp_path / str(splitting), config, {"image_processor": {**settings, "do_image_splitting": splitting},
                                                         "image_seq_len": 4})
        p = vision_plan(inspect_model(d, name="tiny"))
        (tokens,) = reasons_by_decision(p)["image_tokens"]
        assert tokens["value"] == tiles * 4 + 3 * tiles + 1
        by = reasons_by_decision(p)
        modelled = tiles * 16 * max(6 * 64, 2 * 64 + 2 * 128) * 2 + tiles * 3 * 64 * 64 * 4
        assert by["encoder_bytes"][0]["value"] == 206 * MIB + 512 * 576 * 2
        assert by["encoder_work_bytes"][0]["value"] == math.ceil(modelled * 660 / 306)


def test_plan_cli_plans_a_vision_directory(vlm_dir, tmp_path):
    facts = write_facts(host_facts("kvm-xeon-avx512-2c"), tmp_path)
    done = plan_cli([str(vlm_dir), "--facts", str(facts), "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["vision"]["images"]["max_images_per_request"] == 1 and data["weight_format"] == "w8a8"
    table = plan_cli([str(vlm_dir), "--facts", str(facts)], tmp_path)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    bad = plan_cli([str(vlm_dir), "--facts", str(facts), "--format", "w4a16"], tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    (line,) = [x for x in bad.stderr.splitlines() if x.startswith("error:")]
    assert "a vision-language model is served bf16, or its language model as w4a8 or w8a8" in line


def test_bench_takes_it_to_the_vision_bench_and_refuses_a_text_models_options(vlm_dir, tmp_path):
    done = run_cli(["bench", str(vlm_dir), "--out", str(tmp_path / "out"), "--concurrency", "2"],
                   env={"EDGECTL_PROFILES_DIR": str(tmp_path / "no-local-profiles")})
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "--concurrency: not a vision model's option" in line and "vision-language model" in line
    assert not (tmp_path / "out").exists()
