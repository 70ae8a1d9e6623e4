"""Image files for the image guard's tests, made here with Pillow (real encoders, real bytes), a PNG
made by hand whose header declares a size no test should decode, and the bad requests every test of
the guard sends (in-process: tests/test_image_guard.py; a deployed service: tests/test_deploy_vision_systemd.py)."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib

from PIL import Image

from edgectl.contract.vision import ImageLimits


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


def bad_requests(limits: ImageLimits) -> list[tuple[str, dict, int, str, tuple[str, ...]]]:
    """Each request the guard refuses under ``limits``: (name, request, HTTP status, the refusal's reason,
    words its message holds). The image sits at messages[0].content[1] but in "too many images"."""
    png, jpeg = encoded("PNG"), encoded("JPEG")
    over = limits.max_images_per_request + 1
    return [
        ("not an image", chat(data_uri(b"GIF? no: plain text\n" * 10)), 400, "not_image", ("is not an image",)),
        ("truncated PNG", chat(data_uri(png[: len(png) // 2])), 400, "truncated", ("is a truncated PNG",)),
        ("truncated JPEG", chat(data_uri(jpeg[: len(jpeg) // 2], "image/jpeg")), 400, "truncated",
         ("is a truncated JPEG",)),
        ("40000x40000", chat(data_uri(png_declaring(40000, 40000))), 400, "too_many_pixels",
         ("40000x40000", f"limit of {limits.max_pixels:,} pixels (max_pixels)")),
        ("zero size", chat(data_uri(png_declaring(0, 64))), 400, "zero_size", ("0x64 pixels",)),
        ("too many images", chat(*[data_uri(png)] * over), 400, "too_many_images",
         (f"carries {over} images", f"limit of {limits.max_images_per_request} per request (max_images_per_request)")),
        ("BMP", chat(data_uri(encoded("BMP"), "image/bmp")), 400, "unsupported_format", ("is a BMP image",)),
        ("TIFF", chat(data_uri(encoded("TIFF"), "image/tiff")), 400, "unsupported_format", ("is a TIFF image",)),
        ("no base64", chat("data:image/png,rawbytes"), 400, "bad_data_uri", ("without ';base64'",)),
        ("wrong media type", chat("data:text/plain;base64,aGVsbG8="), 400, "bad_data_uri", ("'text/plain'",)),
        ("remote URL", chat("https://example.com/cat.png"), 400, "remote_url", ("fetches no remote images",)),
        ("body over the limit", chat(data_uri(b"\0" * limits.max_request_bytes)), 413, "too_big",
         (f"limit of {limits.max_request_bytes:,} bytes", "max_request_bytes")),
    ]
