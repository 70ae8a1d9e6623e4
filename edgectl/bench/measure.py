"""What one pass measures through the OpenAI-compatible API, from the client's side.

- decode: one streamed completion of ``DECODE_TOKENS`` tokens with ``ignore_eos``; the rate is
  (tokens − 1) / (time of the last token event − time of the first): prefill and the first
  token are excluded.
- decode at a long context: the same, after a prompt of ``long_context_tokens`` fresh random token
  ids (prompts.py); the prompt's prefill is outside the timed span, and a prompt the server found
  in its prefix cache fails the pass, as for prefill.
- prefill: ``PREFILL_TOKENS`` fresh random token ids (see prompts.py) with ``max_tokens=1``,
  streamed; the rate is prompt tokens / time to first token (TTFT, measured from sending the
  request: it includes the HTTP round trip and sampling one token). The total time is recorded
  too.

- concurrent decode (``--concurrency N``, N > 1): N streamed completions of ``DECODE_TOKENS``
  tokens with ``ignore_eos``, sent at once from N threads, each on its own prompt. Each stream's
  rate is taken as for one stream; the aggregate is their sum, quoted only when the streams ran
  together: every stream's span between its first and last token must lie at least
  ``MIN_OVERLAP`` inside the window where all N were decoding, or the server served them one
  after another (a queue, not a batch) and the pass is invalid. The whole-request throughput
  (N × tokens / first send to last token) is recorded beside it.

Both vLLM and llama-server speak ``/v1/completions`` with ``stream_options.include_usage``;
the usage block gives the token counts, so a server that stops early or serves a prompt from
a cache is caught rather than timed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from edgectl.bench.prompts import DECODE_TOKENS
from edgectl.client import Client, HttpFailed

# The share of each stream's decode span that must overlap every other stream's (concurrent_decode).
MIN_OVERLAP = 0.8


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


def decode(client: Client, model: str, prompt: str | list[int], timeout_s: float = 900) -> dict[str, Any]:
    """One stream of DECODE_TOKENS; ``prompt`` as text, or token ids (then the server must have
    counted them all and computed none from its prefix cache)."""
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
    if isinstance(prompt, list):
        _check_prompt_tokens(usage, len(prompt), "decode")
        _refuse_cached(usage, events, stream, len(prompt))
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
        "t_sent": stream.t_sent, "t_first": t_first, "t_last": t_last,
        "method": (f"streamed {DECODE_TOKENS} tokens with ignore_eos"
                   + (f" after {len(prompt)} fresh random token ids" if isinstance(prompt, list) else "")
                   + "; (tokens − 1) / (last − first token event)"),
    }


def at_once(calls: Sequence[Callable[[], dict[str, Any]]], timeout_s: float, name: Callable[[int], str], *,
            what: str) -> list[dict[str, Any]]:
    """Every call started together (one thread each, released by one barrier); their results, in
    order. A call that failed or gave no answer before the timeout fails the whole measurement,
    naming it (an HTTP failure as it is)."""
    n = len(calls)
    results: list[dict[str, Any] | BaseException | None] = [None] * n
    start = threading.Barrier(n)

    def one(i: int) -> None:
        try:
            start.wait(timeout=60)
            results[i] = calls[i]()
        except (HttpFailed, MeasurementFailed, OSError, threading.BrokenBarrierError) as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 120)
    failed = [(i, r) for i, r in enumerate(results) if not isinstance(r, dict)]
    if failed:
        i, r = failed[0]
        if isinstance(r, HttpFailed):
            raise r
        raise MeasurementFailed(f"{len(failed)} of {n} concurrent {what} failed; {name(i)}: "
                                f"{r if r is not None else 'no answer before the timeout'}")
    return [r for r in results if isinstance(r, dict)]


def concurrent_decode(client: Client, model: str, prompts: list[str], timeout_s: float = 900) -> dict[str, Any]:
    """``len(prompts)`` decode streams at once; the aggregate rate of the streams that overlapped."""
    n = len(prompts)
    streams = at_once([lambda i=i: decode(client, model, prompts[i], timeout_s) for i in range(n)], timeout_s,
                      lambda i: f"stream {i + 1}", what="streams")
    firsts = [s["t_first"] for s in streams]
    lasts = [s["t_last"] for s in streams]
    together = min(lasts) - max(firsts)  # the window in which every stream was decoding
    overlaps = [max(0.0, together) / (s["t_last"] - s["t_first"]) if s["t_last"] > s["t_first"] else 0.0
                for s in streams]
    if min(overlaps) < MIN_OVERLAP:
        raise MeasurementFailed(
            f"the {n} streams did not decode together (the least overlapping spent {min(overlaps):.0%} of its "
            f"decode with all others, {MIN_OVERLAP:.0%} needed): the server queued them instead of batching")
    rates = [s["decode_tok_s"] for s in streams]
    t_sent = min(s["t_sent"] for s in streams)
    tokens = sum(s["tokens"] for s in streams)
    return {
        "aggregate_decode_tok_s": sum(rates) if all(r is not None for r in rates) else None,
        "streams": n, "stream_decode_tok_s": rates, "min_overlap": min(overlaps),
        "tokens": tokens, "total_tok_s": tokens / (max(lasts) - t_sent) if max(lasts) > t_sent else None,
        "ttft_s": [s["ttft_s"] for s in streams],
        "method": (f"{n} streams of {DECODE_TOKENS} tokens with ignore_eos sent at once, one prompt each; "
                   f"sum of the streams' (tokens − 1) / (last − first token event), each stream ≥ "
                   f"{MIN_OVERLAP:.0%} inside the window all were decoding"),
    }


def prefill(client: Client, model: str, token_ids: list[int], timeout_s: float = 900) -> dict[str, Any]:
    stream = client.stream("/v1/completions", {
        "model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0,
        "stream_options": {"include_usage": True}}, timeout=timeout_s)
    events = stream.token_events()
    if not events:
        raise MeasurementFailed("the prefill request streamed no token")
    usage = stream.usage() or {}
    prompt_tokens = _check_prompt_tokens(usage, len(token_ids), "prefill")
    ttft = events[0][0] - stream.t_sent
    total = stream.chunks[-1][0] - stream.t_sent
    out: dict[str, Any] = {
        "prefill_tok_s": prompt_tokens / ttft if ttft > 0 else None,
        "tokens": prompt_tokens, "ttft_s": ttft, "total_s": total,
        "method": f"{len(token_ids)} fresh random token ids, max_tokens=1, streamed; prompt tokens / TTFT",
    }
    out["cached_tokens"] = _refuse_cached(usage, events, stream, prompt_tokens)
    return out


def _check_prompt_tokens(usage: dict[str, Any], sent: int, what: str) -> int:
    """The prompt tokens the server counted, which must be the ``sent`` token ids."""
    counted = usage.get("prompt_tokens", sent)
    if counted != sent:
        raise MeasurementFailed(f"the server counted {counted} prompt tokens of the {what} prompt, {sent} were sent")
    return int(counted)


def _refuse_cached(usage: dict[str, Any], events: list[Any], stream: Any, prompt_tokens: int) -> Any:
    """A prompt served from a cache would be a measurement of the cache (docs/facts.md): where the
    server says how many prompt tokens it found cached, none may have been; what it said."""
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    timings = (events[-1][1].get("timings") if events else None) or stream.chunks[-1][1].get("timings") or {}
    if timings.get("cache_n"):
        cached = timings["cache_n"]
    if cached:
        raise MeasurementFailed(f"{cached} of the {prompt_tokens} prompt tokens came from the prefix cache")
    return cached


def _text(chunk: dict[str, Any]) -> bool:
    choice = (chunk.get("choices") or [{}])[0]
    return bool(choice.get("text"))
