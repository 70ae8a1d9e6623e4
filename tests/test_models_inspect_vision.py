"""`edgectl models inspect` of a vision-language directory (Idefics3 / SmolVLM): the language model's facts
plus the ``vision`` part — the tower, the connector, the image tokens per tile and per image under the
processor's tiling — read from the shape model's directory (synth-smolvlm-256m's config.json, processor
files and safetensors headers); and what vLLM could not serve refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from models_helpers import run_cli
from vision_helpers import IMAGE_TOKEN_ID, SPEC, make_vlm, vlm_config

from edgectl.errors import EdgectlError
from edgectl.models import inspect_model
from edgectl.models.facts import ModelFacts
from edgectl.models.vision_inspect import idefics3_tiles


def test_the_shape_models_directory(tmp_path: Path) -> None:
    facts = inspect_model(make_vlm(tmp_path / "vlm"), "synth-smolvlm-256m")
    assert (facts.modality, facts.architecture, facts.model_type) == ("vision", "Idefics3ForConditionalGeneration",
                                                                      "idefics3")
    # the language model's facts: SmolLM2-135M's, with the grown vocabulary
    assert (facts.num_layers, facts.hidden_size, facts.num_kv_heads, facts.vocab_size, facts.tie_word_embeddings) == (
        30, 576, 3, 49280, True)
    v = facts.vision
    assert v is not None
    assert (v.tower_layers, v.tower_hidden_size, v.tower_attention_heads, v.tower_intermediate_size, v.patch_size,
            v.tile_size, v.scale_factor, v.image_token_id) == (12, 768, 12, 3072, 16, 512, 4, IMAGE_TOKEN_ID)
    assert (v.tokens_per_tile, v.resize_longest_edge, v.tile_longest_edge, v.image_splitting) == (64, 2048, 512, True)
    # a 512x512 image is resized to 2048: 4x4 tiles and the global view; no image gets more
    assert (v.tiles_512, v.image_tokens_512, v.tiles_max, v.image_tokens_max) == (17, 1088, 17, 1088)
    # the weights count every stored tensor; the tower and connector are the catalog's 93.5 M
    assert facts.num_params == SPEC.parameters and v.tower_params == 93_510_912 and v.tower_bytes == 2 * v.tower_params
    assert facts.chat_template and facts.tokenizer
    assert ModelFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts


def test_inspect_shows_it(tmp_path: Path) -> None:
    d = make_vlm(tmp_path / "vlm")
    done = run_cli(["models", "inspect", str(d)])
    assert done.returncode == 0, done.stderr
    assert "vision tower idefics3_vision, 12 layers x 12 heads, hidden 768 (MLP 3072), patch 16 on 512x512 tiles" in done.stdout
    assert "pixel_shuffle by 4: 64 tokens per tile, image token id 49153" in done.stdout
    assert "a 512x512 image: 17 tile(s) = 1088 tokens; the largest: 17 tiles = 1088 tokens" in done.stdout
    data = json.loads(run_cli(["models", "inspect", str(d), "--json"]).stdout)
    assert data["modality"] == "vision" and data["vision"]["image_tokens_512"] == 1088


def test_one_tile_when_the_processor_resizes_to_it(tmp_path: Path) -> None:
    settings = {k: v for k, v in SPEC.processor.items() if k != "image_seq_len"} | {"size": {"longest_edge": 512}}
    # the Hub's layout: preprocessor_config.json, image_seq_len in processor_config.json
    d = make_vlm(tmp_path / "vlm", processor={"image_seq_len": 64})
    (d / "preprocessor_config.json").write_text(json.dumps(settings))
    v = inspect_model(d).vision
    assert v is not None and (v.tiles_512, v.image_tokens_512, v.tiles_max) == (1, 64, 1)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: (d / "config.json").write_text(json.dumps(vlm_config(auto_map={"AutoConfig": "x.Y"}))),
     "config.json: auto_map names code shipped with the model (trust_remote_code)"),
    (lambda d: (d / "processor_config.json").write_text(json.dumps({"image_seq_len": 64})),
     "no preprocessor_config.json (nor an image_processor in processor_config.json)"),
    (lambda d: (d / "processor_config.json").write_text(json.dumps(
        {**json.loads((d / "processor_config.json").read_text()), "image_seq_len": 169})),
     "processor_config.json gives image_seq_len 169, but config.json's tower makes 64 tokens per tile"),
    (lambda d: (d / "config.json").write_text(json.dumps(vlm_config(scale_factor=3))),
     "image_size 512 is not a multiple of patch_size 16 times scale_factor 3"),
    (lambda d: (d / "model.safetensors").unlink(), "no *.safetensors weights"),
])
def test_what_vllm_could_not_serve_is_refused(tmp_path: Path, change, message: str) -> None:
    d = make_vlm(tmp_path / "vlm")
    change(d)
    with pytest.raises(EdgectlError) as err:
        inspect_model(d)
    assert message in err.value.message
    done = run_cli(["models", "inspect", str(d)])
    assert done.returncode == 2 and done.stdout == "" and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.runtime
def test_the_tiling_is_transformers() -> None:
    """idefics3_tiles against transformers' own count (the runtime's), over shapes and settings."""
    pytest.importorskip("transformers")
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    for resize, tile, split in ((2048, 512, True), (1536, 384, True), (512, 512, True), (2048, 512, False)):
        proc = Idefics3ImageProcessorPil(size={"longest_edge": resize}, max_image_size={"longest_edge": tile},
                                         do_image_splitting=split)
        for h, w in ((512, 512), (1, 1), (3000, 20), (20, 3000), (640, 480), (4000, 9000), (513, 512), (40000, 40000)):
            n, _, _ = proc.get_number_of_image_patches(h, w, {})
            assert idefics3_tiles(h, w, resize, tile, split) == max(n, 1), (resize, tile, split, h, w)
