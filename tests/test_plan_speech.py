"""The planner's sizes for a speech model (Whisper: an encoder-decoder), computed by hand here.

whisper-base's config.json (edgectl/data/catalog/whisper-base/config.json, what the pull's
conversion writes): d_model 512, 6 encoder and 6 decoder layers of 8 heads, encoder FFN 2048,
80 mel bins, 1500 encoder positions (one 30 s window), 448 decoder positions.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from plan_helpers import (
    MIB,
    ceil_mib,
    frozen_profiles,
    host_facts,
    profile_from_yaml,
    profile_yaml,
    reasons_by_decision,
    shape,
    with_cpu,
    with_memory,
)

from edgectl.contract.plan import Plan, Request
from edgectl.errors import EdgectlError
from edgectl.models.inspect import inspect_model
from edgectl.paths import data_dir
from edgectl.planner import plan

CATALOG_DIR = data_dir() / "catalog" / "whisper-base"


@pytest.fixture(scope="module")
def whisper():
    return inspect_model(CATALOG_DIR, name="whisper-base", require_tokenizer=False)


def speech_plan(whisper, host="xeon-spr-amx-2s", **asked) -> Plan:
    return plan(host_facts(host), whisper, frozen_profiles(), Request.from_flat(model="whisper-base", **asked))


def test_kv_is_sized_per_transcription_in_vllms_blocks(whisper):
    p = speech_plan(whisper, max_num_seqs=4)
    assert p.speech is not None and p.modality == "speech"
    # one block of 128 tokens across the 6 decoder layers' self- and cross-attention, K and V, bf16:
    # 128 × 2 × 512 × 2 B × 12 layers = 3 MiB; a transcription takes max(ceil(448/128), ceil(1500/128))
    # = max(4, 12) = 12 blocks of each pool; 4 transcriptions and vLLM's null block: 49 blocks.
    assert p.speech.kv_bytes_per_seq == 12 * 3 * MIB
    assert p.kv_cache_bytes == 49 * 3 * MIB == 154_140_672  # what vLLM 0.32 allocated for this plan (read back)
    assert p.max_model_len == 448 and p.max_num_batched_tokens == 1500 and p.max_num_seqs == 4
    assert p.rope_rows == 0 and p.memory.rope_bytes == 0


def test_memory_ledger_adds_weights_kv_encoder_work_and_audio(whisper):
    one, four = speech_plan(whisper), speech_plan(whisper, max_num_seqs=4)
    # weights: whisper-base's parameters at 2 bytes (bf16) and the head's int8 copy (51865 rows in tiles
    # of 16, 512 columns in blocks of 32, 544 bytes per tile and block), the same whatever the concurrency
    assert one.speech.head == "w8-scan"
    assert one.memory.weights_bytes == four.memory.weights_bytes == whisper.num_params * 2 + 3242 * 16 * 544
    # each transcription more: 12 blocks of KV
    assert four.memory.kv_cache_bytes - one.memory.kv_cache_bytes == 3 * 12 * 3 * MIB
    # the encoder over one window: 1500 × (4 × 512 + 2048) × 2 B + 8 heads × 1500² × 4 B + 80 × 2 × 1500 × 4 B
    encoder = 1500 * (4 * 512 + 2048) * 2 + 8 * 1500 * 1500 * 4 + 80 * 2 * 1500 * 4
    assert one.memory.workspace_bytes == four.memory.workspace_bytes == encoder
    m = four.memory
    assert m.total_bytes == m.weights_bytes + m.kv_cache_bytes + m.runtime_bytes + m.workspace_bytes
    assert m.high_bytes <= m.limit_bytes
    # the limit holds, beyond the steady total, the decoded samples of 4 uploads of 600 s (16 kHz float32)
    audio = 4 * 600 * 16000 * 4
    assert m.limit_bytes >= (m.total_bytes + audio) * 1.25 - MIB


def test_dtype_is_the_fastest_that_keeps_the_word_error_rate(whisper):
    spr = host_facts("xeon-spr-amx-2s")
    assert spr.cpu.isa.amx_bf16 and "avx512_fp16" in spr.cpu.flags
    assert speech_plan(whisper).speech.dtype == "bfloat16"  # AMX multiplies bf16; the best logits exact
    assert speech_plan(whisper, speech_head="dense").memory.weights_bytes == whisper.num_params * 2
    no_bf16 = with_cpu(spr, isa=replace(spr.cpu.isa, amx_bf16=False, avx512_bf16=False))
    assert plan(no_bf16, whisper, frozen_profiles(), Request(model="whisper-base")).speech.dtype == "float16"
    neither = with_cpu(no_bf16, flags=tuple(f for f in spr.cpu.flags if f != "avx512_fp16"))
    assert plan(neither, whisper, frozen_profiles(), Request(model="whisper-base")).speech.dtype == "float32"
    avx2 = speech_plan(whisper, host="kvm-epyc-avx2-2c")
    assert avx2.speech.dtype == "float32"  # no bf16 or float16 arithmetic
    assert speech_plan(whisper, host="kvm-epyc-avx2-2c", speech_head="dense").memory.weights_bytes == whisper.num_params * 4
    assert speech_plan(whisper, weight_format="float16").speech.dtype == "float16"  # asked


def test_the_head_scans_an_int8_copy_where_edgectls_kernels_run(whisper):
    for host in ("xeon-spr-amx-2s", "kvm-epyc-avx2-2c"):
        p = speech_plan(whisper, host=host)
        assert p.speech.head == "w8-scan" and p.env["EDGECTL_SPEECH_HEAD"] == "w8-scan"
        assert reasons_by_decision(p)["speech_head"][0]["source"] == "probe"
    arm = speech_plan(whisper, host="arm64-board", weight_format="float32")
    assert arm.speech.head == "dense" and arm.env["EDGECTL_SPEECH_HEAD"] == "dense"
    dense = speech_plan(whisper, speech_head="dense")
    assert dense.speech.head == "dense" and reasons_by_decision(dense)["speech_head"][0]["source"] == "flag"
    scan = speech_plan(whisper)
    assert scan.memory.weights_bytes - dense.memory.weights_bytes == 3242 * 16 * 544  # the int8 copy, counted
    assert speech_plan(whisper, weight_format="w4a8").speech.head == "dense"


def test_worker_settings_for_whisper(whisper):
    p = speech_plan(whisper)
    why = reasons_by_decision(p)
    assert p.levers.python_optimize == 0, why["python_optimize"]  # transformers' Whisper needs its docstrings
    assert p.levers.tokenizer == "vllm"
    assert p.levers.lean_attention is True and "planned-vllm-attention-calls" in why["lean_attention"][0]["detail"]
    from edgectl.contract.environment import runtime_levers

    assert runtime_levers(p)["EDGECTL_LEAN_ATTENTION"] == "1"
    asked = speech_plan(whisper, lean_attention=False)  # the bench's planned-vllm-attention-calls arm
    assert asked.levers.lean_attention is False and runtime_levers(asked)["EDGECTL_LEAN_ATTENTION"] == "0"
    assert p.compilation == "eager"
    assert p.env["VLLM_MAX_AUDIO_DECODE_DURATION_S"] == "600"
    assert p.env["VLLM_MAX_AUDIO_CLIP_FILESIZE_MB"] == "24"  # 25 MB in MiB, rounded up
    from edgectl.contract.vllm_args import server_args

    args = server_args(p)
    assert args[args.index("--dtype") + 1] == "bfloat16"
    assert args[args.index("--kv-cache-memory-bytes") + 1] == str(p.kv_cache_bytes)


def test_plan_json_round_trips_and_a_text_plan_has_no_speech_key(whisper):
    p = speech_plan(whisper, max_num_seqs=2)
    assert Plan.from_dict(json.loads(p.to_json())) == p
    text = plan(host_facts("xeon-spr-amx-2s"), shape("smollm2-135m"), frozen_profiles(), Request(model="smollm2-135m"))
    assert "speech" not in text.to_dict() and text.modality == "text"


def test_refusals_name_what_to_do(whisper):
    with pytest.raises(EdgectlError, match="a speech model is served dense"):
        speech_plan(whisper, weight_format="w4a16")
    with pytest.raises(EdgectlError, match="bf16 activations"):
        speech_plan(whisper, host="kvm-epyc-avx2-2c", weight_format="w4a8")
    small = with_memory(host_facts("xeon-spr-amx-2s"), budget_bytes=600 * MIB)
    with pytest.raises(EdgectlError, match="--max-num-seqs"):
        plan(small, whisper, frozen_profiles(), Request(model="whisper-base", max_num_seqs=4))
    assert replace(whisper, speech=None).speech is None  # a text model's facts plan as text


def test_a_profiles_speech_figures_size_the_runtime_and_the_limit(whisper, tmp_path):
    measured = profile_from_yaml(tmp_path, profile_yaml(
        name="test-amx", device_class="x86_64-amx", match="  arch: x86_64\n  isa_all: [amx_bf16]\n",
        extra=("speech:\n  process_bytes: {median: 800000000, passes: 3}\n"
               "  per_transcription_bytes: {median: 7000000, passes: 3}\n"
               "  load_peak_ratio: {median: 1.1, passes: 3}\n")))
    facts = host_facts("xeon-spr-amx-2s")
    dense = plan(facts, whisper, [measured], Request.from_flat(model="whisper-base", max_num_seqs=3, speech_head="dense"))
    assert dense.memory.runtime_bytes == 800_000_000 + 2 * 7_000_000  # one transcription, and two more
    p = plan(facts, whisper, [measured], Request(model="whisper-base", max_num_seqs=3))
    m = p.memory
    # with the int8 scan, vLLM's packed copy of the head (bf16) is not made: the measured runtime held it
    assert p.speech.head == "w8-scan" and p.levers.embedding_pack == "none"
    assert m.runtime_bytes == 800_000_000 + 2 * 7_000_000 - 51865 * 512 * 2
    audio = 3 * 600 * 16000 * 4
    assert m.limit_bytes == ceil_mib((m.total_bytes * 1.1 + audio) * 1.25)
    memory = reasons_by_decision(p)["memory"]
    assert "test-amx" in str(memory) and "fallback" not in str(memory)
    fallback = speech_plan(whisper)  # the frozen profiles have no speech figures: stated fallbacks
    assert "fallback" in str(reasons_by_decision(fallback)["memory"])


def test_w4a8_when_asked_runs_edgectls_kernels_on_the_linear_layers(whisper):
    from edgectl.contract.vllm_args import server_args

    dense, w4 = speech_plan(whisper, speech_head="dense"), speech_plan(whisper, weight_format="w4a8")
    assert dense.weight_format == "bf16" and dense.group_size == 0
    assert w4.weight_format == "w4a8" and w4.group_size == 32 and not w4.quantize_lm_head
    args = server_args(w4)
    assert args[args.index("--quantization") + 1] == "cpu_int4" and "--quantization" not in server_args(dense)
    # every linear layer but the tied head in blocks of 32: 16 B of nibbles + a bf16 scale and minimum
    # per block (20 B per 32 values) instead of 64 B in bf16
    linear = sum(layer.out_features * layer.in_features for layer in whisper.linear_layers)
    saved = dense.memory.weights_bytes - w4.memory.weights_bytes
    assert saved == pytest.approx(linear * 2 * (1 - 20 / 64), rel=0.02)


def test_w8a8_when_asked_runs_edgectls_int8_kernels_on_the_linear_layers(whisper):
    from edgectl.contract.environment import runtime_levers
    from edgectl.contract.vllm_args import server_args

    dense = speech_plan(whisper, host="kvm-epyc-avx2-2c")
    w8 = speech_plan(whisper, host="kvm-epyc-avx2-2c", weight_format="w8a8")
    assert w8.weight_format == "w8a8" and w8.group_size == 32 and not w8.quantize_lm_head
    assert w8.speech.dtype == dense.speech.dtype  # the activations' dtype is the dense plan's (no bf16 needed)
    args = server_args(w8)
    assert args[args.index("--quantization") + 1] == "cpu_int4"
    levers = runtime_levers(w8)
    assert levers["EDGECTL_INT4_KERNEL"] == "edgectl" and levers["EDGECTL_LINEAR_BITS"] == "8"
    assert runtime_levers(speech_plan(whisper, weight_format="w4a8"))["EDGECTL_LINEAR_BITS"] == "4"
    # every linear layer but the tied head in blocks of 32 int8 values and one fp16 scale (34 B per 32 values),
    # where dense holds them in the plan's dtype (float32 on this AVX2 host: 4 bytes a value)
    assert dense.speech.dtype == "float32"
    linear = sum(layer.out_features * layer.in_features for layer in whisper.linear_layers)
    saved = dense.memory.weights_bytes - w8.memory.weights_bytes
    assert saved == pytest.approx(linear * (4 - 34 / 32), rel=0.02)
    # the bench's lever: the rest of a w8a8 plan in float32 (CTranslate2's int8 recipe); only with w8a8
    f32 = speech_plan(whisper, weight_format="w8a8", speech_dtype="float32")
    assert f32.speech.dtype == "float32" and speech_plan(whisper, weight_format="w8a8").speech.dtype == "bfloat16"
    assert f32.memory.weights_bytes > speech_plan(whisper, weight_format="w8a8").memory.weights_bytes
    with pytest.raises(EdgectlError, match="with the w8a8 format"):
        speech_plan(whisper, speech_dtype="float32")
    # edgectl's kernels have no vector build below AVX2: refused, with what to do
    avx2_host = host_facts("kvm-epyc-avx2-2c")
    no_avx2 = with_cpu(avx2_host, isa=replace(avx2_host.cpu.isa, avx2=False))
    with pytest.raises(EdgectlError, match="serve whisper-base dense"):
        plan(no_avx2, whisper, frozen_profiles(), Request.from_flat(model="whisper-base", weight_format="w8a8"))
    # not a text model's format: refused by the text planner with the reason
    with pytest.raises(EdgectlError, match="w8a8 serves a speech model.s linear layers"):
        plan(host_facts("kvm-epyc-avx2-2c"), shape("smollm2-135m"), frozen_profiles(),
             Request(model="smollm2-135m", weight_format="w8a8"))


def test_an_english_only_model_is_served_by_edgectls_class(whisper):
    from edgectl.contract.vllm_args import server_args
    from edgectl.contract.whisper_names import ARCHITECTURE, ENGLISH_ONLY_ARCHITECTURE

    tiny = inspect_model(data_dir() / "catalog" / "whisper-tiny-en", name="whisper-tiny-en", require_tokenizer=False)
    p = plan(host_facts("xeon-spr-amx-2s"), tiny, frozen_profiles(), Request(model="whisper-tiny-en"))
    assert p.speech is not None and p.speech.multilingual is False
    args = server_args(p)
    assert json.loads(args[args.index("--hf-overrides") + 1]) == {"architectures": [ENGLISH_ONLY_ARCHITECTURE]}
    assert "--hf-overrides" not in server_args(p, stock=True)  # stock vLLM has no such class
    # a multilingual one by edgectl's class with the exact best logits
    base = server_args(speech_plan(whisper))
    assert json.loads(base[base.index("--hf-overrides") + 1]) == {"architectures": [ARCHITECTURE]}
    # tiny.en: 4 decoder layers of d_model 384 → a block across its 8 attention layers is
    # 128 × 2 × 384 × 2 B × 8 = 1.5 MiB, 12 blocks per transcription
    assert p.speech.kv_bytes_per_seq == 12 * 128 * 2 * 384 * 2 * 8
