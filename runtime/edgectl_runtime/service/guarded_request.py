"""What the request guards share (audio_guard.py, image_guard.py): a request's body read up to a
limit, the same body replayed to the app, and a refusal answered in OpenAI's error shape.

A guard wraps vLLM's app as uvicorn sees it (vLLM builds its middleware stack before edgectl can
add to it, as ``http_app.DrainGuard`` notes): it reads the whole body first, checks it off the
event loop, then either refuses the request itself (:func:`send_refusal`) or hands the body it
read to the app (:func:`replay`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

BAD_REQUEST = 400
TOO_LARGE = 413
# vLLM's ErrorResponse names a 400 "BadRequestError" (vllm/entrypoints/serve/engine/serving.py).
ERROR_TYPES = {BAD_REQUEST: "BadRequestError", TOO_LARGE: "RequestEntityTooLargeError"}


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the HTTP status, a short reason, and one sentence for the client."""

    status: int
    reason: str  # one word for the log: "truncated", "too_big", … (each checker names its own)
    message: str


class ClientGone(Exception):
    """The client disconnected before its request's body arrived."""


async def read_bounded_body(scope, receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is bigger than ``limit`` bytes: refused by its
    Content-Length before a byte is read, else once the bytes read pass the limit (the rest left
    unread). ClientGone if the client leaves first."""
    declared = {k.lower(): v for k, v in scope.get("headers", [])}.get(b"content-length", b"")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def replay(app, scope, receive, send, pending: list[bytes]) -> int | None:
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


def error_body(status: int, message: str, param: str | None) -> bytes:
    """OpenAI's error shape, as vLLM's ErrorResponse has it; ``param`` the field at fault (None: the
    request as a whole)."""
    return json.dumps({"error": {"message": message, "type": ERROR_TYPES.get(status, "BadRequestError"),
                                 "param": param, "code": status}}).encode()


async def send_refusal(send, refusal: Refusal, param: str | None, close: bool) -> None:
    """Answer ``refusal`` in OpenAI's error shape; ``close`` when the body was not read to its end."""
    headers = [(b"content-type", b"application/json")]
    if close:  # the body was not read to its end: the connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": error_body(refusal.status, refusal.message, param)})
