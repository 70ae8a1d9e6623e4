"""One image of a chat completion, checked before vLLM sees it: what it is (format, width, height),
or why the server refuses it (an HTTP status and one sentence saying what was wrong and what to do).

The image comes as a URL (OpenAI's ``image_url.url``). A ``data:`` URI is read whole: its media type
must be an image's and its data base64 (vLLM decodes nothing else: vllm/multimodal/media/connector.py,
``_load_data_url``), the bytes an image of a supported format, its header readable, its size at
least one pixel each way and at most the plan's ``max_pixels``, and its pixels decoded to the end
(a PNG or JPEG cut short is refused here, before the request reaches vLLM's parser). An http(s)
URL is refused unless the plan allows remote images; then vLLM fetches it and its own loader
checks it (vllm/multimodal/media/image.py, ``ImageMediaIO.load_bytes``). A ``file:`` URL is
always refused.

The size is read from the header before any pixel is decoded, so a 40000 x 40000 image costs its
header only. Pillow's ``Image.open`` would refuse such an image itself, with its own
decompression-bomb error (``_open_core`` calls ``_decompression_bomb_check(im.size)`` after the
format's reader, PIL/Image.py), naming its own limit; the reader is called here directly instead,
so the plan's limit is the one checked and named, and no global of Pillow's is changed.

It decodes: call it from a thread.
"""

from __future__ import annotations

import binascii
import io
import math
from base64 import b64decode
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image, ImageFile

from edgectl_runtime.service.guarded_request import BAD_REQUEST, Refusal

# Pillow's names for the formats served, and how a message writes them: OpenAI's four image inputs
# (docs/vision-guard.md). vLLM's loader would open 37 (vllm/multimodal/image.py:
# ALLOWED_IMAGE_FORMATS: TIFF, BMP, PSD, FITS, DDS, …): each one more decoder of untrusted bytes
# in the server, for images no camera or OpenAI client sends.
SUPPORTED_FORMATS = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WebP", "GIF": "GIF"}
_SUPPORTED = "PNG, JPEG, WebP or GIF"
_DATA_URI_EXAMPLE = "data:image/png;base64,<the image's bytes in base64>"
_SEND_AGAIN = "send the whole image again"


@dataclass(frozen=True)
class ImageSeen:
    """An image that decoded whole, within the plan's limits."""

    format: str  # Pillow's name: PNG, JPEG, WEBP, GIF
    width: int
    height: int


class _Refused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.refusal = Refusal(BAD_REQUEST, reason, message)


def check_image_url(url: object, where: str, *, max_pixels: int, allow_remote_urls: bool) -> ImageSeen | None | Refusal:
    """One image's URL checked: the image it holds, None for a remote URL the plan lets vLLM fetch,
    or why it is refused. ``where`` names the image in the messages ("image 2 (messages[0].content[1])")."""
    try:
        if not isinstance(url, str) or not url:
            raise _Refused("no_url", f"{where} has no image URL: give it as a data: URI ({_DATA_URI_EXAMPLE})")
        scheme = url.partition(":")[0].lower()
        if scheme == "data":
            return check_image_bytes(data_uri_bytes(url, where), where, max_pixels=max_pixels)
        if scheme in ("http", "https"):
            if allow_remote_urls:
                return None
            raise _Refused("remote_url", f"{where} is a remote URL ({_url_origin(url)}); this deployment fetches no "
                                         f"remote images (no network is assumed): send the image's bytes as a data: URI "
                                         f"({_DATA_URI_EXAMPLE})")
        if scheme == "file":
            raise _Refused("file_url", f"{where} is a file: URL; the server reads no files named in a request: send "
                                       f"the image's bytes as a data: URI ({_DATA_URI_EXAMPLE})")
        raise _Refused("bad_url", f"{where} is neither a data: URI nor an http(s) URL ({url[:24]!r}…): send the "
                                  f"image's bytes as a data: URI ({_DATA_URI_EXAMPLE})")
    except _Refused as exc:
        return exc.refusal


def data_uri_bytes(url: str, where: str) -> bytes:
    """The bytes a ``data:image/…;base64,…`` URI holds (RFC 2397); _Refused naming what is wrong."""
    spec, comma, data = url[5:].partition(",")
    if not comma:
        raise _Refused("bad_data_uri", f"{where} is a malformed data: URI (no ',' before its data): write it as "
                                       f"{_DATA_URI_EXAMPLE}")
    media_type, _, encoding = spec.rpartition(";")
    if encoding.lower() != "base64":  # as vLLM reads it: the last parameter says base64
        raise _Refused("bad_data_uri", f"{where} is a data: URI without ';base64' (this server reads base64 data "
                                       f"only): write it as {_DATA_URI_EXAMPLE}")
    kind = media_type.partition(";")[0].strip().lower()
    if not kind.startswith("image/"):
        said = f"of media type {kind!r}" if kind else "with no media type"
        raise _Refused("bad_data_uri", f"{where} is a data: URI {said}, not an image's: declare the image's type "
                                       f"(image/png, image/jpeg, image/webp or image/gif): {_DATA_URI_EXAMPLE}")
    try:
        return b64decode(data, validate=True)  # strict, as vLLM's pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _Refused("bad_base64", f"{where}'s base64 data does not decode ({exc}): encode the image's bytes in "
                                     "standard base64 (RFC 4648), with no line breaks or spaces") from None


def check_image_bytes(data: bytes, where: str, *, max_pixels: int) -> ImageSeen | Refusal:
    """One image's bytes: its header read for format and size, then its pixels decoded, within the limit."""
    try:
        return _check(data, where, max_pixels)
    except _Refused as exc:
        return exc.refusal


def _check(data: bytes, where: str, max_pixels: int) -> ImageSeen:
    if not data:
        raise _Refused("empty", f"{where} is empty (no bytes): send the image's bytes ({_SUPPORTED})")
    found = _identify(data)
    if found is None:
        raise _Refused("not_image", f"{where} is not an image (its bytes start {data[:8]!r}): send a {_SUPPORTED} image")
    fmt, opener = found
    if fmt not in SUPPORTED_FORMATS:
        raise _Refused("unsupported_format", f"{where} is a {fmt} image; this server takes {_SUPPORTED}: convert it "
                                             "(to PNG for a lossless copy) and send it again")
    name = SUPPORTED_FORMATS[fmt]
    try:
        # The format's reader, without Image.open's decompression-bomb check (module docstring):
        # it reads the header only. Any exception means the header cannot be read: untrusted
        # bytes reach Pillow's readers, and none of their failures may take the worker down.
        image = opener(io.BytesIO(data), "")
    except Exception as exc:
        declared = _png_declared_size(data) if fmt == "PNG" else None
        if declared is not None and 0 in declared:
            raise _Refused("zero_size", _zero_size(where, name, *declared)) from None
        raise _Refused("damaged", f"{where} is a {name} whose header cannot be read ({_said(exc)}): {_SEND_AGAIN}, "
                                  f"or another {_SUPPORTED} image") from None
    with image:
        width, height = image.size
        if width <= 0 or height <= 0:
            raise _Refused("zero_size", _zero_size(where, name, width, height))
        if width * height > max_pixels:
            raise _Refused("too_many_pixels", f"{where} is {width}x{height} = {width * height:,} pixels, over this "
                                              f"server's limit of {max_pixels:,} pixels (max_pixels): scale it down "
                                              f"to {_scaled_to(width, height, max_pixels)} or smaller and send it again")
        try:
            image.load()  # every pixel, once: a file cut short raises here
        except Exception as exc:  # any decoder failure on untrusted bytes (see the header's)
            if "truncated" in str(exc):
                raise _Refused("truncated", f"{where} is a truncated {name} ({_said(exc)}): {_SEND_AGAIN}") from None
            raise _Refused("damaged", f"{where} is a damaged {name} ({_said(exc)}): {_SEND_AGAIN}") from None
    return ImageSeen(fmt, width, height)


def _identify(data: bytes) -> tuple[str, Callable[..., ImageFile.ImageFile]] | None:
    """Pillow's name for the format the bytes start as, and its reader; None for none.

    Every format Pillow knows is asked (so an unsupported one is named), each by its own
    ``accept`` test on the first 16 bytes, as ``Image.open`` asks them (PIL/Image.py, ``_open_core``)."""
    Image.init()  # registers every reader Pillow has (once; at the first image, not at import)
    prefix = data[:16]
    for fmt in Image.ID:
        opener, accept = Image.OPEN[fmt]
        if accept is None:
            continue  # a reader with no test of its own must parse to know: not used to name
        try:
            accepted = accept(prefix)
        except Exception:  # a test that cannot read so short a prefix (struct.error, IndexError)
            continue
        if accepted and not isinstance(accepted, str):  # a string is Pillow's "maybe", with a warning
            return fmt, opener
    return None


def _png_declared_size(data: bytes) -> tuple[int, int] | None:
    """The width and height a PNG's IHDR chunk declares (bytes 16-24), or None if it has none."""
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _zero_size(where: str, name: str, width: int, height: int) -> str:
    return (f"{where} is a {name} of {width}x{height} pixels: an image needs at least one pixel each way: "
            "send the image itself")


def _scaled_to(width: int, height: int, max_pixels: int) -> str:
    """The largest size of the same shape within ``max_pixels``, as WIDTHxHEIGHT."""
    factor = math.sqrt(max_pixels / (width * height))
    return f"{max(1, math.floor(width * factor))}x{max(1, math.floor(height * factor))}"


def _url_origin(url: str) -> str:
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme}://{host[:64]}/…"


def _said(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"Pillow: {text[:160]}"
