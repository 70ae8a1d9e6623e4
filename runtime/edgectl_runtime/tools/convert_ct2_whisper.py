"""Convert a CTranslate2 Whisper model (faster-whisper's files) into the Hugging Face directory vLLM's
Whisper loads, offline, with NumPy and safetensors (no torch).

Run by ``edgectl models pull`` under the runtime interpreter, in a subprocess::

    python -m edgectl_runtime.tools.convert_ct2_whisper CT2_DIR OUT_DIR

``CT2_DIR`` holds ``model.bin``, ``config.json`` (CTranslate2's: alignment heads, suppressed ids),
``tokenizer.json`` and ``vocabulary.txt``. ``OUT_DIR`` (absent or empty) gets ``model.safetensors``
(every tensor in the dtype it is stored in, float16 for the catalog's), ``config.json``,
``generation_config.json``, ``preprocessor_config.json``, ``tokenizer.json`` and
``tokenizer_config.json`` (docs/speech-research.md, "CTranslate2 → Hugging Face Whisper"). The tensor
mapping is ``edgectl/contract/whisper_names.py``; anything it does not account for (a variable left
over, a shape that differs, a k bias that is not zero) refuses the model.

On success the last line on stdout is one JSON object: the tensors written and the tools' versions.
Exit codes: 0 done, 2 bad arguments, 1 the model was refused or the conversion failed (the reason on stderr).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edgectl.contract.whisper_names import (
    CT2_ALIASES,
    CT2_REQUIRED_SCALARS,
    CT2_REVISION,
    CT2_SPEC,
    MULTILINGUAL_MIN_VOCAB,
    WhisperDims,
    hf_tensors,
    zero_k_biases,
)
from edgectl_runtime.formats.ct2_model import Ct2FormatError, Ct2Model, read_ct2_model

TOOLS = ("numpy", "safetensors")
TIMESTAMP_TOKEN = re.compile(r"^<\|\d+\.\d\d\|>$")  # <|0.00|> ... <|30.00|>

# WhisperFeatureExtractor's settings for Whisper's 80-bin log-mel (transformers'
# feature_extraction_whisper.py defaults; vLLM reads chunk_length and sampling_rate from them,
# whisper.py ``get_speech_to_text_config``).
SAMPLE_RATE, HOP_LENGTH, N_FFT, CHUNK_S = 16000, 160, 400, 30


class Refused(Exception):
    """The files are not a CTranslate2 Whisper model this converter maps."""


def whisper_dims(model: Ct2Model) -> WhisperDims:
    v = model.variables

    def shape(name: str) -> tuple[int, ...]:
        if name not in v:
            raise Refused(f"model.bin has no {name}")
        return tuple(int(n) for n in v[name].shape)

    def layers(side: str) -> int:
        return len({k.split("/")[1] for k in v if re.match(rf"{side}/layer_\d+/", k)})

    vocab, d_model = shape("decoder/embeddings/weight")
    return WhisperDims(
        encoder_layers=layers("encoder"), decoder_layers=layers("decoder"), d_model=d_model,
        encoder_ffn_dim=shape("encoder/layer_0/ffn/linear_0/weight")[0],
        decoder_ffn_dim=shape("decoder/layer_0/ffn/linear_0/weight")[0],
        num_mel_bins=shape("encoder/conv1/weight")[1],
        max_source_positions=shape("encoder/position_encodings/encodings")[0],
        max_target_positions=shape("decoder/position_encodings/encodings")[0], vocab_size=vocab,
    )


def check_model(model: Ct2Model) -> None:
    """Refuse a model whose spec, aliases or scalar settings the mapping was not written for."""
    if (model.spec, model.revision) != (CT2_SPEC, CT2_REVISION):
        raise Refused(f"model.bin is a {model.spec} revision {model.revision}, not {CT2_SPEC} revision {CT2_REVISION}")
    if model.aliases != CT2_ALIASES:
        raise Refused(f"model.bin's aliases are {model.aliases}, expected {CT2_ALIASES} (the tied LM head)")
    for name, want in CT2_REQUIRED_SCALARS.items():
        if model.scalar(name) != want:
            raise Refused(f"model.bin's {name} is {model.scalar(name)}, this conversion needs {want}")


def _rows(array: np.ndarray, part: int, parts: int) -> np.ndarray:
    n = array.shape[0] // parts
    return array[part * n:(part + 1) * n]


def convert_tensors(model: Ct2Model, dims: WhisperDims) -> dict[str, np.ndarray]:
    """The Hugging Face tensors, cut from the CTranslate2 variables (nothing transposed or cast)."""
    v = model.variables
    used: set[str] = set()
    out: dict[str, np.ndarray] = {}
    for t in hf_tensors(dims):
        if t.source not in v:
            raise Refused(f"model.bin has no {t.source} (for {t.name})")
        source = v[t.source]
        if source.shape[0] % t.parts:
            raise Refused(f"{t.source} {list(source.shape)} does not split into {t.parts} row blocks")
        tensor = _rows(source, t.part, t.parts)
        if tuple(tensor.shape) != t.shape:
            raise Refused(f"{t.source} gives {t.name} the shape {list(tensor.shape)}, expected {list(t.shape)}")
        out[t.name] = np.ascontiguousarray(tensor)
        used.add(t.source)
    for z in zero_k_biases(dims):
        block = _rows(v[z.source], z.part, z.parts)
        if np.any(block):
            raise Refused(f"{z.source}: the k bias (row block {z.part} of {z.parts}) is not zero "
                          f"(max |x| {float(np.abs(block.astype(np.float32)).max()):g}); transformers' k_proj has "
                          "no bias to hold it")
    left = sorted(k for k, a in v.items() if k not in used and a.ndim > 0)  # scalars: settings, checked above
    if left:
        raise Refused(f"model.bin has {len(left)} tensor(s) the mapping does not place: {', '.join(left[:5])}")
    return out


class _SpecialTokens(dict[str, int]):
    """tokenizer.json's added tokens by text; a missing one refuses the model, naming it."""

    def __missing__(self, key: str) -> int:
        raise Refused(f"tokenizer.json has no special token {key}")


def timestamp_tokens(vocabulary: list[str], first: int, vocab_size: int) -> list[dict[str, Any]]:
    """``<|0.00|>`` ... ``<|30.00|>``: the ids after ``<|notimestamps|>`` that faster-whisper's
    tokenizer.json leaves out (vocabulary.txt and the embedding rows have them)."""
    if len(vocabulary) != vocab_size:
        raise Refused(f"vocabulary.txt has {len(vocabulary)} entries, the embedding table {vocab_size} rows")
    added = []
    for i in range(first, vocab_size):
        if not TIMESTAMP_TOKEN.match(vocabulary[i]):
            raise Refused(f"vocabulary.txt entry {i} is {vocabulary[i]!r}, expected a timestamp token")
        added.append({"id": i, "content": vocabulary[i], "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    return added


def convert(ct2_dir: Path, out_dir: Path) -> dict[str, Any]:
    from safetensors.numpy import save_file

    try:
        model = read_ct2_model(ct2_dir / "model.bin")
    except Ct2FormatError as exc:
        raise Refused(str(exc)) from None
    check_model(model)
    dims = whisper_dims(model)
    tensors = convert_tensors(model, dims)
    ct2_config = json.loads((ct2_dir / "config.json").read_text(encoding="utf-8"))
    tokenizer = json.loads((ct2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocabulary = (ct2_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    if vocabulary and vocabulary[-1] == "":
        vocabulary.pop()

    special = _SpecialTokens({a["content"]: a["id"] for a in tokenizer["added_tokens"]})
    eot, sot, no_timestamps = special["<|endoftext|>"], special["<|startoftranscript|>"], special["<|notimestamps|>"]
    have = {a["id"] for a in tokenizer["added_tokens"]}
    tokenizer["added_tokens"] += [t for t in timestamp_tokens(vocabulary, no_timestamps + 1, dims.vocab_size)
                                  if t["id"] not in have]
    multilingual = dims.vocab_size >= MULTILINGUAL_MIN_VOCAB
    dtype = {np.dtype(np.float16): "float16", np.dtype(np.float32): "float32"}.get(
        tensors["model.decoder.embed_tokens.weight"].dtype)
    if dtype is None:
        raise Refused(f"the weights are {tensors['model.decoder.embed_tokens.weight'].dtype}, not float16 or float32")
    heads = model.scalar("encoder/num_heads"), model.scalar("decoder/num_heads")
    suppress = ct2_config.get("suppress_ids", [])
    suppress_begin = ct2_config.get("suppress_ids_begin", [220, eot])
    ids = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "decoder_start_token_id": sot}

    config = {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "vocab_size": dims.vocab_size, "num_mel_bins": dims.num_mel_bins, "d_model": dims.d_model,
        "encoder_layers": dims.encoder_layers, "decoder_layers": dims.decoder_layers,
        "num_hidden_layers": dims.encoder_layers,
        "encoder_attention_heads": heads[0], "decoder_attention_heads": heads[1],
        "encoder_ffn_dim": dims.encoder_ffn_dim, "decoder_ffn_dim": dims.decoder_ffn_dim,
        "max_source_positions": dims.max_source_positions, "max_target_positions": dims.max_target_positions,
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "is_encoder_decoder": True, "use_cache": True, "dropout": 0.0, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, **ids,
        "suppress_tokens": suppress, "begin_suppress_tokens": suppress_begin,
        "max_length": dims.max_target_positions, "dtype": dtype,
    }
    generation = {
        "alignment_heads": ct2_config.get("alignment_heads"), "begin_suppress_tokens": suppress_begin,
        "suppress_tokens": suppress, **ids, "is_multilingual": multilingual, "max_initial_timestamp_index": 50,
        "max_length": dims.max_target_positions, "no_timestamps_token_id": no_timestamps,
        "prev_sot_token_id": special["<|startofprev|>"], "return_timestamps": False,
    }
    if multilingual:  # the language tokens sit between <|startoftranscript|> and <|translate|>
        by_id = {i: text for text, i in special.items()}
        generation["lang_to_id"] = {by_id[i]: i for i in range(sot + 1, special["<|translate|>"])}
        generation["task_to_id"] = {"translate": special["<|translate|>"], "transcribe": special["<|transcribe|>"]}
    preprocessor = {
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
        "feature_size": dims.num_mel_bins, "sampling_rate": SAMPLE_RATE, "hop_length": HOP_LENGTH,
        "chunk_length": CHUNK_S, "n_fft": N_FFT, "n_samples": CHUNK_S * SAMPLE_RATE,
        "nb_max_frames": CHUNK_S * SAMPLE_RATE // HOP_LENGTH, "padding_side": "right", "padding_value": 0.0,
        "return_attention_mask": False,
    }
    tokenizer_config = {
        "tokenizer_class": "WhisperTokenizer", "processor_class": "WhisperProcessor", "model_max_length": 1024,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "add_prefix_space": False, "errors": "replace",
    }

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name, data in (("config.json", config), ("generation_config.json", generation),
                       ("preprocessor_config.json", preprocessor), ("tokenizer_config.json", tokenizer_config)):
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out_dir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    return {"tensors": len(tensors), "dtype": dtype, "multilingual": multilingual,
            "timestamp_tokens": dims.vocab_size - no_timestamps - 1, "tools": tool_versions()}


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m edgectl_runtime.tools.convert_ct2_whisper CT2_DIR OUT_DIR", file=sys.stderr)
        return 2
    ct2_dir, out_dir = Path(argv[0]), Path(argv[1])
    missing = [n for n in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt") if not (ct2_dir / n).is_file()]
    if missing:
        print(f"{ct2_dir} has no {', '.join(missing)}", file=sys.stderr)
        return 2
    if out_dir.exists() and any(out_dir.iterdir()):
        print(f"{out_dir} is not empty", file=sys.stderr)
        return 2
    try:
        report = convert(ct2_dir, out_dir)
    except (Refused, ValueError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
