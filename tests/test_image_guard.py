"""A chat completion's images checked before vLLM sees them (runtime/edgectl_runtime/service/image_guard.py),
driven in-process through the app as the worker wraps it (``worker._guarded`` inside ``DrainGuard``):
a small Starlette app stands in for vLLM's and records the bodies it was given. Every bad image is
answered by the guard in OpenAI's error shape, naming the image and the fix, and never reaches the
app; the app answers the next good request after each; a good request reaches it byte for byte,
and its images are counted once the app answers 2xx."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace

import pytest

pytest.importorskip("PIL")

from image_files import bad_requests, chat, data_uri, encoded  # noqa: E402
from plan_helpers import SMOLLM2, host_facts, make_plan, shape  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from edgectl.contract.effective import Effective  # noqa: E402
from edgectl.contract.plan import Plan  # noqa: E402
from edgectl.contract.vision import ImageLimits, VisionServe  # noqa: E402
from edgectl_runtime.service.http_app import DrainGuard  # noqa: E402
from edgectl_runtime.service.image_guard import ImageGuard, image_parts  # noqa: E402
from edgectl_runtime.service.state import Service  # noqa: E402
from edgectl_runtime.service.worker import _guarded  # noqa: E402

CHAT = "/v1/chat/completions"
LIMITS = ImageLimits(max_pixels=1024 * 1024, max_images_per_request=2, max_request_bytes=300_000)


class Notes:
    def status(self, text: str) -> None:
        pass

    def watchdog(self) -> None:
        pass


class StandIn:
    """vLLM's chat route as far as the guard can tell: the body recorded, a JSON answer."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.loop_threads: list[int] = []

    async def chat(self, request) -> JSONResponse:
        self.loop_threads.append(threading.get_ident())
        self.bodies.append(await request.body())
        if b'"model": "nope"' in self.bodies[-1]:  # vLLM's answer to an unknown model
            return JSONResponse({"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError",
                                           "param": "model", "code": 404}}, status_code=404)
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": "42"}}]})

    async def models(self, request) -> JSONResponse:
        return JSONResponse({"data": [{"id": "smolvlm"}]})

    def app(self) -> Starlette:
        return Starlette(routes=[Route(CHAT, self.chat, methods=["POST"]), Route("/v1/models", self.models)])


@pytest.fixture(scope="module")
def text_plan() -> Plan:
    return make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2))


def worker_app(plan: Plan, stand_in: StandIn, service: Service | None = None):
    """The app as the worker serves it (worker.serve: DrainGuard(_guarded(app, plan, service), service))."""
    service = service or Service(plan, Notes())
    return DrainGuard(_guarded(stand_in.app(), plan, service), service)


@pytest.fixture()
def served(text_plan):
    stand_in = StandIn()
    plan = replace(text_plan, vision=VisionServe(images=LIMITS))
    service = Service(plan, Notes())
    with TestClient(worker_app(plan, stand_in, service)) as client:
        yield client, stand_in, service


def body_of(request: dict) -> bytes:
    return json.dumps(request).encode()


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["type"] == {400: "BadRequestError", 413: "RequestEntityTooLargeError"}[status]
    return error


GOOD = {fmt: data_uri(encoded(fmt), f"image/{fmt.lower()}") for fmt in ("PNG", "JPEG", "WEBP", "GIF")}


def test_good_images_reach_the_app_byte_for_byte(served):
    client, stand_in, _ = served
    sent = [body_of(chat(GOOD["PNG"], GOOD["JPEG"])), body_of(chat(GOOD["WEBP"])), body_of(chat(GOOD["GIF"])),
            body_of(chat())]
    for body in sent:
        r = client.post(CHAT, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
    assert stand_in.bodies == sent


def _bad_cases() -> list[tuple[str, bytes, int, str, tuple[str, ...]]]:
    return [(name, body_of(request), status, reason, words) for name, request, status, reason, words in bad_requests(LIMITS)]


@pytest.mark.parametrize(("name", "body", "status", "reason", "words"), _bad_cases(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_bad_case_is_refused_by_the_guard_and_the_app_answers_after_it(served, name, body, status, reason, words):
    client, stand_in, service = served
    r = client.post(CHAT, content=body, headers={"content-type": "application/json"})
    error = error_of(r, status)
    for word in words:
        assert word in error["message"], (word, error["message"])
    if status == 400 and reason != "too_many_images":
        assert error["param"] == "messages[0].content[1]" and error["message"].startswith("image 1 (messages[0]")
    assert stand_in.bodies == []  # never reached the app
    good = body_of(chat(GOOD["JPEG"]))
    assert client.post(CHAT, content=good).status_code == 200  # the service keeps serving
    assert client.get("/v1/models").status_code == 200
    assert stand_in.bodies == [good]
    assert (service.images_served, service.image_requests) == (1, 1)  # the good one only


def test_the_images_answered_2xx_are_counted_and_nothing_else(served):
    client, stand_in, service = served
    assert (service.images_served, service.image_requests) == (0, 0)  # counting from the start
    for request in (chat(GOOD["PNG"], GOOD["JPEG"]), chat(GOOD["WEBP"])):
        assert client.post(CHAT, content=body_of(request)).status_code == 200
    assert (service.images_served, service.image_requests) == (3, 2)
    assert client.post(CHAT, content=body_of(chat())).status_code == 200  # no image: not an image request
    assert client.post(CHAT, content=body_of(chat(GOOD["PNG"]) | {"model": "nope"})).status_code == 404
    assert client.post(CHAT, content=body_of(chat(GOOD["PNG"], "data:image/png;base64,AAAA"))).status_code == 400
    assert (service.images_served, service.image_requests) == (3, 2) and len(stand_in.bodies) == 4


def test_the_workers_report_carries_the_counts(served, text_plan):
    fastapi = pytest.importorskip("fastapi")
    from edgectl_runtime.service.http_app import add_edgectl_routes

    client, _, service = served
    assert client.post(CHAT, content=body_of(chat(GOOD["PNG"], GOOD["GIF"]))).status_code == 200
    reports = []
    for worker_state in (service, Service(text_plan, Notes())):  # a vision plan's worker, a text plan's
        app = fastapi.FastAPI()
        add_edgectl_routes(app, worker_state)
        with TestClient(app) as worker:
            reports.append(Effective.from_dict(worker.get("/edgectl/effective").json()))
    assert (reports[0].images_served, reports[0].image_requests) == (2, 1)
    assert (reports[1].images_served, reports[1].image_requests) == (None, None)


def test_the_second_image_is_named_when_it_is_the_bad_one(served):
    client, _, _ = served
    error = error_of(client.post(CHAT, content=body_of(chat(GOOD["PNG"], "data:image/png;base64,AAAA"))), 400)
    assert error["param"] == "messages[0].content[2]" and error["message"].startswith("image 2 (messages[0].content[2])")


def test_a_remote_url_reaches_the_app_when_the_plan_allows_it(text_plan):
    stand_in = StandIn()
    plan = replace(text_plan, vision=VisionServe(images=replace(LIMITS, allow_remote_urls=True)))
    with TestClient(worker_app(plan, stand_in)) as client:
        body = body_of(chat("https://example.com/cat.png"))
        assert client.post(CHAT, content=body).status_code == 200
    assert stand_in.bodies == [body]


def test_what_is_not_a_chat_with_images_is_the_apps_to_answer(served):
    client, stand_in, service = served
    bodies = [b"{not json", b"[1, 2]", body_of({"messages": "hi"}),
              body_of({"messages": [{"role": "user", "content": "plain text"}]})]
    for body in bodies:
        assert client.post(CHAT, content=body).status_code == 200
    assert stand_in.bodies == bodies and (service.images_served, service.image_requests) == (0, 0)


def test_image_parts_are_found_as_vllms_chat_parser_finds_them():
    request = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "compare"},
            {"type": "image_url", "image_url": {"url": "data:a"}},
            {"type": "input_image", "image_url": "data:b"},
            {"image_url": {"url": "data:c"}},  # no type: vLLM reads image_url
            {"type": "image_url", "image_url": {"url": None}, "uuid": "cached-1"},  # vLLM's cache: skipped
            {"type": "image_url", "image_url": {}},  # no URL: refused by the check
            {"type": "audio_url", "audio_url": {"url": "data:d"}},
        ]}]}
    assert list(image_parts(request)) == [("messages[1].content[1]", "data:a"), ("messages[1].content[2]", "data:b"),
                                          ("messages[1].content[3]", "data:c"), ("messages[1].content[5]", None)]


def test_a_text_or_speech_plan_is_served_as_before(text_plan):
    service = Service(text_plan, Notes())
    app = StandIn().app()
    assert _guarded(app, text_plan, service) is app
    vision = _guarded(app, replace(text_plan, vision=VisionServe()), service)
    assert isinstance(vision, ImageGuard) and vision.routes is app.routes  # uvicorn sees the app through it


def run_raw(guard: ImageGuard, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
    """One request straight through the ASGI interface: what was sent back, and how many body chunks
    the guard asked for."""
    asked, sent = [], []

    async def receive():
        asked.append(1)
        i = len(asked) - 1
        if i >= len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[i], "more_body": i < len(chunks) - 1}

    async def send(message):
        sent.append(message)

    asyncio.run(guard({"type": "http", "method": "POST", "path": CHAT, "headers": headers}, receive, send))
    return sent, len(asked)


def test_a_body_over_the_limit_is_refused_without_reading_it_all(text_plan):
    stand_in = StandIn()
    guard = ImageGuard(stand_in.app(), Service(text_plan, Notes()), LIMITS)
    chunk = b" " * 16384
    chunks = [chunk] * (LIMITS.max_request_bytes // len(chunk) + 10)
    sent, asked = run_raw(guard, [(b"content-length", str(len(chunk) * len(chunks)).encode())], chunks)
    assert asked == 0 and sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
    sent, asked = run_raw(guard, [], chunks)  # chunked, no length: read up to the limit only
    assert sent[0]["status"] == 413 and asked == LIMITS.max_request_bytes // len(chunk) + 1 < len(chunks)
    assert json.loads(sent[1]["body"])["error"]["param"] is None and stand_in.bodies == []


def test_a_body_in_many_chunks_is_replayed_whole(text_plan):
    stand_in = StandIn()
    body = body_of(chat(GOOD["PNG"]))
    guard = ImageGuard(stand_in.app(), Service(text_plan, Notes()), LIMITS)
    sent, _ = run_raw(guard, [], [body[i:i + 1000] for i in range(0, len(body), 1000)])
    assert sent[0]["status"] == 200 and stand_in.bodies == [body]


def test_the_images_are_checked_off_the_event_loop(served, monkeypatch):
    from edgectl_runtime.service import image_guard

    client, stand_in, _ = served
    checked_on, real = [], image_guard.check_image_url

    def recorded(*args, **kwargs):
        checked_on.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(image_guard, "check_image_url", recorded)
    assert client.post(CHAT, content=body_of(chat(GOOD["PNG"]))).status_code == 200
    assert len(checked_on) == len(stand_in.loop_threads) == 1 and checked_on != stand_in.loop_threads
