"""The image side of a vision-language directory (Idefics3 / SmolVLM): the vision tower and connector
from config.json, the image processor's settings from its files, and what an image costs in tokens.

Read without loading anything, as vLLM 0.32 will use them: its ``Idefics3ForConditionalGeneration``
(vllm/model_executor/models/idefics3.py) sizes a tile's tokens from config.json
(``Idefics3Model.image_seq_len`` = ((image_size / patch_size)² / scale_factor²)) and builds the prompt's
placeholders from the Hugging Face processor (``Idefics3ProcessingInfo.get_image_repl``: the
processor's ``image_seq_len`` per tile, the image processor's ``get_number_of_image_patches`` for the
tiles), so the two must agree; the tiling rule is transformers 5.19's
(transformers/models/idefics3/image_processing_idefics3.py, the same in smolvlm/).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from edgectl.errors import EdgectlError
from edgectl.models import architectures, config_json
from edgectl.models.facts import TEXT_MODEL_PREFIX, ModelFacts, VisionFacts
from edgectl.models.safetensors_header import TensorInfo
from edgectl.models.weights import tensor_kind

# The files holding the image processor's settings: the Hub's preprocessor_config.json (its keys at the
# top), or processor_config.json with them under "image_processor" (what transformers 5 saves).
PREPROCESSOR_CONFIG = "preprocessor_config.json"
PROCESSOR_CONFIG = "processor_config.json"
# transformers 5.19's Idefics3ImageProcessor / SmolVLMImageProcessor class defaults, used for a
# setting the files leave out (as the class does).
DEFAULT_SIZE_LONGEST_EDGE = 4 * 364
DEFAULT_MAX_IMAGE_SIZE = 364
# Idefics3Processor / SmolVLMProcessor's image_seq_len default (processing_idefics3.py ``__init__``).
DEFAULT_IMAGE_SEQ_LEN = 169
MAX_IMAGE_SIZE = 4096  # image_processing_idefics3.py: "4k resolution as absolute maximum"
# Files whose "auto_map" names code shipped with the model (trust_remote_code): vLLM runs without it.
REMOTE_CODE_FILES = ("config.json", PREPROCESSOR_CONFIG, PROCESSOR_CONFIG, "tokenizer_config.json")


def vision_architecture(config: dict[str, Any]) -> str | None:
    """config.json's architecture when it is a vision-language one edgectl reads, else None."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and architectures.is_vision_language(archs[0]):
        return archs[0]
    return None


def with_vision(path: Path, config: dict[str, Any], facts: ModelFacts, tensors: list[TensorInfo]) -> ModelFacts:
    """``facts`` (its language model's, read by edgectl.models.inspect) with the image side: refused, with
    one line, when vLLM could not serve it (the model's own code needed, no weights to size the tower,
    a processor that disagrees with config.json)."""
    asks = remote_code(path)
    if asks is not None:
        raise EdgectlError(f"{path / asks}: auto_map names code shipped with the model (trust_remote_code); edgectl "
                           "runs vLLM without it and fetches nothing: use a model transformers supports as it is")
    if not tensors:
        raise EdgectlError(f"{path}: no *.safetensors weights; edgectl sizes a vision-language model's tower from "
                           "them: copy the model's safetensors files")
    tower = [t for t in tensors if not t.name.startswith(TEXT_MODEL_PREFIX) and tensor_kind(t.name) != "lm_head"]
    vision = dataclasses.replace(vision_facts(path, config), tower_params=sum(t.numel for t in tower),
                                 tower_bytes=sum(t.nbytes for t in tower))
    model_type = config.get("model_type")
    return dataclasses.replace(facts, model_type=model_type if isinstance(model_type, str) else facts.model_type,
                               modality="vision", vision=vision)


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EdgectlError(f"{path}: not valid JSON ({exc}); copy the model's file again") from None
    if not isinstance(data, dict):
        raise EdgectlError(f"{path}: holds a JSON {type(data).__name__}, expected an object")
    return data


def remote_code(path: Path) -> str | None:
    """The first file of ``path`` that asks for the model's own code (``auto_map``), or None."""
    for name in REMOTE_CODE_FILES:
        data = _read_json(path / name)
        if data and data.get("auto_map"):
            return name
    return None


def processor_settings(path: Path) -> tuple[dict[str, Any], int | None, str]:
    """The image processor's settings, the processor's ``image_seq_len`` (None: not given) and the
    file the settings came from; EdgectlError when no file gives them."""
    pre, proc = _read_json(path / PREPROCESSOR_CONFIG), _read_json(path / PROCESSOR_CONFIG)
    nested = proc.get("image_processor") if proc else None
    if pre is not None:
        settings, source = pre, PREPROCESSOR_CONFIG
    elif isinstance(nested, dict):
        settings, source = nested, PROCESSOR_CONFIG
    else:
        raise EdgectlError(f"{path}: no {PREPROCESSOR_CONFIG} (nor an image_processor in {PROCESSOR_CONFIG}): vLLM's "
                           "processor needs the image processor's settings; copy the model's preprocessor_config.json")
    seq_len = (proc or {}).get("image_seq_len", settings.get("image_seq_len"))
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0):
        raise EdgectlError(f"{path}: image_seq_len is {seq_len!r}, expected a positive integer")
    return settings, seq_len, source


def _longest_edge(path: Path, settings: dict[str, Any], key: str, default: int, source: str) -> int:
    value = settings.get(key)
    if value is None:
        return default
    edge = value.get("longest_edge") if isinstance(value, dict) else None
    if isinstance(edge, bool) or not isinstance(edge, int) or edge <= 0:
        raise EdgectlError(f"{path / source}: {key} is {value!r}, expected {{\"longest_edge\": N}}")
    return edge


def idefics3_tiles(height: int, width: int, resize_longest_edge: int, tile_longest_edge: int, splitting: bool) -> int:
    """The tiles an image becomes, the global view included, at least 1 — transformers'
    ``Idefics3ImageProcessor.get_number_of_image_patches`` (num_rows * num_cols + 1 when it splits,
    else 0), as vLLM counts it (``Idefics3ProcessingInfo.get_num_patches``: at least 1)."""
    if not splitting:
        return 1
    # _resize_output_size_rescale_to_max_len: the longest edge becomes resize_longest_edge, the other
    # edge keeps the aspect ratio, rounded up to even, at least 1
    aspect = width / height
    if width >= height:
        width = resize_longest_edge
        height = int(width / aspect)
        height += height % 2
    else:
        height = resize_longest_edge
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    # _resize_output_size_scale_below_upper_bound(max_len=MAX_IMAGE_SIZE)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width = MAX_IMAGE_SIZE
        height = int(width / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height = MAX_IMAGE_SIZE
        width = int(height * aspect)
    height, width = max(height, 1), max(width, 1)
    rows = math.ceil(height / tile_longest_edge)
    cols = math.ceil(width / tile_longest_edge)
    if rows > 1 or cols > 1:
        return rows * cols + 1
    return 1


def vision_facts(path: Path, config: dict[str, Any]) -> VisionFacts:
    """The image side of the vision-language directory ``path`` whose config.json is ``config``
    (tower_params / tower_bytes left None: the weights are read by the caller)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        raise config_json.bad_config(path, "has no vision_config object; a vision-language model needs one")

    def need(name: str) -> int:
        value = config_json.int_field(path, vision, name)
        assert value is not None  # required: int_field raised otherwise
        return value

    scale = config_json.int_field(path, config, "scale_factor")
    assert scale is not None
    tile, patch = need("image_size"), need("patch_size")
    if tile % patch or (tile // patch) % scale:
        raise config_json.bad_config(path, f"vision_config.image_size {tile} is not a multiple of patch_size {patch} "
                                           f"times scale_factor {scale}")
    per_tile = (tile // patch) ** 2 // scale**2
    settings, seq_len, source = processor_settings(path)
    if (seq_len or DEFAULT_IMAGE_SEQ_LEN) != per_tile:
        given = (f"image_seq_len {seq_len}" if seq_len is not None else
                 f"no image_seq_len (the processor then uses {DEFAULT_IMAGE_SEQ_LEN})")
        raise EdgectlError(f"{path}: {PROCESSOR_CONFIG} gives {given}, but config.json's tower makes {per_tile} tokens "
                           f"per tile (({tile} / {patch})² / {scale}²): vLLM would refuse the prompt; set "
                           f"\"image_seq_len\": {per_tile} in {PROCESSOR_CONFIG}")
    resize = _longest_edge(path, settings, "size", DEFAULT_SIZE_LONGEST_EDGE, source)
    tile_edge = _longest_edge(path, settings, "max_image_size", DEFAULT_MAX_IMAGE_SIZE, source)
    if tile_edge != tile:
        raise EdgectlError(f"{path / source}: max_image_size.longest_edge {tile_edge} is not the tower's "
                           f"image_size {tile} (config.json): vLLM checks the tiles are {tile}x{tile}")
    splitting = settings.get("do_image_splitting", True)
    if not isinstance(splitting, bool):
        raise EdgectlError(f"{path / source}: do_image_splitting is {splitting!r}, expected true or false")
    token_id = config.get("image_token_id")
    tiles_512 = idefics3_tiles(512, 512, resize, tile_edge, splitting)
    tiles_max = idefics3_tiles(resize, resize, resize, tile_edge, splitting)
    return VisionFacts(
        tower_model_type=str(vision.get("model_type") or "unknown"), tower_layers=need("num_hidden_layers"),
        tower_hidden_size=need("hidden_size"), tower_attention_heads=need("num_attention_heads"),
        tower_intermediate_size=need("intermediate_size"), patch_size=patch, tile_size=tile,
        connector="pixel_shuffle", scale_factor=scale,
        image_token_id=token_id if isinstance(token_id, int) and not isinstance(token_id, bool) else None,
        tokens_per_tile=per_tile, image_processor=str(settings.get("image_processor_type") or "unknown"),
        image_splitting=splitting, resize_longest_edge=resize, tile_longest_edge=tile_edge,
        tiles_512=tiles_512, image_tokens_512=tiles_512 * per_tile,
        tiles_max=tiles_max, image_tokens_max=tiles_max * per_tile,
        tower_params=None, tower_bytes=None,
    )
