"""The service's main process: vLLM's OpenAI server with exactly the plan's settings.

Started by the unit (``python -m edgectl_runtime.service.worker --plan /etc/edgectl/NAME/plan.json``),
by a Kubernetes pod the same way (edgectl/fleet/k8s.py), or in the foreground by ``edgectl
serve``. In order:

1. refuse an environment that would silently change the plan (``VLLM_CPU_KVCACHE_SPACE``
   overrides the KV budget in vLLM 0.32, ``platforms/cpu.py:323-327``);
2. load the model with the plan's settings, in the plan's process topology;
3. read the effective settings back from the engine (KV bytes allocated, RoPE rows, the
   format of every linear layer, threads, processes) and refuse to serve if any differs;
4. warm up with a generation through its own HTTP API, and only then ``READY=1``;
5. ping the watchdog from the engine thread, after every step and while idle, and only while
   the event loop runs (notify.py says who pings when);
6. on SIGTERM stop taking requests, let running ones finish (up to the plan's stop
   timeout), exit 0.

Exit codes (``edgectl/contract/worker.py``): 0 clean stop; 2 the plan cannot be served as
written (bad plan, refused environment, port in use): restarting will not help; 3 the effective
settings differ from the plan; 1 anything else (systemd restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from edgectl.contract import environment
from edgectl.contract import worker as contract
from edgectl.contract.effective import SCHEMA as EFFECTIVE_SCHEMA
from edgectl.contract.effective import mismatches
from edgectl.contract.plan import OptionalImports, Plan, TokenizerLever, Topology
from edgectl.contract.vllm_args import server_args
from edgectl.errors import EdgectlError

log = logging.getLogger("edgectl.runtime")

EXIT_REFUSED = contract.EXIT_REFUSED
EXIT_MISMATCH = contract.EXIT_MISMATCH


class Refused(Exception):
    """The plan cannot be served as written; restarting will not help."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def load_plan(path: str) -> Plan:
    """The plan file, read strictly: a bad one is refused naming every bad field."""
    try:
        return Plan.load(path)
    except EdgectlError as exc:
        raise Refused("; ".join([exc.message, *exc.details])) from None


def prepare_environment(plan: Plan, environ, proc_self_cgroup: str | None = None) -> None:
    """Refuse overrides and test-only faults in a deployment, then put the plan's environment in
    place (this process only)."""
    problems = environment.refused(environ, plan)
    problems += refused_test_faults(environ, proc_self_cgroup)
    if problems:
        raise Refused("; ".join(problems))
    environ.update(plan.env)
    environ.update(environment.runtime_levers(plan))


def refused_test_faults(environ, proc_self_cgroup: str | None = None) -> list[str]:
    """A test-only fault injection (``environment.TEST_ONLY``) in a unit edgectl deployed: refused.

    ``proc_self_cgroup``: this process's /proc/self/cgroup (read here when None); the unit comes
    from it, as systemd put the process there.
    """
    names = [name for name in environment.TEST_ONLY if environ.get(name)]
    if not names:
        return []
    if proc_self_cgroup is None:
        try:
            with open("/proc/self/cgroup") as f:
                proc_self_cgroup = f.read()
        except OSError:
            proc_self_cgroup = ""
    unit = contract.systemd_unit(proc_self_cgroup)
    if not contract.is_deployment_unit(unit):
        return []
    return [f"{name} is set in {unit}: it is a test-only fault injection and a deployed unit never carries it; "
            f"remove it (systemctl show {unit} -p Environment)" for name in names]


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
        self.trimmer = None  # levers.idle_trim: an IdleTrimmer (runtime/edgectl_runtime/service/idle_trim.py)
        if plan.levers.idle_trim:
            from edgectl_runtime.service.idle_trim import IdleTrimmer

            self.trimmer = IdleTrimmer()

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

            import threading

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


async def read_effective(engine_client, plan: Plan) -> dict[str, Any]:
    """The settings the running engine actually has, read from the process that holds the model."""
    from edgectl_runtime.vllm_plugin.lean import optional_imports_state, tokenizer_state
    from edgectl_runtime.service.readback import collect_worker_facts, process_tree_facts

    if plan.topology is Topology.SINGLE_PROCESS:
        results = await engine_client.collective_rpc(collect_worker_facts)
    else:
        results = await engine_client.collective_rpc("edgectl_effective")
    worker = results[0] if isinstance(results, list) else results
    vc = engine_client.vllm_config
    eff = {
        "schema": EFFECTIVE_SCHEMA,
        "max_model_len": vc.model_config.max_model_len,
        "max_num_seqs": vc.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
        "kv_cache_memory_bytes_config": vc.cache_config.kv_cache_memory_bytes,
        "quantization": vc.model_config.quantization,
        "load_format": str(vc.load_config.load_format),
        "enforce_eager": bool(vc.model_config.enforce_eager),
        **worker,
        **process_tree_facts(os.getpid()),
        # read in the server's own process, where the worker applied them before importing vLLM
        "python_optimize": sys.flags.optimize,
        "optional_imports": optional_imports_state(),
        "tokenizer": tokenizer_state(engine_client),
    }
    return eff


async def warm_up(plan: Plan) -> str:
    """One short generation through this server's own OpenAI API; returns the text.

    Asynchronous (it runs on the server's own event loop), so not edgectl's worker client; it
    reaches the server where every client does (``contract.base_url``).
    """
    import aiohttp

    base = contract.base_url(plan.serve)
    model = plan.model.name
    timeout = aiohttp.ClientTimeout(total=float(plan.timeouts.start_s))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(600):
            try:
                async with session.get(f"{base}/health") as r:
                    if r.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        body = {"model": model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]}
        async with session.post(f"{base}/v1/chat/completions", json=body) as r:
            if r.status == 400:  # no chat template: a plain completion proves generation as well
                body = {"model": model, "max_tokens": 8, "temperature": 0, "prompt": "Hello"}
                async with session.post(f"{base}/v1/completions", json=body) as r2:
                    data = await r2.json()
                    if r2.status != 200:
                        raise RuntimeError(f"warm-up completion failed: HTTP {r2.status}: {data}")
                    text = data["choices"][0]["text"]
            else:
                data = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"warm-up chat completion failed: HTTP {r.status}: {data}")
                text = data["choices"][0]["message"]["content"] or ""
        if not data.get("usage", {}).get("completion_tokens"):
            raise RuntimeError(f"warm-up generated no tokens: {data}")
        return text


async def serve(plan: Plan, service: Service) -> None:
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(prog="edgectl-worker")).parse_args(server_args(plan))
    validate_parsed_serve_args(args)
    notifier = service.notifier
    asyncio.get_running_loop().create_task(service.loop_heartbeat.run())

    try:
        listen_address, sock = setup_server(args, reuse_port=False)
    except OSError as exc:
        raise Refused(f"cannot bind {contract.host_port(plan.serve)}: {exc.strerror} "
                      "(another service uses the port? pick another with --port)") from None

    service.phase = "loading"
    notifier.status(f"loading weights: {plan.model.name} as {plan.weight_format}")
    async with build_async_engine_client(args) as engine_client:
        service.engine_client = engine_client
        core = getattr(engine_client, "engine_core", None)
        health = getattr(core, "health", None)
        if health is not None:
            health.on_progress = service.engine_progress
        if hasattr(core, "on_shutdown"):
            def on_shutdown() -> None:
                service.phase = "stopping"
                notifier.stopping("stopping: finishing running requests")

            core.on_shutdown = on_shutdown
        service.phase = "checking"
        notifier.status("checking the effective settings against the plan")
        effective = await read_effective(engine_client, plan)
        effective["idle_trim"] = service.idle_trim_state()
        service.effective = effective
        problems = mismatches(plan, effective)
        if problems:
            for p in problems:
                log.error("effective setting differs from the plan: %s", p)
            raise Refused("refusing to serve: " + "; ".join(problems), code=EXIT_MISMATCH)
        log.info("effective settings match the plan: %s", json.dumps(_summary(effective)))

        supported_tasks = await engine_client.get_supported_tasks()
        app = build_app(args, supported_tasks, engine_client.model_config)
        _add_edgectl_routes(app, service)
        await init_app_state(engine_client, app.state, args, supported_tasks)

        service.phase = "warming up"
        notifier.status("warming up: a first generation through the API")

        async def warm_then_ready() -> None:
            try:
                text = await warm_up(plan)
            except Exception as exc:
                log.error("warm-up failed: %s", exc)
                notifier.status(f"warm-up failed: {exc}")
                os._exit(1)  # nothing served yet: let systemd restart us
            _release_freed_memory()
            if service.effective is not None:  # the processor probe runs at the first chat render: read it again
                from edgectl_runtime.vllm_plugin.lean import tokenizer_state

                service.effective["tokenizer"] = tokenizer_state(engine_client)
            service.ready_s = time.monotonic() - service.started_monotonic
            service.phase = contract.SERVING
            log.info("warm-up answered %r", text)
            suspect = contract.degenerate_answer(text)
            service.warmup = {"answer": text, "suspect": suspect}
            if suspect:
                log.warning("%s: the model may be broken (a wrong conversion or quantization); check its "
                            "answers before relying on it", suspect)
            notifier.ready(f"serving {plan.model.name} on {listen_address} "
                           f"({plan.weight_format}, {plan.max_model_len} tokens; ready in {service.ready_s:.0f} s)")

        asyncio.get_running_loop().create_task(warm_then_ready())
        log_config = get_uvicorn_log_config(args)
        kwargs: dict[str, Any] = {}
        if log_config is not None:
            kwargs["log_config"] = log_config
        shutdown_task = await serve_http(
            DrainGuard(app, service), sock=sock, enable_ssl_refresh=False, host=args.host, port=args.port,
            log_level=args.uvicorn_log_level, access_log=not args.disable_uvicorn_access_log,
            **kwargs,
        )
    try:
        await shutdown_task
    finally:
        sock.close()


def _release_freed_memory() -> None:
    """Give back to the kernel what loading and the warm-up freed (glibc keeps it otherwise).

    Loading buffers each layer's checkpoint tensors before packing them; glibc's allocator keeps
    the freed pages in its heaps. ``malloc_trim(0)`` returns them (40 MB here with SmolLM2).
    """
    from edgectl_runtime.service.idle_trim import release_freed_memory

    release_freed_memory()


def _summary(effective: dict[str, Any]) -> dict[str, Any]:
    keys = ("kv_cache_bytes", "rope_rows", "threads", "processes", "max_model_len", "linear_format_counts",
            "kernel_isa")
    return {k: effective.get(k) for k in keys}


def _add_edgectl_routes(app, service: Service) -> None:
    """``GET /edgectl/effective``: what the engine really runs with, and the worker's phase;
    ``/edgectl/live`` and ``/edgectl/ready`` for probes."""
    from fastapi.responses import JSONResponse

    @app.get(contract.EFFECTIVE_ROUTE)
    async def effective() -> JSONResponse:
        body = dict(service.effective or {})
        body.update({"phase": service.phase, "ready_s": service.ready_s, "load_peak": service.load_peak,
                     "warmup": service.warmup,
                     "plan_kv_cache_bytes": service.plan.kv_cache_bytes, "idle_trim": service.idle_trim_state()})
        return JSONResponse(body)

    # For a supervisor that probes instead of listening for sd_notify (Kubernetes):
    # /edgectl/live is the rule the watchdog is pinged by; /edgectl/ready is READY=1 (the
    # warm-up answered) and not draining. 503 otherwise, with the reason.
    def probe(ok: bool, why: str) -> JSONResponse:
        return JSONResponse({"ok": ok, "phase": service.phase, "why": why}, status_code=200 if ok else 503)

    @app.get(contract.LIVE_ROUTE)
    async def live() -> JSONResponse:
        return probe(*service.health())

    @app.get(contract.READY_ROUTE)
    async def ready() -> JSONResponse:
        ok, why = service.health()
        return probe(ok and service.phase == contract.SERVING, why)

    @app.get(contract.MEMORY_ROUTE)
    async def memory() -> JSONResponse:
        """Where this process's PSS goes (``edgectl_runtime/introspect/memory/``), read in the engine thread."""
        client = service.engine_client
        if client is None or service.plan.topology is not Topology.SINGLE_PROCESS:
            return JSONResponse({"error": "the memory attribution needs the single-process topology, serving"},
                                status_code=409)
        from edgectl_runtime.introspect.memory import collect_in_worker

        results = await client.collective_rpc(collect_in_worker, kwargs={"model_dir": service.plan.model.path})
        return JSONResponse(results[0] if isinstance(results, list) else results)


class DrainGuard:
    """The app as uvicorn sees it: once draining, new API requests get 503 instead of a slot.

    (vLLM builds the middleware stack before edgectl can add to it, so this wraps the app.)
    Everything else is the FastAPI app itself.
    """

    def __init__(self, app, service: Service) -> None:
        self._app = app
        self._service = service

    def __getattr__(self, name: str):
        return getattr(self._app, name)

    async def __call__(self, scope, receive, send) -> None:
        core = getattr(self._service.engine_client, "engine_core", None)
        api = scope.get("type") == "http" and scope.get("path", "").startswith("/v1/")
        if api and getattr(core, "draining", False):
            body = json.dumps({"error": {"message": "the server is shutting down", "type": "ServiceUnavailable",
                                         "code": 503}}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        trimmer = self._service.trimmer
        if not api or trimmer is None:
            await self._app(scope, receive, send)
            return
        trimmer.request_started()  # the idle trim waits for every API request to end
        try:
            await self._app(scope, receive, send)
        finally:
            trimmer.request_finished()


def _configure_logging() -> None:
    # Under systemd stdout/stderr go to the journal; keep lines plain (no timestamps twice).
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("INVOCATION_ID") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stderr)
    # Something vLLM's server set-up imports raises the root logger to ERROR; edgectl's own
    # level keeps the phases, the watchdog and the drain in the journal regardless.
    logging.getLogger("edgectl").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    # (no docstrings under python -OO)
    parser = argparse.ArgumentParser(prog="edgectl-worker", description=(__doc__ or "edgectl's worker").splitlines()[0])
    parser.add_argument("--plan", required=True, help="the deployment's plan file (edgectl.plan/1)")
    ns = parser.parse_args(argv)
    _configure_logging()
    # On a watchdog timeout systemd sends SIGABRT: the journal then shows where every thread was.
    import faulthandler

    faulthandler.enable()

    from edgectl_runtime.service.notify import Notifier, Watchdog, watchdog_interval_s

    notifier = Notifier()
    try:
        plan = load_plan(ns.plan)
        prepare_environment(plan, os.environ)  # the worker's own process: the plan's environment
    except Refused as exc:
        log.error("%s", exc)
        notifier.status(f"refused: {exc}")
        return exc.code

    if plan.levers.optional_imports is OptionalImports.SKIP:  # before anything imports vLLM
        from edgectl_runtime.vllm_plugin.lean import skip_optional_imports

        log.info("kept out (optional for vLLM): %s", ", ".join(skip_optional_imports()))
    if plan.levers.tokenizer is TokenizerLever.LEAN:
        from edgectl_runtime.vllm_plugin.lean import share_tokenizer

        share_tokenizer()

    interval_s = watchdog_interval_s(dict(os.environ), plan.timeouts.watchdog_s)
    service = Service(plan, notifier, ping_every_s=interval_s)
    watchdog = Watchdog(notifier, service.watchdog_check, interval_s)
    watchdog.start()
    import threading

    threading.Thread(target=service.sample_load_peak, name="edgectl-load-peak", daemon=True).start()

    if plan.topology is Topology.SINGLE_PROCESS:
        from edgectl_runtime.vllm_plugin import compile_cache, inproc

        inproc.install()
        compile_cache.listeners.append(service.on_compile_event)  # the model is in this process
    import uvloop

    try:
        uvloop.run(serve(plan, service))
    except Refused as exc:
        log.error("%s", exc)
        notifier.status(f"refused: {exc}")
        return exc.code
    except KeyboardInterrupt:
        pass
    finally:
        watchdog.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without running interpreter teardown: vLLM's AsyncLLM.__del__ would call its
    # shutdown again on half-torn-down modules and print a traceback into the journal.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
