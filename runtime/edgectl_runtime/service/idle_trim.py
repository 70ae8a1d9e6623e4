"""Give freed heap memory back to the kernel once the server has gone quiet (``levers.idle_trim``).

glibc keeps what a thread frees inside that thread's arena; only the free space at the top of a
heap is returned on its own. A request that builds many large temporaries — ``prompt_logprobs``
(20 alternatives for every prompt position, as Python objects, then JSON) is the one measured —
leaves pages that are free but still resident in the middle of the arenas: SmolLM2-135M's worker
held +87 and +98 MiB more after the bench's fidelity requests than before them, in the
attribution's "malloc: free, still resident" line (docs/memory.md, "Freed but resident").
``malloc_trim(0)`` walks every arena and returns those pages (``madvise(MADV_DONTNEED)``); the
worker already calls it once after its warm-up.

This does the same whenever the server goes quiet: no API request in flight, no engine step and
no request finished for ``IDLE_S``, and something happened since the last trim. It runs on the
engine thread between its idle waits (``inproc.py``), so a request arriving during a trim waits
for it (``last_ms``, read back). Nothing here runs while requests are being served.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

IDLE_S = 1.0  # how long the server must have been quiet before freed memory is returned


def _glibc_trim() -> Callable[[], Any] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        return None


def release_freed_memory() -> None:
    """``malloc_trim(0)`` once, now (the worker after loading and its warm-up); nothing without glibc."""
    trim = _glibc_trim()
    if trim is not None:
        trim(0)


def rss_anon_bytes() -> int | None:
    """This process's resident anonymous memory (``/proc/self/status`` RssAnon)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class IdleTrimmer:
    """Counts API requests (``request_started``/``request_finished`` from the HTTP side) and, on
    the engine thread's beats (``beat(steps)``), trims once per quiet period."""

    def __init__(self, idle_s: float = IDLE_S, trim: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic, rss: Callable[[], int | None] = rss_anon_bytes) -> None:
        self.idle_s = idle_s
        self._trim = trim if trim is not None else _glibc_trim()
        self._clock = clock
        self._rss = rss
        self._lock = threading.Lock()
        self._in_flight = 0
        self._finished = 0
        self._activity: tuple[int, int] = (0, 0)  # (engine steps, requests finished) last seen
        self._activity_at = clock()
        self._trimmed_activity: tuple[int, int] | None = (0, 0)  # nothing has happened: nothing to give back
        self.trims = 0
        self.released_bytes = 0
        self.last_ms: float | None = None
        self.max_ms = 0.0

    @property
    def available(self) -> bool:
        return self._trim is not None

    # -- the HTTP side ---------------------------------------------------------------------

    def request_started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def request_finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._finished += 1
            self._activity = (self._activity[0], self._finished)
            self._activity_at = self._clock()  # the quiet starts when the response has gone

    # -- the engine thread -----------------------------------------------------------------

    def beat(self, steps: int) -> bool:
        """Trim if the server has been quiet for ``idle_s`` since its last activity and nothing
        was trimmed since; whether it trimmed."""
        now = self._clock()
        with self._lock:
            activity = (steps, self._finished)
            if activity != self._activity:
                self._activity, self._activity_at = activity, now
                return False
            if (self._in_flight or activity == self._trimmed_activity or now - self._activity_at < self.idle_s
                    or self._trim is None):
                return False
            self._trimmed_activity = activity
        before = self._rss()
        t0 = time.perf_counter()
        self._trim(0)
        took_ms = (time.perf_counter() - t0) * 1000
        after = self._rss()
        self.trims += 1
        if before is not None and after is not None:
            self.released_bytes += max(0, before - after)
        self.last_ms = took_ms
        self.max_ms = max(self.max_ms, took_ms)
        return True

    def state(self) -> dict[str, Any]:
        """The read-back (``/edgectl/effective`` ``idle_trim``)."""
        return {"enabled": True, "available": self.available, "idle_s": self.idle_s, "trims": self.trims,
                "released_bytes": self.released_bytes, "last_ms": self.last_ms, "max_ms": self.max_ms,
                "in_flight": self._in_flight}
