"""The worker's HTTP app as edgectl extends it: its own routes (the read-back, the probes, the
memory attribution) and the wrapper that refuses API requests once draining and counts them for
the idle trim."""

from __future__ import annotations

import json

from edgectl.contract import worker as contract
from edgectl.contract.plan import Topology
from edgectl_runtime.service.state import Service


def add_edgectl_routes(app, service: Service) -> None:
    """``GET /edgectl/effective``: what the engine really runs with, and the worker's phase;
    ``/edgectl/live`` and ``/edgectl/ready`` for probes."""
    from fastapi.responses import JSONResponse

    @app.get(contract.EFFECTIVE_ROUTE)
    async def effective() -> JSONResponse:
        body = dict(service.effective or {})
        body.update({"phase": service.phase, "ready_s": service.ready_s, "load_peak": service.load_peak,
                     "warmup": service.warmup,
                     "plan_kv_cache_bytes": service.plan.kv_cache_bytes, "idle_trim": service.idle_trim_state(),
                     "audio_seconds": service.audio_seconds, "transcriptions": service.transcriptions,
                     "images_served": service.images_served, "image_requests": service.image_requests})
        if service.plan.topology is Topology.SINGLE_PROCESS:  # the model runs here: its attention calls so far
            from edgectl_runtime.vllm_plugin import (
                decode_attention,
                gloo_groups,
                lean_attention,
            )

            body["decode_attention"] = decode_attention.counts()
            body["lean_attention"] = lean_attention.counts()
            if body.get("gloo_groups") is not None:  # counted now, not only when they were released
                body["gloo_groups"] = {**body["gloo_groups"], "transport_threads": gloo_groups.gloo_transport_threads()}
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
