"""The prompts a bench run sends: the shipped fidelity set, and fresh prompts per pass (the prefill
prompt, and the long context decode is measured after).

vLLM enables prefix caching by default and serves a repeated prompt from its cache: a prefill
benchmark that sends the same prompt twice measures the cache, not the prefill (a mistake
made and retracted here once, docs/facts.md). So every pass of every arm gets
its own prompt of random token ids, generated deterministically from the run's seed and the
pass's position in the grid (``order``, unique across arms and passes): a run can be
reproduced exactly, and no two passes of one run share even their first KV block.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache

from edgectl.contract.fidelity import SHIPPED_PROMPTS, PromptSet, read_prompt_set
from edgectl.errors import EdgectlError

PREFILL_TOKENS = 512
DECODE_TOKENS = 128
# The context of the long-context decode: a chat with some history. Decode there reads the KV of
# every earlier token at each step (SmolLM2: 2048 x 30 layers x 2 x 3 heads x 64 x 2 B = 47 MB a
# token, half its weights), so attention, not only the weights, sets the rate.
LONG_CONTEXT_TOKENS = 2048
# Token ids below this are left out of random prompts: the special and byte-level tokens
# of small BPE vocabularies sit at the start (SmolLM2's <|endoftext|>, <|im_start|>, ...).
FIRST_ORDINARY_TOKEN = 256


@lru_cache(maxsize=1)
def prompt_set() -> PromptSet:
    path = SHIPPED_PROMPTS
    try:
        return read_prompt_set(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgectlError(f"{path}: the shipped prompt set cannot be read ({exc}): reinstall edgectl") from None


def prefill_token_ids(seed: int, order: int, vocab_size: int, n: int = PREFILL_TOKENS, *,
                      purpose: str = "prefill") -> list[int]:
    """``n`` random token ids for the pass at grid position ``order`` of a run seeded ``seed``;
    another ``purpose`` (``long-context``) draws another prompt for the same pass."""
    if vocab_size <= FIRST_ORDINARY_TOKEN + n:
        raise ValueError(f"vocabulary of {vocab_size} tokens is too small for random prompts")
    digest = hashlib.sha256(f"edgectl-bench-{purpose}:{seed}:{order}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return [rng.randrange(FIRST_ORDINARY_TOKEN, vocab_size) for _ in range(n)]


def long_context_tokens(max_model_len: int) -> int:
    """The long-context decode's prompt length in a context of ``max_model_len``: LONG_CONTEXT_TOKENS,
    or what leaves room for the decode's DECODE_TOKENS; 0 (not measured) when that is no longer
    than the prefill prompt."""
    n = min(LONG_CONTEXT_TOKENS, max_model_len - DECODE_TOKENS - 1)
    return n if n > PREFILL_TOKENS else 0


def ids_digest(ids: list[int]) -> str:
    """A short fingerprint of a prompt, recorded with each pass so reuse would be visible."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]
