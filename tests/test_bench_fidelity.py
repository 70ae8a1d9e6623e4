"""The fidelity arithmetic of `edgectl bench`: top-K KL, top-1 agreement, perplexity."""

from __future__ import annotations

import math

import pytest

from edgectl.contract import fidelity as fid


def lp(probs: dict[int, float]) -> dict[int, float]:
    return {t: math.log(p) for t, p in probs.items()}


def test_kl_of_a_distribution_with_itself_is_zero() -> None:
    d = lp({1: 0.5, 2: 0.3, 3: 0.1})
    assert fid.kl_topk(d, d) == pytest.approx(0.0, abs=1e-12)


def test_kl_over_the_top_k_bins_plus_the_rest_matches_the_closed_form() -> None:
    ref = lp({1: 0.6, 2: 0.3})  # 0.1 left over
    arm = lp({1: 0.3, 2: 0.6})  # 0.1 left over
    want = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6) + 0.1 * math.log(0.1 / 0.1)
    assert fid.kl_topk(ref, arm) == pytest.approx(want)
    # a token of the reference's top-k the arm did not list: its probability is the arm's unlisted
    # mass shared among the missing, capped at the arm's smallest listed probability
    ref = lp({1: 0.5, 2: 0.4})
    arm = lp({1: 0.5, 3: 0.45})  # unlisted 0.05, one token missing -> q(2) = min(0.45, 0.05) = 0.05
    q2 = 0.05
    want = 0.4 * math.log(0.4 / q2) + 0.1 * math.log(0.1 / max(1 - 0.5 - q2, 1e-12))
    assert fid.kl_topk(ref, arm) == pytest.approx(want)
    assert fid.kl_topk(ref, arm) > fid.kl_topk(ref, lp({1: 0.5, 2: 0.35, 3: 0.1}))


def test_the_top_k_view_never_exceeds_the_full_kl() -> None:
    # coarsening into bins cannot increase KL (data-processing inequality)
    ref_full = {i: w for i, w in enumerate([0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.05])}
    arm_full = {i: w for i, w in enumerate([0.2, 0.25, 0.1, 0.15, 0.1, 0.05, 0.1, 0.05])}
    full = sum(p * math.log(p / arm_full[i]) for i, p in ref_full.items())
    top3 = lambda d: lp(dict(sorted(d.items(), key=lambda kv: -kv[1])[:3]))  # noqa: E731
    arm_top_with_actual = {**top3(arm_full), 2: math.log(arm_full[2])}  # exact masses for the bins
    assert fid.kl_topk(top3(ref_full), arm_top_with_actual, k=4) <= full + 1e-12


def raw(positions_per_prompt: list[list[dict[int, float]]], nexts: list[dict[int, float]], ids=None) -> dict:
    prompts = []
    for n, (pos, nxt) in enumerate(zip(positions_per_prompt, nexts)):
        prompts.append({"ids": ids[n] if ids else list(range(len(pos) + 1)), "positions": [None, *pos], "next": nxt})
    return {"method": "vllm-prompt-logprobs", "k": 20, "prompts": prompts, "perplexity": None}


def test_agreement_and_kl_over_teacher_forced_positions() -> None:
    a = lp({1: 0.6, 2: 0.4})
    b = lp({1: 0.4, 2: 0.6})
    ref = raw([[a, a], [a]], [a, a])
    same = fid.compare(ref, ref)
    assert same["top1_agreement"] == 1.0 and same["mean_kl"] == pytest.approx(0.0, abs=1e-12)
    assert same["positions"] == 3 and same["over"] == "teacher-forced prompt positions"
    other = fid.compare(ref, raw([[a, b], [b]], [a, b]))
    assert other["top1_agreement"] == pytest.approx(1 / 3)
    assert other["next_token_top1_agreement"] == 0.5
    assert other["mean_kl"] == pytest.approx(2 / 3 * fid.kl_topk(a, b))


def test_prompts_tokenized_differently_are_not_compared() -> None:
    a = lp({1: 0.6, 2: 0.4})
    ref = raw([[a], [a]], [a, a], ids=[[5, 6], [7, 8]])
    arm = raw([[a], [a]], [a, a], ids=[[5, 6], [7, 9]])
    out = fid.compare(ref, arm)
    assert out["prompts_tokenized_differently"] == 1 and out["positions"] == 1


def test_next_token_only_arms_are_compared_on_next_tokens() -> None:
    a, b = lp({1: 0.6, 2: 0.4}), lp({1: 0.4, 2: 0.6})
    ref = raw([[a], [a]], [a, a])
    llama = {"method": "llama-next-token", "k": 20, "perplexity": None,
             "prompts": [{"ids": p["ids"], "positions": None, "next": n} for p, n in zip(ref["prompts"], [a, b])]}
    out = fid.compare(ref, llama)
    assert out["over"] == "next token after each prompt"
    assert out["top1_agreement"] == 0.5 and out["positions"] == 2


def test_perplexity_of_the_text_from_its_own_tokens() -> None:
    ids = [10, 11, 12]
    positions = [None, {11: math.log(0.5), 99: math.log(0.3)}, {12: math.log(0.25)}]
    assert fid.perplexity({"ids": ids, "positions": positions}) == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.25)) / 2))
    assert fid.perplexity({"ids": ids, "positions": [None, {99: -1.0}, {12: -1.0}]}) is None
    assert fid.perplexity(None) is None
