"""Fidelity of an arm's outputs against the reference arm (bf16), through the OpenAI API.

Collected per pass, on the shipped prompt set (``edgectl/data/prompts/fidelity.json``):

- vLLM arms: each prompt (and the perplexity text) is tokenized with ``POST /tokenize``, then
  sent to ``/v1/completions`` with ``max_tokens=1``, ``prompt_logprobs=K`` and ``logprobs=K``
  (``return_tokens_as_token_ids``): the top-K log-probabilities at every prompt position
  (teacher-forced) and at the next token.
- llama.cpp: ``POST /tokenize`` then ``POST /completion`` with ``n_probs=K``: the next token
  only (llama-server has no prompt log-probabilities), so it is compared on next tokens only
  and has no perplexity.

Scored by ``edgectl/contract/fidelity.py`` (shared with the runtime's offline diagnostic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgectl.client import Client
from edgectl.contract.fidelity import TOP_K, Dist, PromptSet, perplexity, top1


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


def summary(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What a pass records of its own outputs (the raw log-probabilities stay out of the artifact)."""
    nxt = [top1(item["next"]) for item in raw["prompts"]]
    # llama-server returns no probabilities when the next token ends generation (end of text)
    return {"method": raw["method"], "k": raw["k"], "prompts": len(raw["prompts"]),
            "perplexity": perplexity(raw.get("perplexity")), "next_token_ids": nxt,
            "next_token_unavailable": sum(1 for t in nxt if t is None)}

