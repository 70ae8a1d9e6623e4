"""How a vision-language model is served, as far as the worker's image guard reads it.

A vision plan carries ``vision`` (``Plan.vision``, a text or speech plan has none); the worker then
checks every image of a chat completion before vLLM decodes it
(``runtime/edgectl_runtime/service/image_guard.py``) against :class:`ImageLimits`. The planner that
sizes them for a model and a machine comes later; until then a plan takes the defaults below,
each with its reason (docs/vision-guard.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from edgectl.contract.codec import check

# Pillow's decompression-bomb threshold (PIL.Image.MAX_IMAGE_PIXELS, 89_478_485 in Pillow 13): vLLM
# opens every image with Image.open (vllm/multimodal/image.py: open_image), which warns above it
# and raises above twice it. A limit above it would let Pillow, not the guard, answer.
PILLOW_BOMB_PIXELS = 89_478_485

# 4096 x 4096: a 12-megapixel camera frame (4032 x 3024) and a 4K video frame (3840 x 2160) pass;
# the guard's decoded copy is then at most 64 MiB (RGBA), once per image, one image at a time.
DEFAULT_MAX_PIXELS = 4096 * 4096
# One question about one frame (issue 34's camera workload). vLLM sizes its encoder budget and
# its memory-profiling batch for the most images a prompt may carry (--limit-mm-per-prompt,
# default 999: vllm/config/multimodal.py; vllm/multimodal/encoder_budget.py), so every image
# allowed costs memory the planner must hold: it raises this when it has sized more.
DEFAULT_MAX_IMAGES_PER_REQUEST = 1
# The whole JSON body, base64 images included (base64 is 4/3 of the bytes): a JPEG at the pixel
# limit (a few MB) fits several times over; the guard holds the body and its decoded images at once.
DEFAULT_MAX_REQUEST_BYTES = 20 * 1024 * 1024
# No network is assumed at the edge (issue 34): images come as data: URIs.
DEFAULT_ALLOW_REMOTE_URLS = False
# How many of an image's tiles the vision tower encodes at once (runtime/edgectl_runtime/vllm_plugin/
# tower_tiles.py): 0 is all of them in one batch, as vLLM does and as plans written before the lever ran.
TOWER_TILES = (0, 1, 2, 4, 8, 16, 32)


def _between(low: int, high: int | None = None) -> Callable[[int], str | None]:
    def rule(value: int) -> str | None:
        if value < low:
            return f"expected a number >= {low}, got {value!r}"
        if high is not None and value > high:
            return (f"{value} is above {high}, Pillow's decompression-bomb threshold (vLLM's Image.open warns "
                    "above it and refuses above twice it)")
        return None
    return rule


def _one_of(allowed: tuple[int, ...]) -> Callable[[int], str | None]:
    def rule(value: int) -> str | None:
        return None if value in allowed else f"expected one of {', '.join(map(str, allowed))}, got {value!r}"
    return rule


@dataclass(frozen=True)
class ImageLimits:
    """What one chat completion may carry in images; beyond it the worker answers 4xx itself."""

    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, metadata=check(_between(1, PILLOW_BOMB_PIXELS)))
    max_images_per_request: int = field(default=DEFAULT_MAX_IMAGES_PER_REQUEST, metadata=check(_between(1)))
    max_request_bytes: int = field(default=DEFAULT_MAX_REQUEST_BYTES, metadata=check(_between(1)))
    # http(s) image URLs handed to vLLM, which fetches them; file: URLs never are (the CLI sends a
    # local file's bytes as a data: URI).
    allow_remote_urls: bool = DEFAULT_ALLOW_REMOTE_URLS


@dataclass(frozen=True)
class VisionServe:
    """How a vision-language model is served (images in, text out); a text model's plan has none."""

    images: ImageLimits = field(default_factory=ImageLimits)
    tower_tiles: int = field(default=0, kw_only=True, metadata=check(_one_of(TOWER_TILES)))
