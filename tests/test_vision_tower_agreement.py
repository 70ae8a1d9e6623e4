"""The vision tower and connector as vLLM serves them (bf16, the vision plan's format) against transformers'
float32 reference on the same weights and the same pixel values: per image, the cosine of its embeddings
(its rows flattened into one vector) is at least 0.999, and so is each row's (one image token's embedding)
(runtime/edgectl_runtime/tools/vision_tower_agreement.py).

On a tiny shape of synth-smolvlm-256m's spec (tests/test_vision_engine.py's ``tiny_vlm``: a 2-layer tower on
64x64 tiles), one engine start. The shape model's figures, by hand: docs/vision.md, "The vision tower against
transformers". The tower is seeded random: agreement here says vLLM computes the same function as
transformers, not that the model sees."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from installed import RUNTIME_PYTHON
from test_models_synthetic_vision import TINY
from test_vision_engine import tiny_vlm  # noqa: F401  (the fixture: the maker's tiny VLM)

from edgectl import launch
from edgectl.planner.vision import TOWER_TILES_DEFAULT

pytestmark = [pytest.mark.engine]

BOUND = 0.999  # issue 34's done-when line: cosine >= 0.999 per image


def _agreement(model: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(launch.command(RUNTIME_PYTHON, launch.VISION_TOWER_AGREEMENT, [str(model)]),
                          env={**launch.environment(os.environ), **env}, capture_output=True, text=True, timeout=600)


def test_the_served_tower_agrees_with_transformers_in_float32(tiny_vlm: Path) -> None:  # noqa: F811
    """The tower as the plan serves it: its tiles TOWER_TILES_DEFAULT at a time (vllm_plugin/tower_tiles.py)."""
    done = _agreement(tiny_vlm, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "EDGECTL_TOWER_TILES": str(TOWER_TILES_DEFAULT)})
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["schema"] == "edgectl.vision-tower-agreement/1"
    assert (doc["engine_dtype"], doc["reference_dtype"]) == ("bfloat16", "float32")
    images = doc["images"]
    assert len(images) >= 3
    # every image's tiles went through the tower in batches of at most TOWER_TILES_DEFAULT
    tiles = [i["tiles"] for i in images]
    assert max(tiles) > TOWER_TILES_DEFAULT
    assert doc["tower_tiles"] == {"tiles": TOWER_TILES_DEFAULT, "calls": len(images),
                                  "batches": sum(-(-t // TOWER_TILES_DEFAULT) for t in tiles)}, doc["tower_tiles"]
    assert any(i["width"] == i["height"] == 512 for i in images) and any(i["width"] != i["height"] for i in images)
    for image in images:
        # every tile's tokens came back: the processor's image_seq_len a tile, the text model's width
        assert image["rows"] == image["tiles"] * TINY.processor["image_seq_len"], image
        assert image["hidden"] == 64, image
        assert image["cosine"] >= BOUND, image
        assert image["min_row_cosine"] >= BOUND, image  # stricter: every image token's embedding too
    print("\n" + "\n".join(f"{i['name']}: cosine {i['cosine']:.6f}, min per row {i['min_row_cosine']:.6f}"
                           for i in images))


def test_it_refuses_to_run_where_it_cannot_reach_the_model(tmp_path: Path, tiny_vlm: Path) -> None:  # noqa: F811
    """Without VLLM_ENABLE_V1_MULTIPROCESSING=0 the model is in another process; a directory without a
    config.json is no model. Both refused before anything is loaded, one line, exit 2."""
    for model, env in ((tiny_vlm, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),
                       (tmp_path, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})):
        done = _agreement(model, env)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: "), line
