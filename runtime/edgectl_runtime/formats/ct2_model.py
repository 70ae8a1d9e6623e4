"""A CTranslate2 ``model.bin`` read into NumPy arrays, without CTranslate2.

The format (CTranslate2 ``python/ctranslate2/specs/model_spec.py``, ``ModelSpec._serialize``, binary
version 6; docs/speech-research.md): little-endian, no padding::

    u32 version | str spec | u32 revision | u32 n
    n x { str name | u8 rank | rank x u32 dim | u8 dtype | u32 nbytes | nbytes of data }
    u32 n_aliases | n_aliases x { str alias | str target }

where ``str`` is a u16 length counting a final NUL, the UTF-8 bytes and that NUL. The arrays are
views into the file's bytes (read once), in the file's own dtype.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BINARY_VERSION = 6
# dtype ids (model_spec.py, ``_dtype_to_type_id``); bfloat16 has no NumPy type: read as its raw uint16.
DTYPES: dict[int, type] = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}


class Ct2FormatError(ValueError):
    """The bytes are not a CTranslate2 model this reader knows."""


@dataclass(frozen=True)
class Ct2Model:
    spec: str  # e.g. "WhisperSpec"
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]

    def scalar(self, name: str) -> int:
        """A one-element variable (num_heads, activation, ...) as an int."""
        value = self.variables.get(name)
        if value is None or value.size != 1:
            raise Ct2FormatError(f"no scalar variable {name!r}")
        return int(value.reshape(-1)[0])


def read_ct2_model(path: Path) -> Ct2Model:
    return parse_ct2_model(path.read_bytes(), str(path))


def parse_ct2_model(buf: bytes, where: str = "model.bin") -> Ct2Model:
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(buf):
            raise Ct2FormatError(f"{where}: ends at byte {len(buf)} inside a header field (truncated?)")
        (value,) = struct.unpack_from(fmt, buf, pos)
        pos += size
        return int(value)

    def text() -> str:
        nonlocal pos
        n = take("<H")
        if n == 0 or pos + n > len(buf) or buf[pos + n - 1] != 0:
            raise Ct2FormatError(f"{where}: a malformed string at byte {pos - 2}")
        value = buf[pos:pos + n - 1].decode("utf-8")
        pos += n
        return value

    version = take("<I")
    if version != BINARY_VERSION:
        raise Ct2FormatError(f"{where}: CTranslate2 binary version {version}, this reader knows {BINARY_VERSION}")
    spec, revision = text(), take("<I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = text()
        shape = tuple(take("<I") for _ in range(take("<B")))
        dtype_id = take("<B")
        nbytes = take("<I")
        if dtype_id not in DTYPES:
            raise Ct2FormatError(f"{where}: {name} has dtype id {dtype_id}, unknown")
        dtype = np.dtype(DTYPES[dtype_id])
        if nbytes != dtype.itemsize * int(np.prod(shape, dtype=np.int64)) or pos + nbytes > len(buf):
            raise Ct2FormatError(f"{where}: {name} {list(shape)} {dtype} does not fit its {nbytes} bytes "
                                 "(truncated or damaged)")
        variables[name] = np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=pos).reshape(shape)
        pos += nbytes
    aliases = {}
    for _ in range(take("<I")):
        alias = text()
        aliases[alias] = text()
    if pos != len(buf):
        raise Ct2FormatError(f"{where}: {len(buf) - pos} bytes after the aliases (damaged?)")
    return Ct2Model(spec, revision, variables, aliases)
