"""systemd notifications, and the watchdog that sends them only while the engine works.

Who pings: while serving with the engine in this process, the engine thread itself, after
every step and every idle wait (``Service.engine_progress`` in worker.py, called from
``inproc.EngineHealth.beat``), so systemd's ``WatchdogSec`` only has to outlast the longest
single step. The :class:`Watchdog` thread pings during start-up and the drain (guarded by
``TimeoutStartSec``/``TimeoutStopSec``) and when the engine runs in other processes (the
stock topology); while serving in-process it only logs why the pings stopped.

``notify()`` is a harmless no-op without ``NOTIFY_SOCKET`` (a foreground ``edgectl serve``),
so the worker calls it unconditionally. Every status is also logged, so the journal (or
the terminal) shows the phases.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("edgectl.runtime")


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.enabled = bool(env.get("NOTIFY_SOCKET"))
        self._notify: Callable[[str], object] | None = None
        if self.enabled:
            from systemd import daemon  # systemd-python: part of the runtime extra

            self._notify = daemon.notify
        self.sent: collections.deque[str] = collections.deque(maxlen=64)  # the last messages, for tests

    def send(self, message: str) -> None:
        self.sent.append(message)
        if self._notify is not None:
            self._notify(message)

    def status(self, text: str) -> None:
        log.info("status: %s", text)
        self.send(f"STATUS={text}")

    def ready(self, text: str) -> None:
        log.info("ready: %s", text)
        self.send(f"READY=1\nSTATUS={text}")

    def stopping(self, text: str) -> None:
        log.info("stopping: %s", text)
        self.send(f"STOPPING=1\nSTATUS={text}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")


def watchdog_interval_s(environ: dict[str, str], plan_watchdog_s: float) -> float:
    """Ping at a quarter of systemd's ``WatchdogSec`` (it passes WATCHDOG_USEC), else of the plan's."""
    usec = environ.get("WATCHDOG_USEC")
    pid = environ.get("WATCHDOG_PID")
    if usec and (not pid or pid == str(os.getpid())):
        try:
            return max(0.5, int(usec) / 1e6 / 4)
        except ValueError:
            pass
    return max(0.5, plan_watchdog_s / 4)


class Watchdog(threading.Thread):
    """Sends ``WATCHDOG=1`` every interval while ``check()`` says so.

    ``check`` returns ``(ping, why)``: ping, or not because of ``why`` (logged once), or not
    with ``why`` None because someone else pings (the engine thread, per step). A hung engine
    (a forward pass that never returns, a stopped process, a stuck event loop) stops the pings,
    and systemd kills and restarts the service after ``WatchdogSec``.
    """

    def __init__(self, notifier: Notifier, check: Callable[[], tuple[bool, str]], interval_s: float) -> None:
        super().__init__(name="edgectl-watchdog", daemon=True)
        self.notifier = notifier
        self.check = check
        self.interval_s = interval_s
        self._stopped = threading.Event()
        self.pings = 0
        self._last_problem: str | None = None

    def run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                healthy, why = self.check()
            except Exception as exc:  # a broken check must not look healthy
                healthy, why = False, f"health check failed: {exc}"
            if healthy:
                self.notifier.watchdog()
                self.pings += 1
            if healthy or why is None:
                if self._last_problem is not None:
                    log.info("watchdog: healthy again")
                self._last_problem = None
            elif why != self._last_problem:
                log.error("watchdog: not pinging systemd: %s", why)
                self._last_problem = why

    def stop(self) -> None:
        self._stopped.set()


class LoopHeartbeat:
    """Proves the asyncio loop (the HTTP front end) still runs: a task stamps it every second."""

    def __init__(self) -> None:
        self.last_monotonic = time.monotonic()

    async def run(self) -> None:
        import asyncio

        while True:
            self.last_monotonic = time.monotonic()
            await asyncio.sleep(1.0)

    def age_s(self) -> float:
        return time.monotonic() - self.last_monotonic
