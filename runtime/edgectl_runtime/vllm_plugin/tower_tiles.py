"""A vision tower that encodes an image's tiles a few at a time (lever ``EDGECTL_TOWER_TILES``).

vLLM 0.32's Idefics3 model (SmolVLM's too) runs its vision transformer over every tile of an image
in one batch (``Idefics3Model.image_pixels_to_features``, vllm/model_executor/models/idefics3.py):
each layer's activations for all tiles at once. A 512×512 image is 17 tiles of 1024 patches at
SmolVLM-256M's tiling, so one MLP activation is 17 × 1024 × 3072 bf16 values, 107 MB. glibc serves
an allocation above its mmap threshold (at most 32 MiB on 64-bit, mallopt(3) ``M_MMAP_THRESHOLD``)
with a fresh mapping and unmaps it when freed, so every such tensor of every layer of every image
is faulted in page by page and zeroed by the kernel: 1.0 M page faults for one image
(docs/vision.md "The tower, a few tiles at a time").

The tiles are independent in the tower (the patch embedding, each layer's attention and MLP work
within one tile), so encoding them ``N`` at a time computes the same embeddings — bit for bit on the
tests' shape (tests/test_tower_tiles.py) — from tensors N / tiles of the size, which the heap reuses
layer after layer. With the lever at ``N > 0``, :func:`install` wraps the tower's ``forward``
(``Idefics2VisionTransformer``, the class Idefics3 builds): a call with more than ``N`` tiles and
neither ``tgt_sizes`` nor ``position_ids`` (MiniCPM-V's uses of the same class pass them) runs as
consecutive batches of ``N`` tiles, the outputs concatenated in order. ``0`` (the default, what
unmodified vLLM does): the wrapper is not installed.

:func:`counts` says how many tower calls this process made and how many batches they ran as (the
worker's read-back, service/readback.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from edgectl.contract import environment as runtime_env

logger = logging.getLogger("edgectl.tower_tiles")

_COUNTS = {"tiles": 0, "calls": 0, "batches": 0}  # tiles: the lever as installed (0: not installed)


def batched_forward(forward: Callable[..., torch.Tensor], tiles: int) -> Callable[..., torch.Tensor]:
    """The tower's ``forward`` over at most ``tiles`` tiles a call (see the module's docstring)."""

    def forward_in_batches(self: Any, pixel_values: torch.Tensor, patch_attention_mask: torch.Tensor | None = None,
                           tgt_sizes: torch.Tensor | None = None,
                           position_ids: torch.Tensor | None = None) -> torch.Tensor:
        n = pixel_values.size(0)
        _COUNTS["calls"] += 1
        if n <= tiles or tgt_sizes is not None or position_ids is not None:
            _COUNTS["batches"] += 1
            return forward(self, pixel_values, patch_attention_mask, tgt_sizes, position_ids)
        outputs = []
        for first in range(0, n, tiles):
            mask = None if patch_attention_mask is None else patch_attention_mask[first:first + tiles]
            outputs.append(forward(self, pixel_values[first:first + tiles], mask))
            _COUNTS["batches"] += 1
        return torch.cat(outputs)

    forward_in_batches.__wrapped__ = forward  # type: ignore[attr-defined]
    return forward_in_batches


def install(environ: Mapping[str, str]) -> int:
    """Wrap the tower's forward if ``EDGECTL_TOWER_TILES`` is above 0; the tiles a batch (0: left as vLLM has it)."""
    tiles = runtime_env.read_int("EDGECTL_TOWER_TILES", environ)
    if tiles <= 0 or _COUNTS["tiles"]:
        return _COUNTS["tiles"]
    from vllm.model_executor.models.idefics2_vision_model import (
        Idefics2VisionTransformer,
    )

    Idefics2VisionTransformer.forward = batched_forward(Idefics2VisionTransformer.forward, tiles)  # type: ignore[method-assign]
    _COUNTS["tiles"] = tiles
    logger.debug("edgectl: the vision tower encodes %d tile(s) at a time", tiles)
    return tiles


def counts() -> dict[str, int]:
    """The lever as installed (``tiles``, 0: not) and the tower's calls and batches in this process."""
    return dict(_COUNTS)
