"""How an arm's outputs are compared with a reference arm's: the scoring both sides use.

The bench compares servers over the OpenAI API (``edgectl/bench/fidelity.py`` collects) and the
runtime's offline diagnostic compares engines in-process (``edgectl_runtime.tools.diagnostics.fidelity``);
both score with these functions, on the shipped prompt set (:data:`SHIPPED_PROMPTS`). Pure Python.

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

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOP_K = 20  # vLLM's default max_logprobs
METHOD = ("top-1 agreement and mean KL(reference || arm) in nats over teacher-forced prompt positions "
          "(vLLM arms) or the next token after each prompt (llama.cpp), on the shipped prompt set; KL over "
          f"the reference's top-{TOP_K} tokens plus one 'other' bin (a lower-bound approximation of the "
          "full KL); perplexity of the shipped text from prompt_logprobs (vLLM arms only)")
Dist = dict[int, float]  # token id -> log-probability

# The prompt set shipped with edgectl (edgectl/data/prompts/fidelity.json).
SHIPPED_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "prompts" / "fidelity.json"


@dataclass(frozen=True)
class PromptSet:
    decode_prompt: str
    prompts: tuple[str, ...]
    perplexity_text: str
    source: str  # the file it was read from


def read_prompt_set(path: Path = SHIPPED_PROMPTS) -> PromptSet:
    """The prompt set in ``path``; raises OSError, ValueError, KeyError or TypeError when unreadable."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return PromptSet(str(data["decode_prompt"]), tuple(str(p) for p in data["prompts"]),
                     str(data["perplexity_text"]), str(path))


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
