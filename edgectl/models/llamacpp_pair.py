"""llama.cpp's GGUF pair of a vision-language model (a language model's GGUF and its ``--mmproj``
projector): checked as a pair, and the configs of the Hugging Face directory it was converted from,
made back from the two files' metadata (``edgectl models pull FILE.gguf --mmproj FILE``,
:mod:`edgectl.models.pull_pair`; the tensors are the runtime's job, ``convert_gguf_vlm``).

What the pair carries, and where it goes (llama.cpp ``convert_hf_to_gguf.py``: ``LlamaModel`` for the
language model, ``MmprojModel.set_gguf_parameters`` and ``SmolVLMModel`` for the projector):

- ``config.json``: ``text_config`` from the language model's ``llama.*`` keys as for any pulled GGUF
  (``gguf_hf.hf_config``); ``vision_config`` from ``clip.vision.*`` (image_size, patch_size,
  embedding_length, feed_forward_length, block_count, attention.head_count,
  attention.layer_norm_epsilon; the activation is Idefics3's gelu_pytorch_tanh, ``clip.use_gelu``);
  ``scale_factor`` from ``clip.vision.projector.scale_factor``; ``image_token_id`` from the tokenizer
  (the runtime's converter reports it).
- ``processor_config.json``: Idefics3's image processor with ``clip.vision.image_mean`` / ``image_std``,
  tiles of the tower's ``image_size`` (``max_image_size``), and ``size.longest_edge`` from
  ``clip.vision.preproc_image_size``, the edge llama.cpp resizes an image to before cutting it
  (tools/mtmd: ``image_longest_edge``). A projector without that key (an older converter) gets the
  tower's ``image_size``: one tile per image, which is what llama.cpp then does too
  (docs/vision.md, "`edgectl models pull FILE.gguf --mmproj FILE`"). What the GGUF does not carry is
  Idefics3ImageProcessor's default (rescale 1/255, resample 1, RGB, image splitting on).
- the chat template: the tokenizer's (``tokenizer.chat_template``), written with the tokenizer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.contract.gguf_header import GGUFHeader, read_gguf
from edgectl.contract.mmproj_names import (
    CONNECTOR,
    MMPROJ_ARCHITECTURE,
    PROJECTOR_TYPE_KEY,
    PROJECTOR_TYPES,
)
from edgectl.errors import EdgectlError
from edgectl.models.gguf_hf import hf_config

# The vision keys a projector must carry (gguf-py constants.py, Keys.ClipVision) -> Idefics3VisionConfig's field.
VISION_KEYS = {
    "clip.vision.image_size": "image_size",
    "clip.vision.patch_size": "patch_size",
    "clip.vision.embedding_length": "hidden_size",
    "clip.vision.feed_forward_length": "intermediate_size",
    "clip.vision.block_count": "num_hidden_layers",
    "clip.vision.attention.head_count": "num_attention_heads",
}
EPS_KEY = "clip.vision.attention.layer_norm_epsilon"
SCALE_KEY = "clip.vision.projector.scale_factor"
PROJECTION_KEY = "clip.vision.projection_dim"  # the language model's embedding width
LONGEST_EDGE_KEY = "clip.vision.preproc_image_size"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
# transformers' Idefics3ImageProcessor defaults for what a projector does not carry
# (image_processing_idefics3.py: do_convert_rgb, resample LANCZOS = 1, rescale 1/255, splitting on, pad).
PROCESSOR_DEFAULTS = {"do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
                      "do_rescale": True, "do_resize": True, "resample": 1, "rescale_factor": 1 / 255}


@dataclass(frozen=True)
class Pair:
    """A checked pair: the headers, the projector type and the Hugging Face architecture it goes back to."""

    text: GGUFHeader
    mmproj: GGUFHeader
    projector_type: str
    architecture: str


def _known() -> str:
    return ", ".join(f"{t} (with a {arch} language model)" for t, (arch, _) in PROJECTOR_TYPES.items())


def check_pair(text_path: Path, mmproj_path: Path) -> Pair:
    """The pair's headers after checking it is one edgectl turns back into a directory; EdgectlError (one
    line) naming the first problem."""
    if not mmproj_path.is_file():
        raise EdgectlError(f"--mmproj {mmproj_path}: no such file; give llama.cpp's projector GGUF of the model "
                           "(convert_hf_to_gguf.py --mmproj writes it)")
    text, mmproj = read_gguf(text_path), read_gguf(mmproj_path)
    if text.architecture == MMPROJ_ARCHITECTURE:
        raise EdgectlError(f"{text_path} is a vision projector (general.architecture {MMPROJ_ARCHITECTURE!r}): give "
                           "the language model's GGUF first, the projector after --mmproj")
    if mmproj.architecture != MMPROJ_ARCHITECTURE:
        raise EdgectlError(f"--mmproj {mmproj_path}: general.architecture is {mmproj.architecture!r}, a vision "
                           f"projector's is {MMPROJ_ARCHITECTURE!r}: give llama.cpp's --mmproj file of the model")
    if text.architecture not in {arch for arch, _ in PROJECTOR_TYPES.values()}:
        raise EdgectlError(f"{text_path}: a {text.architecture} language model; edgectl turns back llama.cpp pairs "
                           f"of {_known()} only")
    ptype = mmproj.metadata.get(PROJECTOR_TYPE_KEY)
    if ptype not in PROJECTOR_TYPES:
        raise EdgectlError(f"--mmproj {mmproj_path}: {PROJECTOR_TYPE_KEY} is {ptype!r}; edgectl turns back "
                           f"{_known()} only")
    arch, hf_arch = PROJECTOR_TYPES[ptype]
    if text.architecture != arch:
        raise EdgectlError(f"{text_path} is a {text.architecture} language model, a {ptype} projector pairs with a "
                           f"{arch} one: not a pair")
    missing = [k for k in (*VISION_KEYS, SCALE_KEY, PROJECTION_KEY) if not _positive(mmproj.metadata.get(k))]
    if missing:
        raise EdgectlError(f"--mmproj {mmproj_path}: metadata {', '.join(missing)} missing or not a positive "
                           "integer; the file was not written by a complete converter")
    width = text.arch_key("embedding_length")
    projection = mmproj.metadata[PROJECTION_KEY]
    fc = next((t for t in mmproj.tensors if t.name == CONNECTOR), None)
    if fc is None:
        raise EdgectlError(f"--mmproj {mmproj_path}: no {CONNECTOR} (the connector's projection): the file is not "
                           "complete; convert it again")
    if not (width == projection == fc.shape[0]):
        shown = f"{projection}" if projection == fc.shape[0] else f"{projection} (its connector's rows: {fc.shape[0]})"
        raise EdgectlError(f"--mmproj {mmproj_path} projects images to width {shown}, the language model "
                           f"{text_path} embeds tokens in width {width}: not a pair (each projector is converted "
                           "from the same directory as its language model)")
    for key in ("clip.vision.image_mean", "clip.vision.image_std"):
        value = mmproj.metadata.get(key)
        if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value)):
            raise EdgectlError(f"--mmproj {mmproj_path}: metadata {key} is {value!r}, expected three numbers; the "
                               "file was not written by a complete converter")
    if not isinstance(text.metadata.get(CHAT_TEMPLATE_KEY), str):
        raise EdgectlError(f"{text_path}: no {CHAT_TEMPLATE_KEY}; vLLM needs a chat template to place an image in "
                           "a chat: convert the model again from a directory that has one")
    try:
        hf_config(text)  # the text config is made after the conversion: refuse what it cannot map first
    except ValueError as exc:
        raise EdgectlError(f"{text_path}: {exc}") from None
    return Pair(text, mmproj, ptype, hf_arch)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def float32_decimal(value: float) -> float:
    """The shortest decimal that is the same float32 as ``value`` (GGUF stores float32: 1e-06 comes back as
    9.999999974752427e-07, which is the same float32 as 1e-06, the value the original config wrote)."""
    stored = struct.pack("<f", value)
    for digits in range(6, 10):
        short = float(f"{value:.{digits}g}")
        if struct.pack("<f", short) == stored:
            return short
    return float(value)


def vision_config(mmproj: GGUFHeader) -> dict[str, Any]:
    md = mmproj.metadata
    cfg: dict[str, Any] = {"model_type": "idefics3_vision", "num_channels": 3, "hidden_act": "gelu_pytorch_tanh"}
    cfg.update({field: md[key] for key, field in VISION_KEYS.items()})
    eps = md.get(EPS_KEY)
    if isinstance(eps, (int, float)) and not isinstance(eps, bool):
        cfg["layer_norm_eps"] = float32_decimal(eps)
    return cfg


def hf_config_of_pair(pair: Pair, image_token_id: int) -> dict[str, Any]:
    """config.json of the Hugging Face directory the pair was converted from."""
    text = hf_config(pair.text)
    theta = text.pop("rope_theta", None)
    if theta is not None:  # transformers 5 writes rope_parameters (edgectl/models/config_json.py, rope)
        text["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    text.pop("architectures", None)  # built from the top-level architecture by vLLM and transformers
    text.pop("dtype", None)
    config: dict[str, Any] = {
        "architectures": [pair.architecture],
        "model_type": "idefics3",
        "image_token_id": image_token_id,
        "scale_factor": pair.mmproj.metadata[SCALE_KEY],
        "text_config": text,
        "vision_config": vision_config(pair.mmproj),
        "tie_word_embeddings": text["tie_word_embeddings"],
        "torch_dtype": "bfloat16",
    }
    if "pad_token_id" in text:
        config["pad_token_id"] = text["pad_token_id"]
    return config


def processor_config(pair: Pair) -> dict[str, Any]:
    """processor_config.json: Idefics3's processor and image processor settings (see the module docstring)."""
    md = pair.mmproj.metadata
    tile, patch, scale = md["clip.vision.image_size"], md["clip.vision.patch_size"], md[SCALE_KEY]
    edge = md.get(LONGEST_EDGE_KEY)
    image_processor: dict[str, Any] = {
        **PROCESSOR_DEFAULTS,
        "image_mean": [float32_decimal(v) for v in md["clip.vision.image_mean"]],
        "image_std": [float32_decimal(v) for v in md["clip.vision.image_std"]],
        "image_processor_type": "Idefics3ImageProcessor",
        "max_image_size": {"longest_edge": tile},
        "size": {"longest_edge": edge if _positive(edge) else tile},
    }
    return {"image_processor": image_processor, "image_seq_len": (tile // patch) ** 2 // scale**2,
            "processor_class": "Idefics3Processor"}


def weight_bytes(pair: Pair) -> int:
    """The bf16 checkpoint's bytes: two per weight of both files."""
    return 2 * sum(t.numel for h in (pair.text, pair.mmproj) for t in h.tensors)


__all__ = ["Pair", "check_pair", "hf_config_of_pair", "processor_config", "weight_bytes"]
