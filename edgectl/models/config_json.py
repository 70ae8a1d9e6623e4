"""Reading a Hugging Face ``config.json``: each field the planner needs, checked, with one line naming
the field when it is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgectl.errors import EdgectlError
from edgectl.models import architectures
from edgectl.models.facts import FULL_ATTENTION, SLIDING_ATTENTION


def bad_config(path: Path, problem: str) -> EdgectlError:
    return EdgectlError(f"{path / 'config.json'}: {problem}")


def read_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise EdgectlError(
            f"{path}: no config.json, so this is not a Hugging Face model directory; give the directory "
            "that holds config.json, the *.safetensors weights and the tokenizer"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise bad_config(path, f"not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); "
                               "download the model again or fix the file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_config(path, f"cannot be read ({exc})") from None
    if not isinstance(config, dict):
        raise bad_config(path, f"holds a JSON {type(config).__name__}, expected an object")
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Some text models nest their decoder's settings in text_config (as vLLM's get_text_config does).
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        return {**config, **text}
    return config


def int_field(path: Path, config: dict[str, Any], *names: str, required: bool = True) -> int | None:
    for name in names:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise bad_config(path, f"{name} is {value!r}, expected a positive integer")
        return value
    if required:
        raise bad_config(path, f"has no {names[0]}; it is needed to size the model")
    return None


def architecture(path: Path, config: dict[str, Any]) -> str:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise bad_config(path, "has no 'architectures' list, which vLLM needs to pick a model class; "
                               "add it (e.g. \"architectures\": [\"LlamaForCausalLM\"])")
    arch = archs[0]
    if not (architectures.is_supported(arch) or architectures.is_speech_to_text(arch)
            or architectures.is_vision_language(arch)):
        common = ", ".join(architectures.COMMON_ARCHITECTURES)
        more = len(architectures.TEXT_GENERATION_ARCHITECTURES) - len(architectures.COMMON_ARCHITECTURES)
        raise EdgectlError(
            f"{path}: architecture {arch!r} is not one vLLM {architectures.VLLM_VERSION} can serve for text "
            f"generation; it serves {common} and {more} more (listed below), for speech to text "
            f"{', '.join(architectures.SPEECH_TO_TEXT_ARCHITECTURES)}, for images and text "
            f"{', '.join(architectures.VISION_LANGUAGE_ARCHITECTURES)}",
            details=["supported: " + ", ".join(sorted(architectures.TEXT_GENERATION_ARCHITECTURES, key=str.lower))],
        )
    return arch


def rope(config: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    # transformers 5 writes rope_parameters {"rope_theta", "rope_type", ...scaling}; older configs
    # have rope_theta and rope_scaling at the top level.
    params = config.get("rope_parameters")
    theta = config.get("rope_theta")
    scaling = config.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return (float(theta) if isinstance(theta, (int, float)) else None), (scaling or None)


def layer_types(path: Path, config: dict[str, Any], num_layers: int) -> tuple[tuple[str, ...], int | None]:
    """One attention kind per layer, and the sliding window (None when nothing slides).

    Follows transformers' configuration classes, which vLLM reads: an explicit ``layer_types``
    wins; Qwen2/Qwen3 slide only with ``use_sliding_window`` and from layer ``max_window_layers``
    on (configuration_qwen2.py ``__post_init__``); any other config with a ``sliding_window``
    slides in every layer (vLLM's Attention falls back to the model-level window,
    vllm/model_executor/layers/attention/attention.py:265-273). 0 means no window (vLLM
    config/model.py:802-808).
    """
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        window = None
    explicit = config.get("layer_types")
    if explicit is not None:
        if not isinstance(explicit, list) or len(explicit) != num_layers or not all(
            isinstance(t, str) for t in explicit
        ):
            raise bad_config(path, f"layer_types must list one string per layer ({num_layers})")
        if window is None and SLIDING_ATTENTION in explicit:
            raise bad_config(path, "layer_types has sliding_attention layers but no sliding_window")
        types = tuple(explicit)
    elif config.get("model_type") in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"):
        if not config.get("use_sliding_window", False):
            window = None
        first_sliding = config.get("max_window_layers", 28)  # transformers' default for both
        types = tuple(
            SLIDING_ATTENTION if window is not None and i >= first_sliding else FULL_ATTENTION
            for i in range(num_layers)
        )
    else:
        types = (SLIDING_ATTENTION if window is not None else FULL_ATTENTION,) * num_layers
    return types, (window if SLIDING_ATTENTION in types else None)


def quantization_config(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    qc = config.get("quantization_config")
    if qc is None and (path / "quantize_config.json").is_file():  # older GPTQ checkpoints
        try:
            qc = json.loads((path / "quantize_config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EdgectlError(f"{path / 'quantize_config.json'}: not valid JSON ({exc})") from None
    if qc is not None and not isinstance(qc, dict):
        raise bad_config(path, f"quantization_config is {qc!r}, expected an object")
    return qc
