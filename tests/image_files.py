"""Image files for the image guard's tests, made here with Pillow (real encoders, real bytes), and
a PNG made by hand whose header declares a size no test should decode."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib

from PIL import Image


def photo_like(width: int = 96, height: int = 64, seed: int = 0) -> Image.Image:
    """An RGB image with detail in it (noise over a gradient), so no encoder shrinks it to nothing and
    every cut lands in its pixel data."""
    rng = random.Random(seed)
    pixels = bytes(min(255, (x * 255 // width + rng.randrange(64)) % 256)
                   for y in range(height) for x in range(width) for _ in range(3))
    return Image.frombytes("RGB", (width, height), pixels)


def encoded(fmt: str, image: Image.Image | None = None) -> bytes:
    """The image (photo_like by default) in one of Pillow's formats: PNG, JPEG, WEBP, GIF, BMP, TIFF, …"""
    out = io.BytesIO()
    (image or photo_like()).save(out, fmt)
    return out.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_declaring(width: int, height: int) -> bytes:
    """A well-formed PNG whose IHDR declares ``width`` x ``height`` (8-bit RGB) with a few bytes of
    pixel data: the header of a huge (or empty) image, at no cost."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + _chunk(b"IEND", b""))


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def chat(*urls: str, text: str = "What does the gauge read?") -> dict:
    """A chat completion request with one user message: the text, then one image_url part per URL."""
    content: list[dict] = [{"type": "text", "text": text}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": "smolvlm", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
