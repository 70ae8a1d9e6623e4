"""Write the image a vision service describes before it says READY: edgectl/data/vision/warmup.png.

A simple synthetic picture made here, never downloaded: coloured shapes on white (a red disc, a blue
square, a green triangle, a yellow bar), 256x256 RGB, written by this standard-library PNG encoder so
the bytes are the same on every machine (zlib level 9, no filter, no metadata chunks). Any size would
do: the Idefics3 processor resizes every image to its longest edge before it cuts tiles.

    python scripts/make_warmup_image.py            # (re)write the shipped file
    python scripts/make_warmup_image.py --check    # exit 1 if the shipped file differs
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

SIDE = 256
OUT = Path(__file__).resolve().parents[1] / "edgectl" / "data" / "vision" / "warmup.png"

WHITE, RED, BLUE, GREEN, YELLOW = (255, 255, 255), (220, 30, 30), (30, 60, 200), (30, 160, 60), (240, 200, 20)


def _colour(x: int, y: int) -> tuple[int, int, int]:
    if (x - 72) ** 2 + (y - 72) ** 2 <= 48 ** 2:
        return RED  # a disc, upper left
    if 148 <= x < 228 and 32 <= y < 112:
        return BLUE  # a square, upper right
    if 144 <= y < 224 and abs(x - 72) <= (y - 144) // 2 + 1:
        return GREEN  # a triangle pointing up, lower left
    if 150 <= x < 230 and 176 <= y < 196:
        return YELLOW  # a bar, lower right
    return WHITE


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def warmup_png() -> bytes:
    """The PNG's bytes (8-bit RGB, one IDAT)."""
    rows = b"".join(b"\x00" + bytes(c for x in range(SIDE) for c in _colour(x, y)) for y in range(SIDE))
    header = struct.pack(">IIBBBBB", SIDE, SIDE, 8, 2, 0, 0, 0)  # 8-bit, truecolour, no interlace
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(rows, 9))
            + _chunk(b"IEND", b""))


def main(argv: list[str]) -> int:
    data = warmup_png()
    if argv[1:] == ["--check"]:
        same = OUT.is_file() and OUT.read_bytes() == data
        print(f"{OUT}: {'as generated' if same else 'differs from what this script writes'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(data)
    print(f"{OUT}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
