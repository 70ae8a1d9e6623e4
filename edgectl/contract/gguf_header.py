"""Read the metadata and tensor table of a GGUF file without loading any tensor.

The format (ggml's ``docs/gguf.md``, "File Structure"; version 2 and 3, little-endian):

    "GGUF", uint32 version, uint64 tensor count, uint64 metadata count
    metadata: key (string), uint32 value type, value               (repeated)
    tensor info: name (string), uint32 n_dims, uint64 dims[n_dims],
                 uint32 ggml type, uint64 offset (from the data area)  (repeated)
    padding to ``general.alignment`` (32 when absent), then the data area

A string is a uint64 byte count and UTF-8 bytes; an array is a uint32 element type, a uint64
count and the elements. ``dims[0]`` is the innermost (a row's length): PyTorch's shape is the
dims reversed. This module checks what a loader would trip on later — the magic, the version,
every count and string inside the file, each tensor's type known and its row a whole number of
blocks, each tensor's bytes inside the file — so a truncated download or a damaged file is one
clear error here instead of a crash inside the worker. Large arrays (a tokenizer's vocabulary
and merges) are skipped, keeping their element type and length.
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from edgectl.errors import EdgectlError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Arrays longer than this are not read into memory (their type and length are kept).
MAX_ARRAY_READ = 1024
# A key, a tensor name or a metadata string longer than this is a damaged file (the longest
# real strings are chat templates, a few tens of kB).
MAX_STRING_BYTES = 16 << 20


@dataclass(frozen=True)
class GGMLType:
    name: str
    block: int  # elements per block
    block_bytes: int  # bytes per block


# ggml's tensor types (ggml/include/ggml.h, enum ggml_type) with their block sizes
# (ggml/src/ggml-common.h: the block_* structs; e.g. block_q4_1 = fp16 d, fp16 m, 16 bytes of
# nibbles = 20 bytes per 32 weights). Ids missing here were removed from ggml (Q4_2, Q4_3 and the
# Q4_0_4_4 family); a file that uses one is refused as unknown.
GGML_TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22),
    7: GGMLType("Q5_1", 32, 24),
    8: GGMLType("Q8_0", 32, 34),
    9: GGMLType("Q8_1", 32, 40),
    10: GGMLType("Q2_K", 256, 84),
    11: GGMLType("Q3_K", 256, 110),
    12: GGMLType("Q4_K", 256, 144),
    13: GGMLType("Q5_K", 256, 176),
    14: GGMLType("Q6_K", 256, 210),
    15: GGMLType("Q8_K", 256, 292),
    16: GGMLType("IQ2_XXS", 256, 66),
    17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98),
    19: GGMLType("IQ1_S", 256, 50),
    20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", 256, 110),
    22: GGMLType("IQ2_S", 256, 82),
    23: GGMLType("IQ4_XS", 256, 136),
    24: GGMLType("I8", 1, 1),
    25: GGMLType("I16", 1, 2),
    26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8),
    29: GGMLType("IQ1_M", 256, 56),
    30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 54),
    35: GGMLType("TQ2_0", 256, 66),
    39: GGMLType("MXFP4", 32, 17),
}
GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}

# Metadata value types (docs/gguf.md, gguf_metadata_value_type): id -> (name, struct format).
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
    4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"),
    10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d"),
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array too long to keep (e.g. ``tokenizer.ggml.tokens``): its type and length."""

    element_type: str
    length: int


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is a row's length
    type: GGMLType
    offset: int  # from the start of the data area
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch's order (rows first)."""
        return tuple(reversed(self.dims))

    @property
    def numel(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensor, ...]
    data_offset: int
    file_bytes: int

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_key(self, key: str) -> Any:
        """``<architecture>.<key>`` (e.g. ``llama.block_count``), or None."""
        return self.metadata.get(f"{self.architecture}.{key}") if self.architecture else None


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise _Truncated
        data = self.f.read(n)
        if len(data) != n:
            raise _Truncated
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def u32(self) -> int:
        return int(self.scalar("<I"))

    def u64(self) -> int:
        return int(self.scalar("<Q"))

    def string(self, what: str) -> str:
        n = self.u64()
        if n > MAX_STRING_BYTES:
            raise ValueError(f"{what} claims {n} bytes")
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what} is not UTF-8") from None

    def skip_string(self) -> None:
        n = self.u64()
        if n > MAX_STRING_BYTES or self.f.tell() + n > self.size:
            raise _Truncated
        self.f.seek(n, io.SEEK_CUR)

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][1])
        if vtype == _STRING:
            return self.string(f"the value of {key}")
        if vtype == _ARRAY:
            etype, length = self.u32(), self.u64()
            if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
                raise ValueError(f"the array {key} has elements of unknown type {etype}")
            if length <= MAX_ARRAY_READ:
                return [self.value(etype, key) for _ in range(length)]
            if etype in _SCALARS:
                nbytes = struct.calcsize(_SCALARS[etype][1]) * length
                if self.f.tell() + nbytes > self.size:
                    raise _Truncated
                self.f.seek(nbytes, io.SEEK_CUR)
            elif etype == _STRING:
                for _ in range(length):
                    self.skip_string()
            else:
                for _ in range(length):
                    self.value(_ARRAY, key)
            name = "string" if etype == _STRING else "array" if etype == _ARRAY else _SCALARS[etype][0]
            return SkippedArray(name, length)
        raise ValueError(f"{key} has a value of unknown type {vtype}")


def header_to_json(header: GGUFHeader) -> dict[str, Any]:
    """A header as JSON (no tensor data): what the catalog ships to plan a model before its pull."""
    meta = {k: ({"skipped_array": v.element_type, "length": v.length} if isinstance(v, SkippedArray) else v)
            for k, v in header.metadata.items()}
    return {"version": header.version, "data_offset": header.data_offset, "file_bytes": header.file_bytes,
            "metadata": meta,
            "tensors": [[t.name, list(t.dims), t.type.name, t.offset, t.nbytes] for t in header.tensors]}


def header_from_json(data: dict[str, Any], path: Path) -> GGUFHeader:
    """The inverse of :func:`header_to_json`; ``path`` is where the file will be."""
    meta = {k: (SkippedArray(v["skipped_array"], v["length"]) if isinstance(v, dict) and "skipped_array" in v else v)
            for k, v in data["metadata"].items()}
    tensors = tuple(GGUFTensor(name, tuple(dims), GGML_TYPES_BY_NAME[kind], offset, nbytes)
                    for name, dims, kind, offset, nbytes in data["tensors"])
    return GGUFHeader(path, int(data["version"]), meta, tensors, int(data["data_offset"]), int(data["file_bytes"]))


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts like a GGUF file (or is named like one)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _bad(path: Path, problem: str) -> EdgectlError:
    return EdgectlError(f"{path}: {problem}")


def read_gguf(path: Path | str) -> GGUFHeader:
    """The header of the GGUF file ``path``; raises :class:`EdgectlError` (one line) if damaged."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb", buffering=1 << 20) as f:
            return _read(path, _Reader(f, size), size)
    except _Truncated:
        raise _bad(path, f"truncated: the file ends ({size} bytes) inside its header; "
                         "download it again") from None
    except ValueError as exc:
        raise _bad(path, f"not a valid GGUF file ({exc}); download it again") from None
    except OSError as exc:
        raise _bad(path, f"cannot be read ({exc.strerror or exc})") from None


def _read(path: Path, r: _Reader, size: int) -> GGUFHeader:
    magic = r.take(4) if size >= 4 else b""
    if magic != MAGIC:
        raise _bad(path, f"not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF')")
    version = r.u32()
    if version not in VERSIONS:
        raise _bad(path, f"GGUF version {version}; edgectl reads versions {VERSIONS[0]} and {VERSIONS[-1]} "
                         "(convert it again with a current llama.cpp)")
    n_tensors, n_kv = r.u64(), r.u64()
    # every entry takes at least 8 + 4 bytes: a count above the file's size is damage, not a big model
    if n_tensors > size // 12 or n_kv > size // 12:
        raise ValueError(f"it claims {n_tensors} tensors and {n_kv} metadata entries in {size} bytes")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string("a metadata key")
        metadata[key] = r.value(r.u32(), key)
    infos = []
    for _ in range(n_tensors):
        name = r.string("a tensor name")
        n_dims = r.u32()
        if not 1 <= n_dims <= 4:  # GGML_MAX_DIMS
            raise ValueError(f"tensor {name} has {n_dims} dimensions")
        dims = tuple(r.u64() for _ in range(n_dims))
        type_id, offset = r.u32(), r.u64()
        infos.append((name, dims, type_id, offset))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment is {alignment!r}, expected a power of two")
    data_offset = -(-r.f.tell() // alignment) * alignment

    tensors = []
    for name, dims, type_id, offset in infos:
        gtype = GGML_TYPES.get(type_id)
        if gtype is None:
            raise _bad(path, f"tensor {name} has ggml type {type_id}, which edgectl does not know "
                             "(an old or a newer llama.cpp wrote it)")
        if dims[0] % gtype.block:
            raise ValueError(f"tensor {name}: a row of {dims[0]} is not a whole number of "
                             f"{gtype.name} blocks of {gtype.block}")
        nbytes = math.prod(dims) // gtype.block * gtype.block_bytes
        tensors.append(GGUFTensor(name, dims, gtype, offset, nbytes))
    if tensors:
        last = max(tensors, key=lambda t: t.offset + t.nbytes)
        end = data_offset + last.offset + last.nbytes
        if end > size:
            raise _bad(path, f"truncated: its tensors end at byte {end} ({last.name}) but the file has {size} "
                             "bytes; download it again")
    return GGUFHeader(path, version, metadata, tuple(tensors), data_offset, size)
