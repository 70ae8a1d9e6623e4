"""The wrapper that checks a chat completion's images before vLLM sees them, and counts the images served.

For ``POST /v1/chat/completions`` on a vision plan: read the JSON body (at most the plan's
``max_request_bytes``), find every image part of every message (``image_url`` and ``input_image``
parts, as vLLM's chat parser finds them: vllm/renderers/chat_utils.py,
``_parse_chat_message_content_mm_part``), refuse more images than ``max_images_per_request``, then
check each (``image_check.check_image_url``, in a thread: it decodes) and either answer the
refusal itself, in OpenAI's error shape naming the image's place in the messages, or hand the
same body, byte for byte, to the app. When the app answers 2xx, the request's images are added
to the Service's count. A body that is not JSON, or not a chat request, is the app's to answer. Everything else passes through untouched. (It wraps the app, as ``audio_guard.AudioGuard``
does, with the same body reading, replay and error shape: guarded_request.py.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

from edgectl.contract.vision import ImageLimits
from edgectl_runtime.service.guarded_request import (
    BAD_REQUEST,
    TOO_LARGE,
    ClientGone,
    Refusal,
    read_bounded_body,
    replay,
    send_refusal,
)
from edgectl_runtime.service.image_check import check_image_url
from edgectl_runtime.service.state import Service

log = logging.getLogger("edgectl.runtime")

CHAT_ROUTE = "/v1/chat/completions"
# The part types that carry an image URL (vllm/renderers/chat_utils.py, MM_PARSER_MAP); a part
# with no type but an ``image_url`` key is one too. (``image_embeds`` needs --enable-mm-embeds,
# which no plan passes: vLLM refuses it itself.)
IMAGE_PART_TYPES = ("image_url", "input_image")


class ImageGuard:
    """The app as uvicorn sees it: a chat completion's images checked before vLLM decodes them."""

    def __init__(self, app, service: Service, limits: ImageLimits) -> None:
        self._app = app
        self._service = service
        self._limits = limits
        service.count_images()

    def __getattr__(self, name: str):
        return getattr(self._app, name)

    async def __call__(self, scope, receive, send) -> None:
        if not (scope.get("type") == "http" and scope.get("method") == "POST" and scope.get("path") == CHAT_ROUTE):
            await self._app(scope, receive, send)
            return
        limit = self._limits.max_request_bytes
        try:
            body = await read_bounded_body(scope, receive, limit)
        except ClientGone:
            return
        if body is None:
            too_big = Refusal(TOO_LARGE, "too_big",
                              f"the request is bigger than this server's limit of {limit:,} bytes "
                              f"({limit / 2**20:.1f} MiB, max_request_bytes) for a chat completion, its images "
                              "included: send fewer or smaller images (JPEG compresses a photograph the most)")
            await _refuse(send, too_big, None, close=True)
            return
        # In a thread: parsing a 20 MB body takes tens of milliseconds, decoding its images more.
        verdict = await asyncio.to_thread(self.check, body)
        if isinstance(verdict, tuple):
            await _refuse(send, *verdict, close=False)
            return
        pending = [body]
        del body  # held only until the app takes it
        status = await replay(self._app, scope, receive, send, pending)
        if verdict > 0 and status is not None and 200 <= status < 300:
            self._service.images_answered(verdict)

    def check(self, body: bytes) -> tuple[Refusal, str | None] | int:
        """Why the request is refused and the field it names (None: the request as a whole), or the
        number of images it carries, all passed, to hand it to the app (0: none, or not JSON)."""
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            return 0  # not JSON: vLLM's to answer
        images = list(image_parts(request))
        limits = self._limits
        if len(images) > limits.max_images_per_request:
            return Refusal(BAD_REQUEST, "too_many_images",
                           f"the request carries {len(images)} images, over this server's limit of "
                           f"{limits.max_images_per_request} per request (max_images_per_request): send at most "
                           f"{limits.max_images_per_request}, in more requests if need be"), "messages"
        for n, (path, url) in enumerate(images, 1):
            verdict = check_image_url(url, f"image {n} ({path})", max_pixels=limits.max_pixels,
                                      allow_remote_urls=limits.allow_remote_urls)
            if isinstance(verdict, Refusal):
                return verdict, path
        return len(images)


def image_parts(request: Any) -> Iterator[tuple[str, object]]:
    """Every image part of a chat request's messages: its path (``messages[0].content[1]``) and its URL
    (whatever the part holds there; None if nothing). A part naming a cached image by ``uuid``
    with no URL is vLLM's to resolve, and skipped."""
    messages = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue  # a string: text only
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind not in IMAGE_PART_TYPES and not (kind is None and "image_url" in part):
                continue
            url = part.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            if url is None and part.get("uuid") is not None:
                continue
            yield f"messages[{i}].content[{j}]", url


async def _refuse(send, refusal: Refusal, param: str | None, close: bool) -> None:
    log.info("chat completion's image refused, %d (%s): %s", refusal.status, refusal.reason, refusal.message)
    await send_refusal(send, refusal, param, close)
