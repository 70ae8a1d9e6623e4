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
from typing import Any

from edgectl.contract import environment
from edgectl.contract import worker as contract
from edgectl.contract.effective import SCHEMA as EFFECTIVE_SCHEMA
from edgectl.contract.effective import mismatches
from edgectl.contract.plan import OptionalImports, Plan, TokenizerLever, Topology
from edgectl.contract.vllm_args import server_args
from edgectl.errors import EdgectlError
from edgectl_runtime.service.audio_guard import AudioGuard
from edgectl_runtime.service.http_app import DrainGuard, add_edgectl_routes
from edgectl_runtime.service.image_guard import ImageGuard
from edgectl_runtime.service.state import Service
from edgectl_runtime.service.warmup import warm_then_ready

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


def one_openmp_thread_by_default(plan: Plan, environ) -> None:
    """In one process, one OpenMP thread for every thread but the engine's, which takes the plan's
    count (``inproc.own_openmp_threads`` says why); libgomp reads it when torch loads, which is later."""
    if plan.topology is Topology.SINGLE_PROCESS:
        environ["OMP_NUM_THREADS"] = "1"


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


async def _in_model_worker(engine_client, plan: Plan, function, extension_method: str) -> Any:
    """Run ``function(worker)`` where the model is: handed over directly in the single-process topology, by
    the name of its ``ReadbackExtension`` method in vLLM's own (the function cannot cross the processes)."""
    results = await engine_client.collective_rpc(
        function if plan.topology is Topology.SINGLE_PROCESS else extension_method)
    return results[0] if isinstance(results, list) else results


async def read_effective(engine_client, plan: Plan) -> dict[str, Any]:
    """The settings the running engine actually has, read from the process that holds the model."""
    from edgectl_runtime.service.readback import (
        collect_worker_facts,
        process_tree_facts,
    )
    from edgectl_runtime.vllm_plugin.lean import optional_imports_state, tokenizer_state

    worker = await _in_model_worker(engine_client, plan, collect_worker_facts, "edgectl_effective")
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


async def serve(plan: Plan, service: Service) -> None:
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import (
        make_arg_parser,
        validate_parsed_serve_args,
    )
    from vllm.entrypoints.launchers.launcher import serve_http
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(prog="edgectl-worker")).parse_args(server_args(plan))
    validate_parsed_serve_args(args)
    notifier = service.notifier
    asyncio.get_running_loop().create_task(service.loop_heartbeat.run())
    listen_address, sock = _bind(args, plan)

    service.phase = "loading"
    notifier.status(f"loading weights: {plan.model.name} as {plan.weight_format}")
    async with build_async_engine_client(args) as engine_client:
        service.engine_client = engine_client
        _follow_engine(service, engine_client)
        service.phase = "checking"
        notifier.status("checking the effective settings against the plan")
        await _check_effective(plan, service, engine_client)
        await _release_gloo_groups(plan, service, engine_client)

        supported_tasks = await engine_client.get_supported_tasks()
        app = build_app(args, supported_tasks, engine_client.model_config)
        add_edgectl_routes(app, service)
        await init_app_state(engine_client, app.state, args, supported_tasks)

        service.phase = "warming up"
        notifier.status("warming up: a first generation through the API")
        asyncio.get_running_loop().create_task(warm_then_ready(plan, service, engine_client, listen_address))
        shutdown_task = await serve_http(
            DrainGuard(_guarded(app, plan, service), service), sock=sock, enable_ssl_refresh=False, host=args.host, port=args.port,
            log_level=args.uvicorn_log_level, access_log=not args.disable_uvicorn_access_log,
            **_uvicorn_log_kwargs(args),
        )
    try:
        await shutdown_task
    finally:
        sock.close()


def _guarded(app, plan: Plan, service: Service):
    """A speech plan's app checks every audio upload before vLLM decodes it (audio_guard.py), a
    vision plan's every image of a chat completion (image_guard.py)."""
    if plan.vision is not None:
        app = ImageGuard(app, service, plan.vision.images)
    if plan.speech is None:
        return app
    return AudioGuard(app, service, max_audio_s=plan.speech.max_audio_s,
                      max_upload_bytes=plan.speech.max_upload_bytes)


def _bind(args, plan: Plan):
    """The server's listening address and socket, bound before the model loads; a port in use is refused."""
    from vllm.entrypoints.launchers.launcher import setup_server

    try:
        return setup_server(args, reuse_port=False)
    except OSError as exc:
        raise Refused(f"cannot bind {contract.host_port(plan.serve)}: {exc.strerror} "
                      "(another service uses the port? pick another with --port)") from None


def _follow_engine(service: Service, engine_client) -> None:
    """The in-process engine's steps ping the watchdog; its shutdown starts the drain."""
    core = getattr(engine_client, "engine_core", None)
    health = getattr(core, "health", None)
    if health is not None:
        health.on_progress = service.engine_progress
    if hasattr(core, "on_shutdown"):
        def on_shutdown() -> None:
            service.phase = "stopping"
            service.notifier.stopping("stopping: finishing running requests")

        core.on_shutdown = on_shutdown


async def _check_effective(plan: Plan, service: Service, engine_client) -> None:
    """Read the effective settings back from the engine; refuse to serve if any differs from the plan."""
    effective = await read_effective(engine_client, plan)
    effective["idle_trim"] = service.idle_trim_state()
    service.effective = effective
    problems = mismatches(plan, effective)
    if problems:
        for p in problems:
            log.error("effective setting differs from the plan: %s", p)
        raise Refused("refusing to serve: " + "; ".join(problems), code=EXIT_MISMATCH)
    log.info("effective settings match the plan: %s", json.dumps(_summary(effective)))


async def _release_gloo_groups(plan: Plan, service: Service, engine_client) -> None:
    """vLLM's one-rank gloo groups destroyed once the engine has started: their transport threads
    wake 100 times a second each (``vllm_plugin/gloo_groups.py``); what was done is read back."""
    from edgectl_runtime.vllm_plugin.gloo_groups import release_one_rank_groups

    done = await _in_model_worker(engine_client, plan, release_one_rank_groups, "edgectl_release_gloo_groups")
    service.effective["gloo_groups"] = done
    log.info("vLLM's gloo groups: %s", json.dumps(done))


def _uvicorn_log_kwargs(args) -> dict[str, Any]:
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config

    log_config = get_uvicorn_log_config(args)
    return {"log_config": log_config} if log_config is not None else {}


def _summary(effective: dict[str, Any]) -> dict[str, Any]:
    keys = ("kv_cache_bytes", "rope_rows", "threads", "processes", "max_model_len", "linear_format_counts",
            "kernel_isa")
    return {k: effective.get(k) for k in keys}


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
        one_openmp_thread_by_default(plan, os.environ)
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

        inproc.install(engine_threads=plan.threads)
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
