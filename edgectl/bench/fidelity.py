"""Fidelity of an arm's outputs against the reference arm (bf16), through the OpenAI API.

Collected per pass, on the shipped prompt set (``edgectl/data/prompts/fidelity.json``):

- vLLM arms: each prompt (and the perplexity text) is tokenized with ``POST /tokenize``, then
  sent to ``/v1/completions`` with ``max_tokens=1``, ``prompt_logprobs=K`` and ``logprobs=K``
  (``return_tokens_as_token_ids``): the top-K log-probabilities at every prompt position
  (teacher-forced) and at the next token.
- llama.cpp: ``POST /tokenize`` then ``POST /completion`` with ``n_probs=K``: the next token
  only (llama-server has no prompt log-probabilities), so it is compared on next tokens only
  and has no perplexity.

Compared with the reference arm's first valid pass, position by position, where both
tokenized the prompt to the same ids:

- top-1 agreement: the share of positions whose most likely token is the same;
- mean KL(reference ‖ arm) in nats, **approximated over top-K**: both distributions are
  coarsened to K + 1 bins — the reference's K most likely tokens and "everything else". A
  token of the reference's top-K missing from the arm's top-K gets the arm's unlisted mass
  shared equally among the missing ones, capped at the arm's K-th probability (it cannot be
  more likely than that). Coarsening never increases KL (data-processing inequality), so
  with exact bin masses this is a lower bound of the true KL;
- perplexity of the short text: exp(−mean log p(actual token)) over its positions after
  the first, from ``prompt_logprobs`` (vLLM arms only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgectl.client import Client
from edgectl.bench.prompts import PromptSet

TOP_K = 20  # vLLM's default max_logprobs
METHOD = ("top-1 agreement and mean KL(reference || arm) in nats over teacher-forced prompt positions "
          "(vLLM arms) or the next token after each prompt (llama.cpp), on the shipped prompt set; KL over "
          f"the reference's top-{TOP_K} tokens plus one 'other' bin (a lower-bound approximation of the "
          "full KL); perplexity of the shipped text from prompt_logprobs (vLLM arms only)")
Dist = dict[int, float]  # token id -> log-probability


def collect_vllm(client: Client, model: str, prompts: PromptSet, k: int = TOP_K) -> dict[str, Any]:
    """Per prompt: token ids, teacher-forced top-K per position, next-token top-K."""
    items = []
    for text in [*prompts.prompts, prompts.perplexity_text]:
        ids = client.post_json("/tokenize", {"model": model, "prompt": text}, timeout=60)["tokens"]
        data = client.post_json("/v1/completions", {
            "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": k,
            "prompt_logprobs": k, "return_tokens_as_token_ids": True}, timeout=600)
        choice = data["choices"][0]
        positions: list[Dist | None] = []
        for entry in choice.get("prompt_logprobs") or []:
            positions.append(None if entry is None else {int(t): float(v["logprob"]) for t, v in entry.items()})
        top = (choice.get("logprobs") or {}).get("top_logprobs") or [{}]
        nxt = {_token_id(t): float(lp) for t, lp in (top[0] or {}).items()}
        items.append({"ids": ids, "positions": positions, "next": nxt})
    return {"method": "vllm-prompt-logprobs", "k": k, "prompts": items[:-1], "perplexity": items[-1]}


def collect_llama(client: Client, prompts: PromptSet, k: int = TOP_K) -> dict[str, Any]:
    items = []
    for text in prompts.prompts:
        ids = client.post_json("/tokenize", {"content": text, "add_special": True}, timeout=60)["tokens"]
        data = client.post_json("/completion", {"prompt": ids, "n_predict": 1, "n_probs": k, "temperature": 0,
                                                "cache_prompt": False}, timeout=600)
        # None when the next token is end-of-generation: llama-server then reports no probabilities
        probs = (data.get("completion_probabilities") or [{}])[0]
        top = probs.get("top_logprobs")
        if top is not None:
            nxt = {int(e["id"]): float(e["logprob"]) for e in top}
        else:  # older llama-server: probabilities, not log-probabilities
            nxt = {int(e["id"]): math.log(max(float(e["prob"]), 1e-30)) for e in probs.get("probs") or []}
        items.append({"ids": [int(i) for i in ids], "positions": None, "next": nxt})
    return {"method": "llama-next-token", "k": k, "prompts": items, "perplexity": None}


def _token_id(key: str) -> int:
    return int(key.split(":", 1)[1]) if key.startswith("token_id:") else int(key)


# -- comparison ------------------------------------------------------------------------------------


def kl_topk(ref: Dist, arm: Dist, k: int = TOP_K) -> float:
    """KL(ref ‖ arm) over the reference's top-k tokens plus an "other" bin (see module docstring)."""
    top = sorted(ref.items(), key=lambda kv: kv[1], reverse=True)[:k]
    arm_sorted = sorted(arm.items(), key=lambda kv: kv[1], reverse=True)[:k]
    arm_listed = dict(arm_sorted)
    arm_min_p = math.exp(arm_sorted[-1][1]) if arm_sorted else 0.0
    arm_unlisted = max(0.0, 1.0 - sum(math.exp(lp) for lp in arm_listed.values()))
    missing = [t for t, _ in top if t not in arm_listed]
    share = min(arm_min_p, arm_unlisted / len(missing)) if missing else 0.0
    eps = 1e-12
    kl = 0.0
    p_sum = q_sum = 0.0
    for t, lp in top:
        p = math.exp(lp)
        q = math.exp(arm_listed[t]) if t in arm_listed else share
        q = max(q, eps)
        kl += p * (lp - math.log(q))
        p_sum += p
        q_sum += q
    p_rest, q_rest = max(1.0 - p_sum, eps), max(1.0 - q_sum, eps)
    kl += p_rest * math.log(p_rest / q_rest)
    return max(kl, 0.0)


def top1(d: Dist) -> int | None:
    return max(d.items(), key=lambda kv: kv[1])[0] if d else None


def perplexity(item: Mapping[str, Any] | None) -> float | None:
    """exp(−mean log p) of the text's own tokens, positions 1..n−1 (position 0 has no context)."""
    if not item or not item.get("positions"):
        return None
    ids, positions = item["ids"], item["positions"]
    lps = []
    for i in range(1, min(len(ids), len(positions))):
        d = positions[i]
        if d is None or ids[i] not in d:
            return None  # vLLM always includes the actual token; anything else is unreadable
        lps.append(d[ids[i]])
    return math.exp(-sum(lps) / len(lps)) if lps else None


def compare(reference: Mapping[str, Any], arm: Mapping[str, Any]) -> dict[str, Any]:
    """Top-1 agreement and mean KL of ``arm`` against ``reference`` (both from collect_*)."""
    k = min(int(reference.get("k", TOP_K)), int(arm.get("k", TOP_K)))
    tf_agree = tf_n = 0
    tf_kl: list[float] = []
    nx_agree = nx_n = 0
    nx_kl: list[float] = []
    differently_tokenized = 0
    for ref_item, item in zip(reference["prompts"], arm["prompts"]):
        if list(ref_item["ids"]) != list(item["ids"]):
            differently_tokenized += 1
            continue
        if ref_item.get("positions") and item.get("positions"):
            for rd, ad in zip(ref_item["positions"], item["positions"]):
                if not rd or not ad:
                    continue
                rd_top, ad_top = _topk(rd, k), _topk(ad, k)
                tf_n += 1
                tf_agree += top1(rd_top) == top1(ad_top)
                tf_kl.append(kl_topk(rd_top, ad_top, k))
        if ref_item.get("next") and item.get("next"):
            nx_n += 1
            nx_agree += top1(ref_item["next"]) == top1(item["next"])
            nx_kl.append(kl_topk(ref_item["next"], item["next"], k))
    teacher_forced = tf_n > 0
    return {
        "top1_agreement": (tf_agree / tf_n) if teacher_forced else (nx_agree / nx_n if nx_n else None),
        "mean_kl": (sum(tf_kl) / tf_n) if teacher_forced else (sum(nx_kl) / nx_n if nx_n else None),
        "positions": tf_n if teacher_forced else nx_n,
        "over": "teacher-forced prompt positions" if teacher_forced else "next token after each prompt",
        "next_token_top1_agreement": nx_agree / nx_n if nx_n else None,
        "next_token_mean_kl": sum(nx_kl) / nx_n if nx_n else None,
        "next_token_prompts": nx_n,
        "prompts_tokenized_differently": differently_tokenized,
        "k": k,
    }


def _topk(d: Dist, k: int) -> Dist:
    """The k most likely entries (vLLM adds the actual prompt token to its top-k)."""
    return dict(sorted(d.items(), key=lambda kv: kv[1], reverse=True)[:k])


def summary(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What a pass records of its own outputs (the raw log-probabilities stay out of the artifact)."""
    nxt = [top1(item["next"]) for item in raw["prompts"]]
    # llama-server returns no probabilities when the next token ends generation (end of text)
    return {"method": raw["method"], "k": raw["k"], "prompts": len(raw["prompts"]),
            "perplexity": perplexity(raw.get("perplexity")), "next_token_ids": nxt,
            "next_token_unavailable": sum(1 for t in nxt if t is None)}

