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
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from edgectl_runtime.service.audio_upload import AudioUpload, check_upload
from edgectl_runtime.service.guarded_request import (
    TOO_LARGE,
    ClientGone,
    Refusal,
    read_bounded_body,
    replay,
    send_refusal,
)
from edgectl_runtime.service.state import Service

log = logging.getLogger("edgectl.runtime")

AUDIO_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")
# The form's other fields (model, language, prompt, …) and each part's headers: far under this.
FORM_MARGIN_BYTES = 64 * 1024
# The field a refused upload's error names (OpenAI's error shape: guarded_request.error_body).
FILE_PARAM = "file"


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
    form = _FormParts()
    try:
        parser = MultipartParser(boundary, form.callbacks())
        parser.write(body)  # at once: the parts' spans are then spans of ``body`` itself
        parser.finalize()
    except FormParserError:
        return None  # a malformed form is vLLM's to refuse
    files = [part for part in form.parts if part.disposition().get(b"name") == b"file"]
    if not files or b"filename" not in files[-1].disposition():
        return None  # no file, or a plain field named file: vLLM's form validation answers
    part = files[-1]
    return FilePart(_joined(body, part.spans), part.disposition()[b"filename"].decode("utf-8", "replace"),
                    part.headers.get(b"content-type", b"").decode("latin-1") or None)


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    spans: list[tuple[bytes, int, int]] = field(default_factory=list)  # (buffer, start, end)

    def disposition(self) -> dict[bytes, bytes]:
        return parse_options_header(self.headers.get(b"content-disposition", b""))[1]


class _FormParts:
    """python_multipart's callbacks, collecting each part's headers and where its data lies."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self._field = self._value = b""

    def callbacks(self) -> dict[str, Callable[..., None]]:
        return {"on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_part_data": self._part_data}

    def _part_begin(self) -> None:
        self.parts.append(_Part())

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self.parts[-1].headers[self._field.lower()] = self._value
        self._field = self._value = b""

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        self.parts[-1].spans.append((data, start, end))


def _joined(body: bytes, spans: list[tuple[bytes, int, int]]) -> memoryview:
    """The part's bytes: a view into the body when its spans are one run of it (they are, for a body
    written at once), else a copy joined from them."""
    if not spans:
        return memoryview(b"")
    if all(data is body for data, _, _ in spans) and all(a[2] == b[1] for a, b in zip(spans, spans[1:])):
        return memoryview(body)[spans[0][1]:spans[-1][2]]
    return memoryview(b"".join(data[start:end] for data, start, end in spans))


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
        try:
            body = await read_bounded_body(scope, receive, self._max_upload_bytes + FORM_MARGIN_BYTES)
        except ClientGone:
            return
        if body is None:
            too_big = Refusal(TOO_LARGE, "too_big",
                              f"the request is bigger than this server's limit of {self._max_upload_bytes / 1e6:.1f} MB "
                              "for an audio upload: send a shorter or more compressed recording")
            await _refuse(send, too_big, close=True)
            return
        # In a thread: parsing a 25 MB form takes tens of milliseconds, decoding it up to seconds.
        verdict = await asyncio.to_thread(self._check, headers.get(b"content-type", b"").decode("latin-1"), body)
        if isinstance(verdict, Refusal):
            await _refuse(send, verdict, close=False)
            return
        pending = [body]
        del body  # held only until the app takes it
        status = await replay(self._app, scope, receive, send, pending)
        if status == 200 and isinstance(verdict, AudioUpload):
            self._service.audio_transcribed(verdict.seconds)

    def _check(self, content_type: str, body: bytes) -> AudioUpload | Refusal | None:
        """The upload's verdict; None when the body holds no file part (the app answers that)."""
        part = find_file_part(content_type, body)
        if part is None:
            return None
        return check_upload(part.data, part.filename, part.content_type, max_audio_s=self._max_audio_s,
                            max_upload_bytes=self._max_upload_bytes)


async def _refuse(send, refusal: Refusal, close: bool) -> None:
    log.info("audio upload refused, %d (%s): %s", refusal.status, refusal.reason, refusal.message)
    await send_refusal(send, refusal, FILE_PARAM, close)
