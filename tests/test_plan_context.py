"""Context, concurrency, KV and RoPE: the largest context that fits, the caps, the refusals with a
hint that holds, sliding-window layers, and vLLM's own KV arithmetic as the referee.

The by-hand model and host numbers are the ones of test_plan_table.py (imported, not recomputed);
the profiles are the frozen copies (tests/profiles_frozen/, plan_helpers.make_plan's default). The
worked examples below are for prefill chunks of MAX_BATCHED_TOKENS = 512 tokens: batched =
min(max_model_len, 512), so every context of 512 tokens or more pays the same workspace.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from dataclasses import replace

import pytest
from plan_by_hand import HOSTS, QWEN17, ledger
from plan_helpers import (
    LLAMA31_8B,
    MIB,
    MISTRAL_7B,
    QWEN3_17B,
    QWEN25_05B,
    SHAPE_NAMES,
    SMOLLM2,
    host_facts,
    make_plan,
    reasons_by_decision,
    shape,
    with_memory,
)

from edgectl.contract import environment
from edgectl.errors import EdgectlError
from edgectl.planner.ledger import MAX_BATCHED_TOKENS

# ---- the largest context that fits, and its caps -------------------------------------------------


def test_the_worked_examples_are_for_512_token_chunks():
    # The literal numbers below (contexts that fit, MiB in messages, sliding-window blocks) were worked
    # out by hand for 512-token prefill chunks. If plan.MAX_BATCHED_TOKENS changes, re-derive them.
    assert MAX_BATCHED_TOKENS == 512


def test_default_cap_is_4096_on_a_roomy_host():
    p = make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2))  # 20.6 GiB budget, 8192 positions
    assert p.max_model_len == 4096
    why = reasons_by_decision(p)["max_model_len"][0]
    assert why["source"] == "model-config"
    assert "capped at the default 4096 (ask for more with --max-model-len, up to 8192)" in why["detail"]


def test_the_models_maximum_caps_the_context():
    model = replace(shape(SMOLLM2), max_position_embeddings=2048)
    p = make_plan(host_facts("kvm-xeon-avx512-2c"), model)
    assert p.max_model_len == 2048 and p.rope_rows == 2048
    assert "capped at the model maximum" in reasons_by_decision(p)["max_model_len"][0]["detail"]


def test_more_than_4096_only_when_asked():
    p = make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), max_model_len=8192)
    assert (p.max_model_len, p.rope_rows, p.max_num_batched_tokens) == (8192, 8192, min(8192, MAX_BATCHED_TOKENS))
    # 30 layers × (8192 / 128 = 64 blocks + 1 null) × 128 tokens × 768 B per token and layer
    assert p.kv_cache_bytes == 30 * 65 * 128 * 768 == 191692800
    assert reasons_by_decision(p)["max_model_len"][0]["source"] == "flag"


def test_max_model_len_above_the_models_maximum_is_refused():
    with pytest.raises(EdgectlError) as exc:
        make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), max_model_len=8193)
    assert exc.value.exit_code == 2
    assert exc.value.message == ("--max-model-len 8193 exceeds what smollm2-135m supports "
                                 "(8192, max_position_embeddings): use --max-model-len 8192 or less")


def test_a_tiny_max_model_len_is_refused():
    with pytest.raises(EdgectlError, match=r"--max-model-len 8 is too small \(at least 16 tokens\)"):
        make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), max_model_len=8)


def test_the_context_shrinks_to_what_fits():
    # host-cgroup1 (budget 4187593114 B = 3993.6 MiB) × Qwen3-1.7B w4a16 (generic: 640 MiB runtime,
    # load peak 1.3). At any context ≥ 512 the fixed part is runtime 671088640 + weights 1371260928 +
    # workspace 163840 × 512 (83886080) = 2126235648 B; KV takes 28 layers × 128 × 4096 B = 14680064 B
    # per block (plus one null block), RoPE 256 B per row:
    #   3584: KV 29 × 14680064 = 425721856, RoPE 917504 → total 2552875008, × 1.625 → 3957 MiB ≤ 3993.6
    #   3840: KV 31 × 14680064 = 455081984, RoPE 983040 → total 2582300672, × 1.625 → 4002 MiB > budget
    h = HOSTS["host-cgroup1"]
    assert ledger(QWEN17, "w4a16", 3584, h.runtime).total == 2552875008
    assert ledger(QWEN17, "w4a16", 3584, h.runtime).limit == 3957 * MIB <= h.budget
    assert ledger(QWEN17, "w4a16", 3840, h.runtime).limit == 4002 * MIB > h.budget
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B))
    assert p.max_model_len == 3584
    why = reasons_by_decision(p)["max_model_len"][0]
    assert why["source"] == "probe" and "largest that fits the budget 3994 MiB" in why["detail"]


def test_an_over_large_request_is_refused_with_need_budget_and_a_hint_that_holds():
    h = HOSTS["host-cgroup1"]
    need = ledger(QWEN17, "w4a16", 4096, h.runtime)
    # 4096 tokens: weights 1371260928 + KV 28 × 33 × 128 × 4096 = 484442112 + RoPE 4096 × 256 = 1048576
    # + workspace 163840 × 512 = 83886080 + runtime 671088640 = 2611726336 B (2491 MiB, KV 462 MiB);
    # × 1.625 → 4048 MiB against a 3994 MiB budget. The largest that fits is 3584 (above).
    assert (need.total, need.limit) == (2611726336, 4048 * MIB)
    # (bf16 KV asked: without the flag, a one-byte KV is tried next, tests below)
    with pytest.raises(EdgectlError) as exc:
        make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), max_model_len=4096, kv_cache_dtype="auto")
    msg = exc.value.message
    assert exc.value.exit_code == 2 and "\n" not in msg
    assert msg.startswith("qwen3-1.7b at --max-model-len 4096 does not fit: needs 4048 MiB as w4a16")
    assert "steady 2491 MiB incl. KV 462 MiB" in msg and "budget is 3994 MiB" in msg
    assert msg.endswith("fits with --max-model-len 3584")
    # the hint holds: planning exactly that fits, and the next step of 256 does not
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), max_model_len=3584)
    assert p.max_model_len == 3584 and p.memory.limit_bytes == 3957 * MIB <= h.budget
    assert p.kv_cache_dtype == "auto"
    with pytest.raises(EdgectlError, match=r"at --max-model-len 3840 does not fit: needs 4002 MiB .*"
                                           r"fits with --max-model-len 3584$"):
        make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), max_model_len=3840, kv_cache_dtype="auto")


def test_a_context_that_fits_only_with_a_one_byte_kv_is_planned_with_edgectls_int8_kv_and_says_so():
    # The request above (4096 tokens, bf16 KV 462 MiB: 4048 MiB > 3994) with the planner's
    # choice: edgectl's int8 KV holds the same blocks in half the bytes, 242221056 B, plus a float32
    # scale per token, KV head and half (4 / head_dim of those bytes: 7569408 B): total 2377074688 B
    # (2267 MiB) × 1.625 → 3684 MiB ≤ 3994 MiB. int8, not vLLM's fp8: it runs on this host as on AVX2 and
    # keeps more of bf16's answers (planner/kv_dtype.py).
    h = HOSTS["host-cgroup1"]
    want = ledger(QWEN17, "w4a16", 4096, h.runtime, kv="int8")
    assert (want.kv, want.scales, want.total, want.limit) == (242221056, 7569408, 2377074688, 3684 * MIB)
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), max_model_len=4096)
    assert (p.max_model_len, p.kv_cache_dtype) == (4096, "int8")
    assert (p.kv_cache_bytes, p.memory.kv_scales_bytes, p.memory.total_bytes) == (want.kv, want.scales, want.total)
    assert p.memory.limit_bytes == want.limit <= h.budget
    assert p.kv_bytes_per_token == QWEN17.kv_per_token // 2
    why = reasons_by_decision(p)["kv_cache_dtype"][0]
    assert why["value"] == "int8" and why["source"] == "default"
    assert "4096 tokens do not fit with bf16 KV" in why["detail"] and "bf16 KV fits 3584 tokens" in why["detail"]
    assert "top-1 agreement 0.953" in why["detail"] and "docs/memory.md" in why["detail"]
    # only edgectl's decode attention reads it: the lever is on, and says why
    (attention,) = reasons_by_decision(p)["decode_attention"]
    assert attention["value"] is True and "int8 KV planned (bf16 KV does not fit)" in attention["detail"]
    assert p.levers.decode_attention


def test_where_edgectls_int8_kv_cannot_run_vllms_fp8_kv_is_planned_and_says_so():
    # The same request with edgectl's decode attention turned off (so its int8 KV has no reader): vLLM's
    # fp8 KV holds the same blocks in half the bytes, 242221056 B: total 2369505280 B (2260 MiB) × 1.625
    # → 3673 MiB ≤ 3994 MiB.
    h = HOSTS["host-cgroup1"]
    want = ledger(QWEN17, "w4a16", 4096, h.runtime, kv="fp8")
    assert (want.kv, want.total, want.limit) == (242221056, 2369505280, 3673 * MIB) and want.limit <= h.budget
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), max_model_len=4096, decode_attention=False)
    assert (p.max_model_len, p.kv_cache_dtype) == (4096, "fp8_e4m3")
    assert (p.kv_cache_bytes, p.memory.total_bytes, p.memory.limit_bytes) == (want.kv, want.total, want.limit)
    assert p.kv_bytes_per_token == QWEN17.kv_per_token // 2
    why = reasons_by_decision(p)["kv_cache_dtype"][0]
    assert why["value"] == "fp8_e4m3" and why["source"] == "default"
    # the reason names what did not fit and the measured cost
    assert "4096 tokens do not fit with bf16 KV" in why["detail"] and "bf16 KV fits 3584 tokens" in why["detail"]
    assert "top-1 agreement 0.930" in why["detail"] and "docs/memory.md" in why["detail"]
    assert "one byte per value" in reasons_by_decision(p)["kv_cache_bytes"][0]["detail"]


def test_fp8_kv_is_never_planned_where_vllm_refuses_it():
    # The same shortfall on an AVX2-only host (vLLM's CPU attention refuses fp8 KV there): edgectl's
    # int8 KV runs there (its kernels' AVX2 level), so 4096 tokens are planned with it; past what int8
    # holds, the refusal names int8's numbers and a hint that holds; fp8 is never offered, and asking for
    # it is refused naming the reason. With edgectl's decode attention off, no one-byte KV runs at all.
    facts = with_memory(host_facts("kvm-epyc-avx2-2c"), budget_bytes=HOSTS["host-cgroup1"].budget)
    p = make_plan(facts, shape(QWEN3_17B), max_model_len=4096)
    assert (p.max_model_len, p.kv_cache_dtype) == (4096, "int8")
    with pytest.raises(EdgectlError, match=r"^qwen3-1.7b at --max-model-len 8192 does not fit: .* with int8 KV "
                                           r"\(bf16 KV needs more\).* fits with --max-model-len (\d+)$") as exc:
        make_plan(facts, shape(QWEN3_17B), max_model_len=8192)
    assert "fp8" not in exc.value.message
    hint = int(exc.value.message.rsplit(" ", 1)[1])
    assert make_plan(facts, shape(QWEN3_17B), max_model_len=hint).kv_cache_dtype == "int8"  # the hint holds
    with pytest.raises(EdgectlError, match=r"^--kv-cache-dtype fp8_e4m3 cannot run here: vLLM's CPU attention "
                                           r"refuses fp8 KV without AVX-512 or AMX"):
        make_plan(facts, shape(SMOLLM2), kv_cache_dtype="fp8_e4m3")
    p = make_plan(facts, shape(SMOLLM2))
    assert p.kv_cache_dtype == "auto"
    assert "int8 KV only when the context does not fit otherwise" in reasons_by_decision(p)["kv_cache_dtype"][0]["detail"]
    p = make_plan(facts, shape(SMOLLM2), decode_attention=False)
    assert "neither edgectl's int8 KV nor vLLM's fp8 KV can run here" in reasons_by_decision(p)["kv_cache_dtype"][0]["detail"]
    with pytest.raises(EdgectlError, match=r"^qwen3-1.7b at --max-model-len 4096 does not fit: .*"):
        make_plan(facts, shape(QWEN3_17B), max_model_len=4096, decode_attention=False)


def test_without_a_requested_context_bf16_kv_is_kept_and_a_one_byte_kv_offered_in_the_reason():
    # host-cgroup1 × Qwen3-1.7B without --max-model-len: bf16 KV fits 3584 tokens (the table);
    # the plan keeps bf16 and names the longer context int8 KV would hold (fp8 where int8 cannot run).
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B))
    assert (p.max_model_len, p.kv_cache_dtype) == (3584, "auto")
    assert "int8" not in reasons_by_decision(p)["decode_attention"][0]["detail"]  # the text plan's own default
    detail = reasons_by_decision(p)["kv_cache_dtype"][0]["detail"]
    assert "with --kv-cache-dtype int8 the budget holds 4096 tokens instead of 3584" in detail
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), decode_attention=False)
    detail = reasons_by_decision(p)["kv_cache_dtype"][0]["detail"]
    assert "with --kv-cache-dtype fp8_e4m3 the budget holds 4096 tokens instead of 3584" in detail


def test_nothing_fits_at_the_shortest_context():
    # container-cgroup2 (2755 MiB) × Qwen3-1.7B: at 512 tokens w4a16 needs
    # 671088640 + 1371260928 + KV 28 × 5 × 128 × 4096 (73400320) + RoPE 131072 + workspace 163840 × 512
    # (83886080) = 2199767040 B steady, × 1.625 → 3410 MiB
    with pytest.raises(EdgectlError) as exc:
        make_plan(host_facts("container-cgroup2"), shape(QWEN3_17B), kv_cache_dtype="auto")
    assert exc.value.message == (
        "qwen3-1.7b does not fit: needs 3410 MiB as w4a16 (the format that comes closest) (steady 2098 MiB incl. "
        "KV 70 MiB), budget is 2755 MiB; does not fit at any context: free memory, raise the cgroup limit, or "
        "pick a smaller model (`edgectl models list`)")


def test_no_memory_budget_is_refused():
    facts = with_memory(host_facts("kvm-xeon-avx512-2c"), budget_bytes=None)
    with pytest.raises(EdgectlError, match="cannot plan without a memory budget"):
        make_plan(facts, shape(SMOLLM2))


def test_a_model_without_max_position_embeddings_needs_the_flag():
    model = replace(shape(SMOLLM2), max_position_embeddings=None)
    with pytest.raises(EdgectlError, match="gives no max_position_embeddings.*pass --max-model-len"):
        make_plan(host_facts("kvm-xeon-avx512-2c"), model)
    # and with the flag it is planned (the flag is then the only maximum)
    p = make_plan(host_facts("kvm-xeon-avx512-2c"), model, max_model_len=3000)
    assert (p.max_model_len, p.rope_rows) == (3000, 3000)


# ---- concurrency ---------------------------------------------------------------------------------


def test_max_num_seqs_multiplies_the_kv_blocks():
    one = make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), max_model_len=2048)
    four = make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), max_model_len=2048, max_num_seqs=4)
    # 2048 tokens = 16 blocks of 128; 30 layers × 128 tokens × 768 B = 2949120 B per block-of-all-layers
    assert one.kv_cache_bytes == (16 * 1 + 1) * 2949120 == 50135040
    assert four.kv_cache_bytes == (16 * 4 + 1) * 2949120 == 191692800
    assert four.max_num_seqs == 4 and four.memory.total_bytes - one.memory.total_bytes == 191692800 - 50135040


def test_concurrency_shrinks_the_largest_context():
    # host-cgroup1 × Qwen3-1.7B with 2 sequences (one alone fits 3584, above): at 1792 tokens
    # KV = 28 × (14 × 2 + 1) × 128 × 4096 = 425721856; total = 671088640 + 1371260928 + 425721856 +
    # 1792 × 256 (458752) + 163840 × 512 (83886080) = 2552416256, × 1.625 → 3956 MiB ≤ 3994 MiB;
    # at 2048: KV 28 × (16 × 2 + 1) × 524288 = 484442112, total 2611202048 → 4047 MiB > budget
    h = HOSTS["host-cgroup1"]
    assert ledger(QWEN17, "w4a16", 1792, h.runtime, seqs=2).total == 2552416256
    assert ledger(QWEN17, "w4a16", 1792, h.runtime, seqs=2).limit == 3956 * MIB
    assert ledger(QWEN17, "w4a16", 2048, h.runtime, seqs=2).limit == 4047 * MIB > h.budget
    p = make_plan(host_facts("host-cgroup1"), shape(QWEN3_17B), max_num_seqs=2)
    assert (p.max_model_len, p.max_num_seqs, p.kv_cache_bytes) == (1792, 2, 425721856)
    assert "with 2 sequence(s)" in reasons_by_decision(p)["max_model_len"][0]["detail"]


def test_too_many_sequences_at_any_context_suggests_one():
    # container-cgroup2 × Qwen2.5-0.5B: 128 sequences of 512 tokens need
    # 24 × (4 × 128 + 1) × 128 × 512 B = 806879232 B of KV alone: more than the budget leaves
    with pytest.raises(EdgectlError, match=r"^qwen2.5-0.5b-instruct with --max-num-seqs 128 does not fit: .*"
                                           r"does not fit even at the shortest context: try --max-num-seqs 1$"):
        make_plan(host_facts("container-cgroup2"), shape(QWEN25_05B), max_num_seqs=128, kv_cache_dtype="auto")


def test_max_num_seqs_below_one_is_refused():
    with pytest.raises(EdgectlError, match=r"--max-num-seqs must be at least 1 \(got 0\)"):
        make_plan(host_facts("kvm-xeon-avx512-2c"), shape(SMOLLM2), max_num_seqs=0)


# ---- sliding-window layers ---------------------------------------------------------------------


def test_sliding_window_layers_hold_their_window_plus_one_batch():
    # Mistral-7B: every layer slides over 4096 tokens; per layer and block: 128 × 4096 B = 524288 B.
    # At 8192 tokens (batched 512): ceil(min(4095 + 512, 8192) / 128) + 1 = 36 + 1 = 37 blocks, + 1 null
    # → 32 × 38 × 524288 = 637534208, where Llama-3.1-8B's full attention takes 32 × 65 × 524288.
    spr = host_facts("xeon-spr-amx-2s")
    mistral = make_plan(spr, shape(MISTRAL_7B), max_model_len=8192)
    llama = make_plan(spr, shape(LLAMA31_8B), max_model_len=8192)
    assert mistral.kv_cache_bytes == 32 * 38 * 524288 == 637534208
    assert llama.kv_cache_bytes == 32 * 65 * 524288 == 1090519040
    assert mistral.kv_bytes_per_token == llama.kv_bytes_per_token == 131072
    assert "sliding-window layers hold their window (4096)" in reasons_by_decision(mistral)["kv_cache_bytes"][0]["detail"]
    # At 16384 the window part is the same ceil(min(4095 + 512, 16384) / 128) + 1 = 37 blocks (+ 1 null):
    # only full attention grows
    assert make_plan(spr, shape(MISTRAL_7B), max_model_len=16384).kv_cache_bytes == 32 * 38 * 524288


def test_below_the_window_a_sliding_layer_holds_one_block_more():
    # 2048 tokens < window: ceil(min(4095 + 512, 2048) / 128) + 1 = 17 blocks (full attention: 16),
    # because the window need not start on a block boundary (vLLM SlidingWindowSpec)
    spr = host_facts("xeon-spr-amx-2s")
    assert make_plan(spr, shape(MISTRAL_7B), max_model_len=2048).kv_cache_bytes == 32 * 18 * 524288
    assert make_plan(spr, shape(LLAMA31_8B), max_model_len=2048).kv_cache_bytes == 32 * 17 * 524288


# ---- RoPE ---------------------------------------------------------------------------------------


def test_rope_rows_follow_the_context_and_say_what_vllm_would_build():
    p = make_plan(host_facts("xeon-spr-amx-2s"), shape(LLAMA31_8B))
    # llama3 scaling keeps the table at max_position_embeddings = 131072 rows; capped: 4096 × 128 × 2 B
    assert (p.rope_rows, p.memory.rope_bytes) == (4096, 1048576)
    assert "vLLM would build 131072 rows" in reasons_by_decision(p)["rope_rows"][0]["detail"]
    assert p.levers.rope_cap is True


def test_rope_uncapped_is_the_models_full_table():
    p = make_plan(host_facts("xeon-spr-amx-2s"), shape(LLAMA31_8B), rope_cap=False)
    # 131072 × 128 × 2 B = 32 MiB (docs/facts.md, "The RoPE table": measured exactly this)
    assert (p.rope_rows, p.memory.rope_bytes, p.levers.rope_cap) == (131072, 32 * MIB, False)


def test_yarn_tables_are_original_positions_times_factor():
    model = replace(shape(QWEN3_17B), rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 32768})
    p = make_plan(host_facts("xeon-spr-amx-2s"), model, rope_cap=False)
    assert p.rope_rows == 32768 * 4  # yarn_scaling_rope.py: original × factor, not max_position_embeddings
    assert make_plan(host_facts("xeon-spr-amx-2s"), model).rope_rows == 4096


# ---- vLLM's own arithmetic as the referee ----------------------------------------------------------

_VLLM_KV = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    out = []
    for case in json.loads(sys.argv[1]):
        cfg = SimpleNamespace(max_in_flight_tokens=case["batched"],
                              model_config=SimpleNamespace(max_model_len=case["max_len"]),
                              parallel_config=SimpleNamespace(decode_context_parallel_size=1))
        kw = dict(block_size=128, num_kv_heads=case["kv_heads"], head_size=case["head_dim"], dtype=torch.bfloat16)
        spec = (SlidingWindowSpec(sliding_window=case["window"], **kw) if case["window"]
                else FullAttentionSpec(**kw))
        blocks = -(-spec.max_memory_usage_bytes(cfg) // spec.page_size_bytes)
        # the pool: every layer holds `blocks` per sequence, and the block pool keeps one null block
        out.append(case["layers"] * (blocks * case["seqs"] + 1) * spec.page_size_bytes)
    print(json.dumps(out))
""")


def test_kv_bytes_equal_what_vllm_sizes_for_each_shape():
    """Per layer, vLLM's own KV spec (the one its start-up check uses) for every shape and a few contexts."""
    python = environment.read("EDGECTL_RUNTIME_PYTHON", {})
    try:
        subprocess.run([python, "-c", "import vllm.v1.kv_cache_interface"], check=True, capture_output=True,
                       timeout=120)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        pytest.skip(f"vLLM is not importable with {python}")
    spr = host_facts("xeon-spr-amx-2s")
    cases, plans = [], []
    for name in SHAPE_NAMES:
        m = shape(name)
        for max_len, seqs in ((512, 1), (2048, 1), (4096, 2), (8192, 1)):
            if max_len > m.max_position_embeddings:
                continue
            p = make_plan(spr, m, max_model_len=max_len, max_num_seqs=seqs)
            assert len(set(m.layer_types)) == 1  # these shapes are not hybrid: one spec for every layer
            cases.append({"layers": m.num_layers, "kv_heads": m.num_kv_heads, "head_dim": m.head_dim,
                          "window": m.sliding_window if m.layer_types[0] == "sliding_attention" else None,
                          "max_len": max_len, "seqs": seqs, "batched": p.max_num_batched_tokens})
            plans.append((name, max_len, seqs, p.kv_cache_bytes))
    done = subprocess.run([python, "-c", _VLLM_KV, json.dumps(cases)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    vllm_bytes = json.loads(done.stdout.strip().splitlines()[-1])
    assert [p[3] for p in plans] == vllm_bytes, list(zip(plans, vllm_bytes))
    assert any(c["window"] for c in cases)  # the sliding-window shape was compared too
