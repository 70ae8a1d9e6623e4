"""What the worker's watchdog and HTTP routes need to see: the phase of the start, the engine,
the effective settings, and whether the engine and the event loop both make progress (who pings
systemd's watchdog when: notify.py)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from edgectl.contract import worker as contract
from edgectl.contract.plan import Plan


class Service:
    """Holds what the watchdog and the HTTP routes need to see."""

    def __init__(self, plan: Plan, notifier, ping_every_s: float | None = None) -> None:
        from edgectl_runtime.service.notify import LoopHeartbeat

        self.plan = plan
        self.notifier = notifier
        self.phase = "starting"
        self.engine_client = None
        self.loop_heartbeat = LoopHeartbeat()
        self.effective: dict[str, Any] | None = None
        self.started_monotonic = time.monotonic()
        self.ready_s: float | None = None
        self.stall_limit_s = max(5.0, float(plan.timeouts.watchdog_s) / 2)
        # The engine thread pings at most this often (a quarter of WatchdogSec).
        self.ping_every_s = ping_every_s if ping_every_s is not None else max(0.5, plan.timeouts.watchdog_s / 4)
        self._last_engine_ping = float("-inf")
        self.engine_pings = 0
        self.load_peak: dict[str, int] = {}
        self.warmup: dict[str, Any] | None = None  # the warm-up's answer, and why it looks broken (or None)
        # The audio transcribed, counted by the AudioGuard (audio_guard.py) on each 200: None when
        # the worker serves no audio routes.
        self.audio_seconds: float | None = None
        self.transcriptions: int | None = None
        # The images served, counted by the ImageGuard (image_guard.py) on each 2xx: None when the
        # worker serves no vision plan.
        self.images_served: int | None = None
        self.image_requests: int | None = None  # the chat completions that carried them
        self.trimmer = None  # levers.idle_trim: an IdleTrimmer (runtime/edgectl_runtime/service/idle_trim.py)
        if plan.levers.idle_trim:
            from edgectl_runtime.service.idle_trim import IdleTrimmer

            self.trimmer = IdleTrimmer()

    def count_audio(self) -> None:
        """Start counting the audio transcribed (from zero, once)."""
        if self.audio_seconds is None:
            self.audio_seconds, self.transcriptions = 0.0, 0

    def audio_transcribed(self, seconds: float) -> None:
        """One upload transcribed (or translated): its seconds of audio."""
        self.count_audio()
        self.audio_seconds = (self.audio_seconds or 0.0) + seconds
        self.transcriptions = (self.transcriptions or 0) + 1

    def count_images(self) -> None:
        """Start counting the images served (from zero, once)."""
        if self.images_served is None:
            self.images_served, self.image_requests = 0, 0

    def images_answered(self, images: int) -> None:
        """One chat completion answered whose ``images`` all passed the image guard."""
        self.count_images()
        self.images_served = (self.images_served or 0) + images
        self.image_requests = (self.image_requests or 0) + 1

    def idle_trim_state(self) -> dict[str, Any]:
        return self.trimmer.state() if self.trimmer is not None else {"enabled": False}

    def sample_load_peak(self, interval_s: float = 0.25) -> None:
        """Until serving: the peak PSS of this process tree (the load's high-water mark).

        PSS, anonymous and file-backed, summed over the tree like the steady figure, so the two
        compare; the file-backed part includes the checkpoint while it is mapped.
        """
        from edgectl.contract.procmem import tree_mem

        samples = 0
        while self.phase not in (contract.SERVING, "stopping"):
            mem = tree_mem(os.getpid())
            samples += 1
            if mem.pss_bytes > self.load_peak.get("pss_bytes", 0):
                self.load_peak = {"pss_bytes": mem.pss_bytes, "pss_anon_bytes": mem.pss_anon_bytes,
                                  "pss_file_bytes": mem.pss_file_bytes}
            self.load_peak["samples"] = samples
            time.sleep(interval_s)

    def on_compile_event(self, event: str, state: dict[str, Any]) -> None:
        """The compiled graph's progress (``edgectl_runtime.vllm_plugin.compile_cache``) as phase and STATUS=.

        Compiling takes minutes on a small box: while it runs, STATUS= shows the seconds so far,
        so ``edgectl deploy`` (which prints every new STATUS=) shows progress.
        """
        if event == "loading":
            self.phase = "loading the compiled graph"
            self.notifier.status("loading the compiled graph from the cache")
        elif event == "compiling":
            self.phase = "compiling"
            why = ("the cached graph failed to load" if state.get("load_failure")
                   else "first start with these settings; later starts load it from the cache")
            started = time.monotonic()

            def tick() -> None:
                while self.phase == "compiling":
                    self.notifier.status(f"compiling the graph: {time.monotonic() - started:.0f} s ({why})")
                    time.sleep(5)

            threading.Thread(target=tick, name="edgectl-compile-progress", daemon=True).start()
        elif event in ("loaded", "compiled"):
            self.phase = "loading"
            took = state.get("load_s") if event == "loaded" else state.get("compile_s")
            self.notifier.status(f"graph {'loaded from the cache' if event == 'loaded' else 'compiled and cached'} "
                                 f"in {took:.0f} s; allocating the KV cache and warming up")

    def engine_progress(self) -> None:
        """On the engine thread, after every step and every idle wait: ping systemd's watchdog
        (at most every ``ping_every_s``) if the HTTP event loop runs too; give freed memory back
        once the server has gone quiet (``levers.idle_trim``)."""
        if self.phase != contract.SERVING:
            return  # start-up and the drain: the Watchdog thread pings
        self._ping_if_due()
        if self.trimmer is not None:
            steps = getattr(getattr(getattr(self.engine_client, "engine_core", None), "health", None), "steps", None)
            if steps is not None:  # the in-process engine's step count (inproc.EngineHealth)
                self.trimmer.beat(steps)

    def _ping_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_engine_ping < self.ping_every_s:
            return
        if self.loop_heartbeat.age_s() > self.stall_limit_s:
            return  # the watchdog thread logs why (health())
        self.notifier.watchdog()
        self._last_engine_ping = now
        self.engine_pings += 1

    def watchdog_check(self) -> tuple[bool, str | None]:
        """For the Watchdog thread: ping (start-up, drain, an engine in other processes), or not,
        with the reason to log, or ``(False, None)``: the engine thread pings (``engine_progress``)."""
        if self.phase != contract.SERVING:
            return True, self.phase  # start-up (TimeoutStartSec) and the drain (TimeoutStopSec)
        ok, why = self.health()
        if not ok:
            return False, why
        if self._engine_health() is not None:
            return False, None
        return True, why

    def _engine_health(self):
        return getattr(getattr(self.engine_client, "engine_core", None), "health", None)

    def health(self) -> tuple[bool, str]:
        """Whether the watchdog may ping: the engine and the front end both make progress."""
        if self.phase in ("starting", "loading", "compiling", "loading the compiled graph", "checking", "warming up"):
            return True, self.phase  # TimeoutStartSec guards start-up
        if self.phase == "stopping":
            return True, self.phase  # TimeoutStopSec guards the drain
        client = self.engine_client
        if client is None:
            return False, "no engine"
        if getattr(client, "errored", False):
            return False, "the engine has died"
        core = getattr(client, "engine_core", None)
        health = getattr(core, "health", None)
        if health is not None:
            if health.dead_reason:
                return False, health.dead_reason
            if not core._thread.is_alive():
                return False, "the engine thread has exited"
            stalled = health.stalled_for_s()
            if stalled > self.stall_limit_s:
                return False, f"the engine thread has not come back for {stalled:.0f} s (limit {self.stall_limit_s:.0f} s)"
        age = self.loop_heartbeat.age_s()
        if age > self.stall_limit_s:
            return False, f"the HTTP event loop has not run for {age:.0f} s"
        return True, "serving"
