"""The bench's test images: seeded RGB noise encoded as PNG here, never downloaded.

Each request of a pass gets an image of its own (``seed`` from the pass and the request), so no
engine serves one from a cache of an earlier image (vLLM's prefix and encoder caches are keyed by
the image's hash, llama-server's prompt cache by its tokens). Noise is enough for speed and
memory: the tower's work depends on the tiles, not on what they show. PNG is written by hand
(zlib, one IDAT, filter 0; the PNG specification, ISO/IEC 15948) so the control plane needs no
image library.
"""

from __future__ import annotations

import base64
import random
import struct
import zlib

SIDE_PX = 512  # issue 34: time to first token for one 512×512 image
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def noise_png(seed: int, side_px: int = SIDE_PX) -> bytes:
    """A ``side_px`` × ``side_px`` 8-bit RGB PNG of seeded noise: the same bytes for the same seed."""
    pixels = random.Random(seed).randbytes(side_px * side_px * 3)
    row = side_px * 3
    raw = b"".join(b"\x00" + pixels[y * row:(y + 1) * row] for y in range(side_px))  # filter type 0 per row
    header = struct.pack(">IIBBBBB", side_px, side_px, 8, 2, 0, 0, 0)  # 8 bits, truecolour, no interlace
    return _PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b"")


def data_uri(png: bytes) -> str:
    """The image as a ``data:`` URI, as a chat completion's ``image_url`` carries it."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def image_seed(pass_index: int, request: int, seed: int = 0) -> int:
    """The seed of request ``request`` of pass ``pass_index``: distinct for every request of a run."""
    return seed * 1_000_003 + pass_index * 1000 + request


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
