"""What one vision pass measures through the OpenAI chat completions API, from the client's side.

Every request is ``POST /v1/chat/completions``, streamed, greedy (``temperature`` 0), with
``ignore_eos`` so each answer is ``DECODE_TOKENS`` tokens long, and ``stream_options.include_usage``
so the server's own token counts are read (vLLM and llama-server both send them). An image is a
fresh 512×512 PNG (images.py) as a ``data:`` URI in an ``image_url`` part before the question.

- one image: time to first token (TTFT) from sending the request to the first token event — it
  holds the image's decoding, the tower, the connector and the prompt's prefill; then the decode
  rate with the image in context, (tokens − 1) / (last − first token event), as the text bench's
  decode (bench/measure.py);
- text-only: the same question without the image, the same decode rate: the pair says what an
  image in context costs each decoded token. One pair per pass was at the mercy of a busy host (a
  pass read 0.45× and the next 1.01× on one server), so a pass takes ``DECODE_PAIRS`` adjacent
  pairs, which goes first alternating, each image fresh (``decode_pairs``); its figures are the
  medians, its ratio the median of the pairs' own ratios;
- four at once: ``CONCURRENT_IMAGES`` such requests, each with its own image, sent together
  (bench/measure.py's ``at_once``); the aggregate is every answer's tokens over the span from the
  first request sent to the last token (image work included: what a client sending four camera
  frames gets), with each stream's TTFT and decode rate beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edgectl.bench import stats
from edgectl.bench.measure import MeasurementFailed, at_once
from edgectl.bench.vision import images
from edgectl.client import Client

QUESTION = "What is in this image? Answer in one sentence."
# Tokens per answer: enough events to time decode between them, few enough that a pass's image
# work (prefill of ~1140 prompt tokens on the shape model) stays most of its time.
DECODE_TOKENS = 64
CONCURRENT_IMAGES = 4  # issue 34: 4 requests with images at once
DECODE_PAIRS = 3  # image / text-only decode pairs per pass (the first image's request is the first pair's)
WARM_UP_TOKENS = 4
# perf_counter() readings: meaningless outside the process that took them
CLOCK_READINGS = ("t_sent", "t_first", "t_last")


def chat_body(model: str, question: str, image: bytes | None, max_tokens: int) -> dict[str, Any]:
    """A greedy chat completion of exactly ``max_tokens`` tokens, with the image before the question."""
    content: list[dict[str, Any]] = []
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": images.data_uri(image)}})
    content.append({"type": "text", "text": question})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}


def warm_up(client: Client, model: str, image: bytes, timeout_s: float) -> str:
    """One short answer about an image: a server is ready for this bench when it gives one."""
    body = chat_body(model, QUESTION, image, WARM_UP_TOKENS)
    body.pop("stream_options")  # not streamed
    data = client.post_json("/v1/chat/completions", body, timeout=timeout_s)
    choice = (data.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content")
    if not text and not (data.get("usage") or {}).get("completion_tokens"):
        raise MeasurementFailed(f"the warm-up about an image answered nothing: {str(data)[:200]}")
    return str(text or "")


def chat_stream(client: Client, model: str, image: bytes | None, timeout_s: float = 900) -> dict[str, Any]:
    """One streamed answer of ``DECODE_TOKENS`` tokens: its TTFT, decode rate and token counts."""
    stream = client.stream("/v1/chat/completions", chat_body(model, QUESTION, image, DECODE_TOKENS),
                           timeout=timeout_s)
    events = [(t, c) for t, c in stream.token_events() if _content(c)]
    usage = stream.usage() or {}
    tokens = usage.get("completion_tokens", len(events))  # no usage block: one event per token
    if tokens != DECODE_TOKENS:
        raise MeasurementFailed(f"the answer was {tokens} tokens, not {DECODE_TOKENS} (ignore_eos not honoured?)")
    if len(events) < 2:
        raise MeasurementFailed(f"the answer streamed {len(events)} token events: cannot time between tokens")
    t_first, t_last = events[0][0], events[-1][0]
    seconds = t_last - t_first
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_s": t_first - stream.t_sent, "decode_tok_s": (tokens - 1) / seconds if seconds > 0 else None,
        "tokens": tokens, "events": len(events), "prompt_tokens": usage.get("prompt_tokens"),
        # a prompt prefix the server kept from an earlier request (the chat template's first tokens
        # can be; a fresh image cannot): recorded, so a TTFT served from a cache shows
        "cached_tokens": details.get("cached_tokens"), "with_image": image is not None,
        "t_sent": stream.t_sent, "t_first": t_first, "t_last": t_last,
    }


def one_image(client: Client, model: str, image: bytes) -> dict[str, Any]:
    return without_clock(chat_stream(client, model, image))


def text_only(client: Client, model: str) -> dict[str, Any]:
    return without_clock(chat_stream(client, model, None))


def decode_pairs(client: Client, model: str, first: dict[str, Any], pictures: Sequence[bytes]) -> dict[str, Any]:
    """Decode with an image in context against text-only, as adjacent pairs: ``first`` (the pass's one-image
    request, already made) and a text-only answer, then one pair per picture, the order alternating (text
    first, then image first, …) so that a host slowing during a pass moves both halves of a pair alike."""
    pairs = [(first, text_only(client, model))]
    for k, picture in enumerate(pictures, start=1):
        if k % 2:  # text first
            text = text_only(client, model)
            image = one_image(client, model, picture)
        else:
            image = one_image(client, model, picture)
            text = text_only(client, model)
        pairs.append((image, text))
    image_rates, text_rates = [i["decode_tok_s"] for i, _ in pairs], [t["decode_tok_s"] for _, t in pairs]
    return {
        "pairs": [{"image": i, "text": t} for i, t in pairs],
        "decode_image_tok_s": stats.median(image_rates), "decode_text_tok_s": stats.median(text_rates),
        "image_text_decode_ratio": stats.median([stats.ratio(i, t) for i, t in zip(image_rates, text_rates)]),
        "method": (f"{len(pairs)} pairs of {DECODE_TOKENS}-token answers, one with a fresh image, one text-only, "
                   "adjacent, which goes first alternating; decode rates the medians, the ratio the median of the "
                   "pairs' image / text-only"),
    }


def together(client: Client, model: str, pictures: Sequence[bytes], timeout_s: float = 1800) -> dict[str, Any]:
    """``len(pictures)`` answers about an image each, sent at once; the aggregate tokens per second."""
    def ask(picture: bytes) -> Callable[[], dict[str, Any]]:
        return lambda: chat_stream(client, model, picture, timeout_s)

    done = at_once([ask(p) for p in pictures], timeout_s, lambda i: f"request {i + 1}", what="requests with an image")
    first_sent, last_token = min(r["t_sent"] for r in done), max(r["t_last"] for r in done)
    span = last_token - first_sent
    tokens = sum(r["tokens"] for r in done)
    return {
        "aggregate_tok_s": tokens / span if span > 0 else None, "requests": len(done), "tokens": tokens,
        "span_s": span, "ttft_s": [r["ttft_s"] for r in done], "stream_decode_tok_s": [r["decode_tok_s"] for r in done],
        "prompt_tokens": [r["prompt_tokens"] for r in done],
        "method": (f"{len(done)} streamed chat completions of {DECODE_TOKENS} tokens, each with its own 512×512 image, "
                   "sent at once; all answers' tokens / (first request sent → last token)"),
    }


def without_clock(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in CLOCK_READINGS}


def _content(chunk: dict[str, Any]) -> bool:
    choice = (chunk.get("choices") or [{}])[0]
    return bool((choice.get("delta") or {}).get("content"))
