"""A vision service's warm-up (runtime/edgectl_runtime/service/warmup.py): the shipped image
(edgectl/data/vision/warmup.png, what scripts/make_warmup_image.py writes) in one chat completion, as a
data: URI, through the worker's own HTTP API and so through the image guard; READY only once an answer of
at least one token came back. A small Starlette app stands in for vLLM's, served by uvicorn as the
worker serves it (``DrainGuard(_guarded(app))``)."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import socket
import struct
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("PIL")
uvicorn = pytest.importorskip("uvicorn")

from plan_helpers import SMOLLM2, host_facts, make_plan, shape  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from edgectl.contract import worker as contract  # noqa: E402
from edgectl.contract.plan import Plan, Serve  # noqa: E402
from edgectl.contract.vision import VisionServe  # noqa: E402
from edgectl_runtime.service.http_app import DrainGuard  # noqa: E402
from edgectl_runtime.service.state import Service  # noqa: E402
from edgectl_runtime.service.warmup import warm_up, warmup_image_request  # noqa: E402
from edgectl_runtime.service.worker import _guarded  # noqa: E402

GENERATOR = Path(__file__).resolve().parents[1] / "scripts" / "make_warmup_image.py"


def test_the_shipped_image_is_what_its_generator_writes():
    spec = importlib.util.spec_from_file_location("make_warmup_image", GENERATOR)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    data = contract.WARMUP_IMAGE.read_bytes()
    assert data == generator.warmup_png() and len(data) <= 20 * 1024
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (256, 256)


class Notes:
    def status(self, text: str) -> None:
        pass

    def watchdog(self) -> None:
        pass


class StandIn:
    """vLLM's routes as far as the warm-up can tell: the chat bodies recorded, ``tokens`` generated."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.bodies: list[dict] = []

    async def chat(self, request) -> JSONResponse:
        self.bodies.append(json.loads(await request.body()))
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "circle" if self.tokens else ""}}],
                             "usage": {"prompt_tokens": 1142, "completion_tokens": self.tokens}})

    async def health(self, request) -> JSONResponse:
        return JSONResponse({})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                 Route("/health", self.health)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vision_plan() -> Plan:
    plan = make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2))
    return replace(plan, vision=VisionServe(), serve=Serve(plan.serve.name, "127.0.0.1", _free_port()))


def warm_up_against(plan: Plan, stand_in: StandIn) -> str:
    """The warm-up run against the worker's app (the guard in front of the stand-in), served on plan.serve."""
    app = DrainGuard(_guarded(stand_in.app(), plan, Service(plan, Notes())), Service(plan, Notes()))
    server = uvicorn.Server(uvicorn.Config(app, host=plan.serve.host, port=plan.serve.port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return asyncio.run(warm_up(plan))
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_warm_up_asks_about_the_shipped_image_through_the_guard(vision_plan):
    stand_in = StandIn(tokens=3)
    assert warm_up_against(vision_plan, stand_in) == "circle"
    (body,) = stand_in.bodies  # the guard let it through, unchanged
    assert body == warmup_image_request(vision_plan.model.name)
    text, image = body["messages"][0]["content"]
    assert text == {"type": "text", "text": contract.WARMUP_IMAGE_QUESTION}
    prefix = "data:image/png;base64,"
    assert image["image_url"]["url"].startswith(prefix)
    assert base64.b64decode(image["image_url"]["url"][len(prefix):]) == contract.WARMUP_IMAGE.read_bytes()


def test_an_answer_without_a_token_fails_the_warm_up(vision_plan):
    with pytest.raises(RuntimeError, match="warm-up answered warmup.png with no tokens"):
        warm_up_against(replace(vision_plan, serve=replace(vision_plan.serve, port=_free_port())), StandIn(tokens=0))
