"""Read the tensor table of a safetensors file without loading any tensor.

The format (https://github.com/huggingface/safetensors, "Format"): 8 bytes, an unsigned
little-endian 64-bit header length N; N bytes of UTF-8 JSON mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the byte after the
header) plus an optional ``"__metadata__"`` string map; then the data. This module checks what
the safetensors library itself checks before it maps the data (header inside the file, valid
JSON, offsets matching dtype × shape and inside the data area), so a truncated download or a
damaged file is one clear error here instead of a crash inside the worker.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from edgectl.errors import EdgectlError

# safetensors refuses headers above 100 MB (MAX_HEADER_SIZE in its Rust source); so do we,
# before reading that much from a damaged file.
MAX_HEADER_BYTES = 100_000_000

# Bits per element of every dtype the safetensors format defines (the 22 variants of `Dtype`
# in safetensors 0.8).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}

# safetensors dtype name -> the name torch, transformers and config.json use.
TORCH_DTYPE_NAMES: dict[str, str] = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
    "I32": "int32",
    "I64": "int64",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors spelling, e.g. "BF16"
    shape: tuple[int, ...]
    nbytes: int
    file: str  # the file's name inside the model directory

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _bad(path: Path, problem: str) -> EdgectlError:
    return EdgectlError(
        f"{path}: corrupt safetensors file: {problem}; download or convert the model again"
    )


def read_header(path: Path) -> list[TensorInfo]:
    """The tensors listed in one safetensors file, checked against the file's size."""
    try:
        file_bytes = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise _bad(path, f"file is {file_bytes} bytes, shorter than the 8-byte header length")
            (header_bytes,) = struct.unpack("<Q", prefix)
            if header_bytes > file_bytes - 8:
                raise _bad(
                    path,
                    f"header length {header_bytes} is beyond the file size {file_bytes} (truncated?)",
                )
            if header_bytes > MAX_HEADER_BYTES:
                raise _bad(path, f"header length {header_bytes} exceeds {MAX_HEADER_BYTES} bytes")
            raw = f.read(header_bytes)
    except OSError as exc:
        raise EdgectlError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")

    data_bytes = file_bytes - 8 - header_bytes
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        tensors.append(_tensor(path, name, entry, data_bytes))
    return tensors


def _tensor(path: Path, name: str, entry: object, data_bytes: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _bad(path, f"entry {name!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(path, f"tensor {name!r} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise _bad(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets
    nbits = math.prod(shape) * DTYPE_BITS[dtype]
    if nbits % 8 or end - begin != nbits // 8:
        raise _bad(
            path,
            f"tensor {name!r} ({dtype} {shape}) needs {nbits / 8:g} bytes but its data_offsets "
            f"span {end - begin}",
        )
    if end > data_bytes:
        raise _bad(
            path,
            f"tensor {name!r} data ends at byte {end} of the data area but the file holds only "
            f"{data_bytes} bytes of data (truncated?)",
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), nbytes=end - begin, file=path.name)


INDEX_NAME = "model.safetensors.index.json"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files vLLM would load from ``model_dir``, in order.

    With ``model.safetensors.index.json`` these are the shards its ``weight_map`` names (each must
    exist); otherwise every ``*.safetensors`` file in the directory (vLLM's
    ``filter_duplicate_safetensors_files`` does the same). Empty when there are none.
    """
    index = model_dir / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is not an object of file names")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise EdgectlError(
                f"{index}: not a valid safetensors index ({exc.__class__.__name__}: {exc}); "
                "download or convert the model again"
            ) from None
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (model_dir / s).is_file()]
        if missing:
            raise EdgectlError(
                f"{model_dir}: the safetensors index names {len(missing)} missing shard(s) "
                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                "download the missing files"
            )
        return [model_dir / s for s in shards]
    return sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())


def read_model_tensors(model_dir: Path) -> list[TensorInfo]:
    """Every tensor of every weight file of a model directory (no tensor data is read)."""
    tensors: list[TensorInfo] = []
    for path in weight_files(model_dir):
        tensors.extend(read_header(path))
    return tensors
