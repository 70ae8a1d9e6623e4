"""The wrapper that checks an audio upload before vLLM sees it, and counts the audio transcribed.

For ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations``: read the multipart body
(at most the plan's ``max_upload_bytes`` and a margin for the form's other fields), find its
``file`` part, check it (``audio_upload.check_upload``, in a thread: it decodes), and either answer
the refusal itself, in OpenAI's error shape, or hand the same body to the app. When the app
answers 200, the upload's seconds are added to the Service's count. Everything else passes
through untouched. (vLLM builds its middleware stack before edgectl can add to it, so this wraps
the app, as ``http_app.DrainGuard`` does.)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from python_multipart.multipart import MultipartParser, parse_options_header

from edgectl_runtime.service.audio_upload import (
    TOO_LARGE,
    AudioUpload,
    Refusal,
    check_upload,
)
from edgectl_runtime.service.state import Service

AUDIO_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")
# The form's other fields (model, language, prompt, …) and each part's headers: far under this.
FORM_MARGIN_BYTES = 64 * 1024
# vLLM's ErrorResponse names a 400 "BadRequestError" (vllm/entrypoints/serve/engine/serving.py).
_ERROR_TYPES = {400: "BadRequestError", TOO_LARGE: "RequestEntityTooLargeError"}


@dataclass(frozen=True)
class FilePart:
    """The form's ``file`` part: its bytes (a view into the body) and what the client said of them."""

    data: memoryview
    filename: str | None
    content_type: str | None


def find_file_part(content_type: str, body: bytes) -> FilePart | None:
    """The last ``file`` part of a multipart/form-data body (the one Starlette's form gives vLLM),
    or None: not multipart, malformed, or no such part (vLLM answers those itself)."""
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        return None
    parts: list[dict] = []
    header: dict[str, bytes] = {"field": b"", "value": b""}

    def on_part_begin() -> None:
        parts.append({"headers": {}, "spans": []})

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header["value"] += data[start:end]

    def on_header_end() -> None:
        parts[-1]["headers"][header["field"].lower()] = header["value"]
        header["field"] = header["value"] = b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        # Fed the whole body in one write, the parser hands back spans of that same object.
        parts[-1]["spans"].append((data, start, end))

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                                        "on_header_value": on_header_value, "on_header_end": on_header_end,
                                        "on_part_data": on_part_data})
    try:
        parser.write(body)
        parser.finalize()
    except Exception:  # python_multipart's errors: a malformed form is vLLM's to refuse
        return None
    found = None
    for part in parts:
        _, options = parse_options_header(part["headers"].get(b"content-disposition", b""))
        if options.get(b"name") == b"file":
            found = part
    if found is None or b"filename" not in parse_options_header(found["headers"][b"content-disposition"])[1]:
        return None  # no file, or a plain field named file: vLLM's form validation answers
    options = parse_options_header(found["headers"][b"content-disposition"])[1]
    return FilePart(_joined(body, found["spans"]), options[b"filename"].decode("utf-8", "replace"),
                    found["headers"].get(b"content-type", b"").decode("latin-1") or None)


def _joined(body: bytes, spans: list[tuple[bytes, int, int]]) -> memoryview:
    """The part's bytes: a view into the body when its spans are one run of it (they are, for a body
    written at once), else a copy joined from them."""
    if not spans:
        return memoryview(b"")
    if all(data is body for data, _, _ in spans) and all(a[2] == b[1] for a, b in zip(spans, spans[1:])):
        return memoryview(body)[spans[0][1]:spans[-1][2]]
    return memoryview(b"".join(data[start:end] for data, start, end in spans))


def error_body(status: int, message: str) -> bytes:
    """OpenAI's error shape, as vLLM's ErrorResponse has it."""
    return json.dumps({"error": {"message": message, "type": _ERROR_TYPES.get(status, "BadRequestError"),
                                 "param": "file", "code": status}}).encode()


class AudioGuard:
    """The app as uvicorn sees it: audio uploads checked before vLLM decodes them."""

    def __init__(self, app, service: Service, max_audio_s: float, max_upload_bytes: int) -> None:
        self._app = app
        self._service = service
        self._max_audio_s = max_audio_s
        self._max_upload_bytes = max_upload_bytes
        service.count_audio()

    def __getattr__(self, name: str):
        return getattr(self._app, name)

    async def __call__(self, scope, receive, send) -> None:
        if not (scope.get("type") == "http" and scope.get("method") == "POST" and scope.get("path") in AUDIO_ROUTES):
            await self._app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        limit = self._max_upload_bytes + FORM_MARGIN_BYTES
        too_big = Refusal(TOO_LARGE, "too_big",
                          f"the request is bigger than this server's limit of {self._max_upload_bytes / 1e6:.1f} MB "
                          "for an audio upload: send a shorter or more compressed recording")
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, too_big, close=True)  # refused before its body is read
            return
        try:
            body = await _read_body(receive, limit)
        except _ClientGone:
            return
        if body is None:
            await _refuse(send, too_big, close=True)
            return
        part = find_file_part(headers.get(b"content-type", b"").decode("latin-1"), body)
        verdict = None
        if part is not None:
            verdict = await asyncio.to_thread(check_upload, part.data, part.filename, part.content_type,
                                              max_audio_s=self._max_audio_s, max_upload_bytes=self._max_upload_bytes)
            part = None  # the view into the body: the app is handed the body itself
        if isinstance(verdict, Refusal):
            await _refuse(send, verdict, close=False)
            return
        pending = [body]
        del body  # held only until the app takes it
        status = await _replay(self._app, scope, receive, send, pending)
        if status == 200 and isinstance(verdict, AudioUpload):
            self._service.audio_transcribed(verdict.seconds)


class _ClientGone(Exception):
    """The client disconnected before its request's body arrived."""


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole request body, or None once it passes ``limit`` bytes (the rest left unread)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _replay(app, scope, receive, send, pending: list[bytes]) -> int | None:
    """Run ``app`` with the body in ``pending`` as the request's (handed over, not kept); the
    status it answered (None: none)."""
    status: list[int] = []

    async def replayed_receive():
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()  # after the body: the client's disconnect, when it comes

    async def watched_send(message) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        await send(message)

    await app(scope, replayed_receive, watched_send)
    return status[0] if status else None


async def _refuse(send, refusal: Refusal, close: bool) -> None:
    headers = [(b"content-type", b"application/json")]
    if close:  # the body was not read to its end: the connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": error_body(refusal.status, refusal.message)})
