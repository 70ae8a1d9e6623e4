"""``edgectl bench --soak SECONDS``: mixed requests for a while, the server's memory sampled as it goes.

What a service sees over hours, in minutes: up to ``SOAK_CLIENTS`` clients at once, each sending
in turn a chat question, a plain completion, a streamed completion of random length, a prompt of
fresh random token ids (never served from the prefix cache), and now and then a stream it drops
after a few tokens (the server must free that sequence). Every request's outcome is counted;
one that fails is an error of the soak (a refusal, a dropped answer), never retried.

The memory is the PSS of the server's whole process tree, sampled every ``SAMPLE_EVERY_S`` (more
often in a soak shorter than ``SAMPLES`` of those: at least ``SAMPLES`` samples). The
first ``SETTLE_FRACTION`` of the soak is its settling time (allocator pools and caches fill up
as request shapes vary); drift compares the median of the last ``WINDOW_FRACTION`` of the samples
with the median of the window right after settling: (last − settled) / settled. A leak shows as
a drift that grows with the soak's length; the figure is printed, never asserted in a test.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from edgectl.bench import stats
from edgectl.client import Client, HttpFailed

SOAK_CLIENTS = 3
SAMPLE_EVERY_S = 5.0
SAMPLES = 50
SETTLE_FRACTION = 0.2
WINDOW_FRACTION = 0.2
KINDS = ("chat", "completion", "stream", "fresh-prompt", "dropped-stream")


def soak(client: Client, model: str, seconds: float, sample_pss: Callable[[], int], prompts: list[str],
         vocab_size: int, seed: int, max_tokens: int = 128, clients: int = SOAK_CLIENTS) -> dict[str, Any]:
    """Run the soak; its counts, the PSS samples (seconds since start, bytes) and the drift."""
    t0 = time.monotonic()
    deadline = t0 + seconds
    counts = {k: 0 for k in KINDS}
    errors: list[str] = []
    lock = threading.Lock()

    def one_client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        n = 0
        while time.monotonic() < deadline:
            kind = KINDS[(i + n) % len(KINDS)]
            n += 1
            try:
                _request(client, model, kind, rng, prompts, vocab_size, max_tokens)
                with lock:
                    counts[kind] += 1
            except HttpFailed as exc:
                with lock:
                    errors.append(f"{kind}: {exc}")

    threads = [threading.Thread(target=one_client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    every = min(SAMPLE_EVERY_S, seconds / SAMPLES)
    samples: list[tuple[float, int]] = []
    while time.monotonic() < deadline:
        samples.append((round(time.monotonic() - t0, 2), int(sample_pss())))
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
    for t in threads:
        t.join(timeout=600)
    samples.append((round(time.monotonic() - t0, 2), int(sample_pss())))
    return {"seconds": seconds, "clients": clients, "requests": counts, "errors": len(errors),
            "first_errors": errors[:5], "pss_samples": samples, **drift(samples, seconds),
            "method": (f"{clients} clients, each cycling {', '.join(KINDS)}; PSS of the whole tree every "
                       f"{every:g} s; drift = median of the last {WINDOW_FRACTION:.0%} of the soak / median "
                       f"of the {WINDOW_FRACTION:.0%} after the first {SETTLE_FRACTION:.0%} (settling) − 1")}


def drift(samples: list[tuple[float, int]], seconds: float) -> dict[str, Any]:
    """The settled and final PSS medians and their relative difference (None if a window is empty)."""
    settle = SETTLE_FRACTION * seconds
    window = WINDOW_FRACTION * seconds
    settled = [b for t, b in samples if settle <= t < settle + window]
    last = [b for t, b in samples if t >= seconds - window]
    a, b = stats.median(settled), stats.median(last)
    return {"pss_settled_bytes": a, "pss_final_bytes": b, "pss_drift": stats.ratio(b, a) - 1 if a and b else None}


def _request(client: Client, model: str, kind: str, rng: random.Random, prompts: list[str], vocab_size: int,
             max_tokens: int) -> None:
    prompt = rng.choice(prompts)
    n = rng.randint(8, max_tokens)
    if kind == "chat":
        client.post_json("/v1/chat/completions", {"model": model, "max_tokens": n, "temperature": 0.7,
                                                  "messages": [{"role": "user", "content": prompt}]}, timeout=600)
    elif kind == "completion":
        client.post_json("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.7},
                         timeout=600)
    elif kind == "stream":
        client.stream("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.7},
                      timeout=600)
    elif kind == "fresh-prompt":
        ids = [rng.randrange(256, vocab_size) for _ in range(rng.randint(32, 384))]
        client.post_json("/v1/completions", {"model": model, "prompt": ids, "max_tokens": 8, "temperature": 0},
                         timeout=600)
    else:  # dropped-stream: read a few events, then hang up
        client.stream_and_drop("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                   "temperature": 0.7}, events=3, timeout=600)
