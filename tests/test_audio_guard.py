"""The audio uploads' wrapper (runtime/edgectl_runtime/service/audio_guard.py), driven in-process: a
small Starlette app stands in for vLLM's (it reads the form as vLLM's route does and records the
body it was given). A refused upload is answered by the wrapper in OpenAI's error shape and never
reaches the app; an accepted one reaches it byte for byte; the audio is counted only on a 200."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from audio_clips import speech_wav, tone_wav
from plan_helpers import SMOLLM2, host_facts, make_plan, shape
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from edgectl.contract.effective import Effective
from edgectl_runtime.service.audio_guard import (
    FORM_MARGIN_BYTES,
    AudioGuard,
    find_file_part,
)
from edgectl_runtime.service.http_app import DrainGuard
from edgectl_runtime.service.state import Service

pytest.importorskip("av")
pytest.importorskip("soundfile")

LIMIT_S = 10.0
MAX_BYTES = 2_000_000
BOUNDARY = "edgectl-test-boundary"
TRANSCRIBE = "/v1/audio/transcriptions"


class Notes:
    def status(self, text: str) -> None:
        pass

    def watchdog(self) -> None:
        pass


class StandIn:
    """vLLM's audio routes as far as the wrapper can tell: the form read, the body recorded; the
    model named "nope" is 404, as vLLM answers an unknown model."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.loop_threads: list[int] = []  # the thread each request was answered on (the event loop's)

    async def audio(self, request) -> JSONResponse:
        self.loop_threads.append(threading.get_ident())
        self.bodies.append(await request.body())
        form = await request.form()
        if form.get("model") == "nope":
            return JSONResponse({"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError",
                                           "param": "model", "code": 404}}, status_code=404)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            return JSONResponse({"detail": "file: Field required"}, status_code=422)
        return JSONResponse({"text": f"{len(await upload.read())} bytes heard"})

    async def chat(self, request) -> JSONResponse:
        self.bodies.append(await request.body())
        return JSONResponse({"ok": True})

    def app(self) -> Starlette:
        return Starlette(routes=[Route(TRANSCRIBE, self.audio, methods=["POST"]),
                                 Route("/v1/audio/translations", self.audio, methods=["POST"]),
                                 Route("/v1/chat/completions", self.chat, methods=["POST"])])


def form(file: bytes | None, filename: str = "clip.wav", model: str = "whisper-base", **fields: str) -> bytes:
    """A multipart/form-data body as OpenAI's clients send it."""
    out = b""
    for name, value in {"model": model, **fields}.items():
        out += (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n").encode()
    if file is not None:
        out += (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode() + file + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


HEADERS = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


@pytest.fixture()
def served():
    service = Service(make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2)), Notes())
    stand_in = StandIn()
    guard = AudioGuard(stand_in.app(), service, max_audio_s=LIMIT_S, max_upload_bytes=MAX_BYTES)
    with TestClient(guard) as client:
        yield client, service, stand_in


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> bytes:
    return speech_wav(tmp_path_factory.mktemp("clips")).read_bytes()


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error["message"]


def test_a_good_upload_reaches_the_app_byte_for_byte_and_is_counted(served, wav):
    client, service, stand_in = served
    assert (service.audio_seconds, service.transcriptions) == (0.0, 0)  # counting from the start
    body = form(wav, language="en")
    for route in (TRANSCRIBE, "/v1/audio/translations"):
        r = client.post(route, content=body, headers=HEADERS)
        assert r.status_code == 200 and r.json() == {"text": f"{len(wav)} bytes heard"}
    assert stand_in.bodies == [body, body]
    assert service.transcriptions == 2 and service.audio_seconds == pytest.approx(2 * 2.78, abs=0.1)


def test_a_truncated_upload_is_refused_in_openais_shape_and_never_reaches_the_app(served, wav):
    client, service, stand_in = served
    r = client.post(TRANSCRIBE, content=form(wav[: len(wav) // 2]), headers=HEADERS)
    message = error_of(r, 400)
    assert r.json()["error"]["type"] == "BadRequestError"
    assert "'clip.wav' is a truncated WAV" in message and "upload the whole file again" in message
    for bad, words in [(b"", "is empty"), (b"plain text, no audio at all\n" * 20, "is not audio")]:
        assert words in error_of(client.post(TRANSCRIBE, content=form(bad), headers=HEADERS), 400)
    assert stand_in.bodies == [] and (service.audio_seconds, service.transcriptions) == (0.0, 0)


def test_longer_than_the_plan_allows_is_413_naming_the_limit(served, tmp_path):
    client, service, stand_in = served
    r = client.post(TRANSCRIBE, content=form(tone_wav(tmp_path / "12s.wav", 12).read_bytes()), headers=HEADERS)
    assert "this server's limit" in error_of(r, 413) and "10 s" in r.json()["error"]["message"]
    assert stand_in.bodies == [] and service.transcriptions == 0


def test_the_apps_own_refusal_passes_through_and_is_not_counted(served, wav):
    client, service, stand_in = served
    r = client.post(TRANSCRIBE, content=form(wav, model="nope"), headers=HEADERS)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = client.post(TRANSCRIBE, content=form(None), headers=HEADERS)  # no file part: the app's 422
    assert r.status_code == 422
    assert len(stand_in.bodies) == 2 and (service.audio_seconds, service.transcriptions) == (0.0, 0)


def test_other_routes_pass_through_untouched(served):
    client, service, stand_in = served
    assert client.post("/v1/chat/completions", content=b"{\"x\": 1}").json() == {"ok": True}
    assert client.get(TRANSCRIBE).status_code == 405  # not a POST: the app's answer
    assert stand_in.bodies == [b"{\"x\": 1}"] and service.transcriptions == 0


def run_raw(guard: AudioGuard, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
    """One request straight through the ASGI interface: what was sent back, and how many body
    chunks the wrapper asked for."""
    asked, sent = [], []

    async def receive():
        asked.append(1)
        i = len(asked) - 1
        if i >= len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[i], "more_body": i < len(chunks) - 1}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": TRANSCRIBE, "headers": headers}
    asyncio.run(guard(scope, receive, send))
    return sent, len(asked)


def _guard():
    service = Service(make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2)), Notes())
    stand_in = StandIn()
    return AudioGuard(stand_in.app(), service, max_audio_s=LIMIT_S, max_upload_bytes=MAX_BYTES), stand_in


def test_a_body_bigger_than_the_limit_is_refused_without_reading_it_all():
    guard, stand_in = _guard()
    chunk = b"\0" * 65536
    chunks = [chunk] * ((MAX_BYTES + FORM_MARGIN_BYTES) // len(chunk) + 20)
    ctype = (b"content-type", HEADERS["content-type"].encode())
    declared = (b"content-length", str(len(chunk) * len(chunks)).encode())
    sent, asked = run_raw(guard, [ctype, declared], chunks)  # declared too big: not one chunk read
    assert asked == 0 and sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
    assert "bigger than this server's limit of 2.0 MB" in json.loads(sent[1]["body"])["error"]["message"]
    sent, asked = run_raw(guard, [ctype], chunks)  # chunked, no length: read up to the limit only
    assert sent[0]["status"] == 413 and asked == (MAX_BYTES + FORM_MARGIN_BYTES) // len(chunk) + 1 < len(chunks)
    assert stand_in.bodies == []


def test_a_body_in_many_chunks_is_replayed_whole(wav):
    guard, stand_in = _guard()
    body = form(wav)
    chunks = [body[i:i + 1000] for i in range(0, len(body), 1000)]
    sent, _ = run_raw(guard, [(b"content-type", HEADERS["content-type"].encode())], chunks)
    assert sent[0]["status"] == 200 and stand_in.bodies == [body]


def test_a_client_gone_before_its_body_arrived_gets_nothing(wav):
    guard, stand_in = _guard()
    sent, _ = run_raw(guard, [(b"content-type", HEADERS["content-type"].encode())], [])
    assert sent == [] and stand_in.bodies == []


def test_the_file_part_is_a_view_into_the_body(wav):
    body = form(wav, filename="talk.wav", prompt="--edgectl-test-boundar\r\n--")
    part = find_file_part(HEADERS["content-type"], body)
    assert part is not None and part.filename == "talk.wav" and part.content_type == "application/octet-stream"
    assert part.data.obj is body and part.data.tobytes() == wav
    assert find_file_part("application/json", body) is None
    assert find_file_part(HEADERS["content-type"], form(None)) is None
    assert find_file_part(HEADERS["content-type"], b"no boundary here\r\n" + wav[:100]) is None
    field_named_file = form(None).replace(b"name=\"model\"", b"name=\"file\"")  # a plain field, no filename
    assert find_file_part(HEADERS["content-type"], field_named_file) is None


def test_the_workers_report_carries_the_counts(served, wav):
    fastapi = pytest.importorskip("fastapi")
    from edgectl_runtime.service.http_app import add_edgectl_routes

    client, service, _ = served
    client.post(TRANSCRIBE, content=form(wav), headers=HEADERS)
    app = fastapi.FastAPI()
    add_edgectl_routes(app, service)
    with TestClient(app) as worker:
        report = Effective.from_dict(worker.get("/edgectl/effective").json())
    assert report.transcriptions == 1 and report.audio_seconds == pytest.approx(2.78, abs=0.05)


def test_inside_the_drain_guard_as_the_worker_wraps_it(wav):
    """DrainGuard(AudioGuard(app, …), service): uvicorn still sees the app's attributes through both."""
    service = Service(make_plan(host_facts("kvm-epyc-avx2-2c"), shape(SMOLLM2)), Notes())
    app = StandIn().app()
    outer = DrainGuard(AudioGuard(app, service, max_audio_s=LIMIT_S, max_upload_bytes=MAX_BYTES), service)
    assert outer.state is app.state and outer.routes is app.routes
    with TestClient(outer) as client:
        assert client.post(TRANSCRIBE, content=form(wav), headers=HEADERS).status_code == 200
        assert client.post(TRANSCRIBE, content=form(wav[:100]), headers=HEADERS).status_code == 400
    assert service.transcriptions == 1


def test_the_form_is_parsed_and_decoded_off_the_event_loop(served, wav, monkeypatch):
    from edgectl_runtime.service import audio_guard

    client, _, stand_in = served
    parsed_on, real = [], audio_guard.find_file_part

    def recorded(*args):
        parsed_on.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(audio_guard, "find_file_part", recorded)
    assert client.post(TRANSCRIBE, content=form(wav), headers=HEADERS).status_code == 200
    assert len(parsed_on) == len(stand_in.loop_threads) == 1 and parsed_on != stand_in.loop_threads
