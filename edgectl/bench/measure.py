"""What one pass measures through the OpenAI-compatible API, from the client's side.

- decode: one streamed completion of ``DECODE_TOKENS`` tokens with ``ignore_eos``; the rate is
  (tokens − 1) / (time of the last token event − time of the first): prefill and the first
  token are excluded.
- prefill: ``PREFILL_TOKENS`` fresh random token ids (see prompts.py) with ``max_tokens=1``,
  streamed; the rate is prompt tokens / time to first token (TTFT, measured from sending the
  request: it includes the HTTP round trip and sampling one token). The total time is recorded
  too.

Both vLLM and llama-server speak ``/v1/completions`` with ``stream_options.include_usage``;
the usage block gives the token counts, so a server that stops early or serves a prompt from
a cache is caught rather than timed.
"""

from __future__ import annotations

from typing import Any

from edgectl.client import Client
from edgectl.bench.prompts import DECODE_TOKENS


class MeasurementFailed(Exception):
    """The server answered, but not what the measurement needs (the pass is invalid)."""


def warm_up(client: Client, model: str, timeout_s: float) -> str:
    """One short generation: the server is ready when this answers with tokens."""
    data = client.post_json("/v1/completions", {"model": model, "prompt": "Hello, my name is", "max_tokens": 4,
                                                "temperature": 0}, timeout=timeout_s)
    choices = data.get("choices") or [{}]
    usage = data.get("usage") or {}
    if not usage.get("completion_tokens") and not choices[0].get("text"):
        raise MeasurementFailed(f"the warm-up generated nothing: {str(data)[:200]}")
    return str(choices[0].get("text", ""))


def decode(client: Client, model: str, prompt: str, timeout_s: float = 900) -> dict[str, Any]:
    stream = client.stream("/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": DECODE_TOKENS, "temperature": 0, "ignore_eos": True,
        "stream_options": {"include_usage": True}}, timeout=timeout_s)
    events = [(t, c) for t, c in stream.token_events() if _text(c)]
    usage = stream.usage() or {}
    tokens = usage.get("completion_tokens")
    if tokens is None:
        tokens = len(events)  # no usage block: one event per token (both servers stream that way)
    if tokens != DECODE_TOKENS:
        raise MeasurementFailed(f"decode generated {tokens} tokens, not {DECODE_TOKENS} (ignore_eos not honoured?)")
    if len(events) < 2:
        raise MeasurementFailed(f"decode streamed {len(events)} token events: cannot time between tokens")
    t_first, t_last = events[0][0], events[-1][0]
    # If a server packs several tokens per event, the tokens between the first and last
    # event are still tokens − (tokens in the first event); with one token per event that is
    # tokens − 1. Events are counted so a packed stream is visible in the record.
    between = tokens - 1
    seconds = t_last - t_first
    return {
        "decode_tok_s": between / seconds if seconds > 0 else None,
        "tokens": tokens, "events": len(events), "seconds_first_to_last": seconds,
        "ttft_s": t_first - stream.t_sent, "total_s": stream.chunks[-1][0] - stream.t_sent,
        "method": f"streamed {DECODE_TOKENS} tokens with ignore_eos; (tokens − 1) / (last − first token event)",
    }


def prefill(client: Client, model: str, token_ids: list[int], timeout_s: float = 900) -> dict[str, Any]:
    stream = client.stream("/v1/completions", {
        "model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0,
        "stream_options": {"include_usage": True}}, timeout=timeout_s)
    events = stream.token_events()
    if not events:
        raise MeasurementFailed("the prefill request streamed no token")
    usage = stream.usage() or {}
    prompt_tokens = usage.get("prompt_tokens", len(token_ids))
    if prompt_tokens != len(token_ids):
        raise MeasurementFailed(f"the server counted {prompt_tokens} prompt tokens, {len(token_ids)} were sent")
    ttft = events[0][0] - stream.t_sent
    total = stream.chunks[-1][0] - stream.t_sent
    out: dict[str, Any] = {
        "prefill_tok_s": prompt_tokens / ttft if ttft > 0 else None,
        "tokens": prompt_tokens, "ttft_s": ttft, "total_s": total,
        "method": f"{len(token_ids)} fresh random token ids, max_tokens=1, streamed; prompt tokens / TTFT",
    }
    # A prompt served from a cache would be a measurement of the cache (docs/facts.md):
    # where the server says how many prompt tokens it computed or found cached, check it.
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    timings = events[-1][1].get("timings") or stream.chunks[-1][1].get("timings") or {}
    if timings.get("cache_n"):
        cached = timings["cache_n"]
    if cached:
        raise MeasurementFailed(f"{cached} of the {prompt_tokens} prompt tokens came from the prefix cache")
    out["cached_tokens"] = cached
    return out


def _text(chunk: dict[str, Any]) -> bool:
    choice = (chunk.get("choices") or [{}])[0]
    return bool(choice.get("text"))
