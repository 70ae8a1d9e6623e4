"""vLLM's engine core in the server's own process: the single-process topology.

vLLM 0.32's OpenAI server always runs its engine core in a second process
(``AsyncLLM`` -> ``EngineCoreClient.make_async_mp_client``; ``core_client.py``
refuses "asyncio without multiprocessing"), and on CPU the worker in a third
(``platforms/cpu.py:333-341`` turns the ``uni`` executor into ``mp`` unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Each process that imports torch and vLLM costs
about 0.5 GB (docs/facts.md, "Memory per process"). This module supplies the missing piece: an
asyncio client whose ``EngineCore`` runs in a dedicated thread of this process, so
API server, engine core and model worker share one interpreter.

The engine thread owns everything torch does (model load, OpenMP pool, every
forward pass); the event loop only queues requests and receives outputs. The thread
also keeps a heartbeat (:class:`EngineHealth`): it beats after every engine step and,
when there is nothing to do, every ``_IDLE_WAIT_S`` (idle is progress), and each beat
calls ``EngineHealth.on_progress`` — the worker pings systemd's watchdog from there. A
forward pass that never returns stops the beats, and the pings with them.

``EDGECTL_TEST_STALL`` (tests only; refused in a deployed unit): when the named file
exists as the engine is about to run a step, the thread deletes it and blocks until
shutdown, while the HTTP server keeps running — a hung engine, on demand.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from vllm.v1.engine.core import EngineCore
from vllm.v1.engine.core_client import EngineCoreClient

from edgectl.contract import environment

log = logging.getLogger("edgectl.runtime.engine")

_ADD, _ABORT, _CALL = "add", "abort", "call"
_IDLE_WAIT_S = 0.5  # how long the idle engine thread blocks on its inbox between heartbeats


class EngineHealth:
    """What the watchdog needs to know about the engine thread, updated by that thread."""

    def __init__(self) -> None:
        self.started_monotonic = time.monotonic()
        self.last_beat_monotonic = self.started_monotonic
        self.step_started_monotonic: float | None = None
        self.steps = 0
        self.dead_reason: str | None = None
        self.loaded = False
        # Called on the engine thread at every beat (after a step, or an idle wait).
        self.on_progress: Callable[[], None] | None = None

    def beat(self) -> None:
        self.last_beat_monotonic = time.monotonic()
        callback = self.on_progress
        if callback is not None:
            try:
                callback()
            except Exception:  # the engine must not die of a notification
                log.exception("engine progress callback failed")

    def stalled_for_s(self, now: float | None = None) -> float:
        """Seconds the engine thread has gone without coming back to its loop."""
        now = time.monotonic() if now is None else now
        stalled = now - self.last_beat_monotonic
        if self.step_started_monotonic is not None:
            stalled = max(stalled, now - self.step_started_monotonic)
        return stalled


class InprocAsyncClient(EngineCoreClient):
    """An ``AsyncMPClient`` stand-in whose engine core runs in a thread of this process."""

    def __init__(self, vllm_config, executor_class, log_stats: bool, *_, **__) -> None:
        self.vllm_config = vllm_config
        self.client_index = 0
        self.engine_ranks_managed = [0]
        self.health = EngineHealth()
        self._loop = asyncio.get_running_loop()
        self._outputs: asyncio.Queue = asyncio.Queue()
        self._inbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._draining = False
        self._ready = threading.Event()
        self._init_error: BaseException | None = None
        self.engine_core: EngineCore | None = None
        self.on_shutdown = None  # called once when a shutdown starts (the worker notifies STOPPING=1)
        self._stall_file = environment.read("EDGECTL_TEST_STALL", os.environ) or None
        self._thread = threading.Thread(
            target=self._run, args=(executor_class, log_stats), name="edgectl-engine", daemon=True
        )
        self._thread.start()
        # Loading blocks the event loop, as AsyncMPClient's start-up handshake does; nothing
        # is served before the engine exists (the socket is bound but not listening).
        self._ready.wait()
        if self._init_error is not None:
            raise self._init_error

    # -- the engine thread -------------------------------------------------------------

    def _run(self, executor_class, log_stats: bool) -> None:
        own_openmp_threads(_engine_threads)  # the load and a compile run on the plan's threads
        try:
            self.engine_core = EngineCore(self.vllm_config, executor_class, log_stats)
        except BaseException as exc:  # handed to the constructor, which re-raises it
            self._init_error = exc
            self.health.dead_reason = f"engine failed to start: {exc}"
            self._ready.set()
            return
        own_openmp_threads(_engine_threads)  # again: the engine's start-up set this thread's count from the default
        self.health.loaded = True
        self._ready.set()
        core = self.engine_core
        try:
            while not self._stop.is_set():
                self.health.beat()
                busy = core.scheduler.has_requests()
                try:
                    item = self._inbox.get(block=not busy, timeout=None if busy else _IDLE_WAIT_S)
                except queue.Empty:
                    item = None
                while item is not None:
                    self._handle(core, item)
                    try:
                        item = self._inbox.get_nowait()
                    except queue.Empty:
                        item = None
                if core.scheduler.has_requests():
                    if self._stall_file is not None:
                        self._maybe_stall()
                    self.health.step_started_monotonic = time.monotonic()
                    outputs, executed = core.step_fn()
                    core.post_step(model_executed=executed)
                    self.health.step_started_monotonic = None
                    self.health.steps += 1
                    for out in (outputs or {}).values():
                        self._loop.call_soon_threadsafe(self._outputs.put_nowait, out)
        except BaseException as exc:
            log.exception("engine thread failed")
            self.health.dead_reason = f"engine failed: {exc}"
            self._loop.call_soon_threadsafe(self._outputs.put_nowait, exc)

    def _maybe_stall(self) -> None:
        """The test-only fault: block this step (until shutdown) if the trigger file exists."""
        try:
            os.unlink(self._stall_file)
        except FileNotFoundError:
            return
        log.warning("EDGECTL_TEST_STALL: %s existed; the engine step stalls now (a test's fault injection)",
                    self._stall_file)
        self.health.step_started_monotonic = time.monotonic()
        self._stop.wait()

    def _handle(self, core: EngineCore, item: tuple) -> None:
        kind = item[0]
        if kind == _ADD:
            request, wave = core.preprocess_add_request(item[1])
            core.add_request(request, wave)
        elif kind == _ABORT:
            if item[1]:
                core.abort_requests(item[1])
        elif kind == _CALL:
            _, fn, future = item
            try:
                result = fn(core)
            except BaseException as exc:
                self._loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                self._loop.call_soon_threadsafe(_settle, future, result, None)

    # -- what AsyncLLM calls -----------------------------------------------------------

    async def run_in_engine(self, fn) -> Any:
        """Run ``fn(engine_core)`` on the engine thread and return its result."""
        if self.health.dead_reason:
            raise RuntimeError(self.health.dead_reason)
        future = self._loop.create_future()
        self._inbox.put((_CALL, fn, future))
        return await future

    async def call_utility_async(self, method: str, *args) -> Any:
        return await self.run_in_engine(lambda core: getattr(core, method)(*args))

    async def get_output_async(self):
        out = await self._outputs.get()
        if isinstance(out, BaseException):
            from vllm.v1.engine.exceptions import EngineDeadError

            raise EngineDeadError() from out
        return out

    async def add_request_async(self, request) -> None:
        request.client_index = self.client_index
        self._inbox.put((_ADD, request))

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self._inbox.put((_ABORT, list(request_ids)))

    async def get_supported_tasks_async(self):
        return await self.call_utility_async("get_supported_tasks")

    async def reset_mm_cache_async(self) -> None:
        await self.call_utility_async("reset_mm_cache")

    async def reset_prefix_cache_async(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return await self.call_utility_async("reset_prefix_cache", reset_running_requests, reset_connector)

    async def reset_encoder_cache_async(self) -> None:
        await self.call_utility_async("reset_encoder_cache")

    async def pause_scheduler_async(self, mode="abort", clear_cache: bool = True) -> None:
        await self.call_utility_async("pause_scheduler", mode, clear_cache)

    async def resume_scheduler_async(self) -> None:
        await self.call_utility_async("resume_scheduler")

    async def is_scheduler_paused_async(self) -> bool:
        return await self.call_utility_async("is_scheduler_paused")

    async def is_sleeping_async(self) -> bool:
        return await self.call_utility_async("is_sleeping")

    async def sleep_async(self, level: int = 1, mode="abort") -> None:
        await self.call_utility_async("sleep", level, mode)

    async def wake_up_async(self, tags=None) -> bool:
        return await self.call_utility_async("wake_up", tags)

    async def execute_dummy_batch_async(self) -> None:
        await self.call_utility_async("execute_dummy_batch")

    async def collective_rpc_async(self, method, timeout=None, args: tuple = (), kwargs=None):
        return await self.call_utility_async("collective_rpc", method, timeout, args, kwargs)

    async def add_lora_async(self, lora_request) -> bool:
        return await self.call_utility_async("add_lora", lora_request)

    async def remove_lora_async(self, lora_id: int) -> bool:
        return await self.call_utility_async("remove_lora", lora_id)

    async def list_loras_async(self) -> set[int]:
        return await self.call_utility_async("list_loras")

    async def pin_lora_async(self, lora_id: int) -> bool:
        return await self.call_utility_async("pin_lora", lora_id)

    async def get_status(self):
        healthy = self.health.dead_reason is None
        return {"schema_version": 1, "total_engines": 1,
                "engines": [{"id": 0, "status": "healthy" if healthy else "dead"}]}

    def dp_engines_running(self) -> bool:
        return False

    @property
    def resources(self) -> "_Resources":
        # AsyncLLM.errored reads engine_core.resources.engine_dead
        return _Resources(engine_dead=self.health.dead_reason is not None)

    def has_unfinished_requests(self) -> bool:
        core = self.engine_core
        return bool(core is not None and core.scheduler.has_requests())

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the engine thread; with a timeout, first let running requests finish."""
        callback, self.on_shutdown = self.on_shutdown, None
        if callback is not None:
            callback()
        if timeout:
            self._draining = True
            deadline = time.monotonic() + timeout
            while self.has_unfinished_requests() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.has_unfinished_requests():
                log.warning("shutdown: requests still running after %.0f s; stopping anyway", timeout)
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self.engine_core is not None:
            try:
                self.engine_core.shutdown()
            except Exception:  # shutting down: report, never raise
                log.exception("engine core shutdown failed")

    @property
    def draining(self) -> bool:
        return self._draining


class _Resources:
    def __init__(self, engine_dead: bool) -> None:
        self.engine_dead = engine_dead


def _settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


# The engine thread's OpenMP threads (0: the process's default); set by install().
_engine_threads = 0


def own_openmp_threads(threads: int) -> None:
    """Give the calling thread ``threads`` OpenMP threads, whatever the process's default.

    Why: in one process the HTTP server's threads run torch too (the audio feature extractor, the
    image processor), and each thread that runs a parallel region with more than one thread gets a
    team of its own. Once GNU libgomp manages more threads than there are CPUs it spins only 100
    times before sleeping (``gomp_throttled_spin_count_var``, libgomp/env.c), so the engine's threads
    sleep and wake between every two parallel regions: whisper-base's decode step took 11-12 ms in
    the service against ~6.5 ms offline (docs/speech.md, "Where a transcription's time goes in the
    service"). So the worker makes one thread the process's default (``OMP_NUM_THREADS=1``, read
    when libgomp loads) and the engine thread alone takes the plan's count: libgomp's per-thread
    ``omp_set_num_threads``, after torch's own per-thread set-up (its first parallel operation, which
    sets the thread's count from the default) has run, so torch does not set it back.
    """
    if threads <= 0:
        return
    import ctypes

    import torch

    torch.ones(1 << 16).add_(1)  # torch's per-thread OpenMP set-up (at its first parallel operation) runs now
    # Every GNU libgomp loaded: wheels bundle their own (torch's, and sentencepiece's is loaded first),
    # each with its own per-thread count; the one torch and vLLM's kernels run on is among them.
    with open("/proc/self/maps") as maps:
        libraries = sorted({line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]})
    if not libraries:  # torch built with another OpenMP: its default is left as it is
        log.warning("no GNU libgomp in this process: the engine thread keeps the default thread count")
    for library in libraries:
        ctypes.CDLL(library).omp_set_num_threads(threads)


def install(engine_threads: int = 0) -> None:
    """Make ``AsyncLLM`` build an :class:`InprocAsyncClient` in this process, whose engine thread runs
    ``engine_threads`` OpenMP threads (:func:`own_openmp_threads`; 0: the process's default).

    A class attribute replaced in this process only; vLLM's source is untouched.
    """
    global _engine_threads
    _engine_threads = engine_threads

    def make_async_mp_client(vllm_config, executor_class, log_stats, *args, **kwargs):
        return InprocAsyncClient(vllm_config, executor_class, log_stats)

    EngineCoreClient.make_async_mp_client = staticmethod(make_async_mp_client)
    inspect_models_in_process()


def inspect_models_in_process() -> None:
    """Let vLLM inspect the model's class in this process, not in a fresh Python.

    On a first start (no ``VLLM_CACHE_ROOT/modelinfos`` entry yet) vLLM 0.32 learns what the
    architecture's class supports by importing it in a subprocess
    (``vllm/model_executor/models/registry.py``, ``_run_in_subprocess``: "Performed in another
    process to avoid initializing CUDA"), a second import of vLLM and its plugins: 11.6 s of a
    25 s eager first start on the development box's AVX2 path (docs/facts.md). A CPU process initializes no CUDA, and this process
    imports the same class moments later to load the model; the answer still goes to vLLM's
    cache as before.
    """
    from vllm.model_executor.models import registry

    def _run_in_process(fn):
        return fn()

    registry._run_in_subprocess = _run_in_process
