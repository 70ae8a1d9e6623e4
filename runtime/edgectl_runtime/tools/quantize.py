"""The portable ``cpu_int4`` checkpoint writer (the arithmetic is :mod:`edgectl_runtime.formats.groups`).

``python -m edgectl_runtime.tools.quantize SRC OUT [--group-size N]`` is what ``edgectl quantize``
runs under the runtime interpreter. It reads a bf16/fp16/fp32 Hugging Face checkpoint tensor
by tensor and writes OUT with, for every quantizable linear weight ``P.weight [N, K]``:

- ``P.qweight``  uint8 ``[N, K/2]``: column 2i in the low nibble, 2i+1 in the high nibble;
- ``P.scales``   ``[N, K/g]`` and ``P.zeros`` ``[N, K/g]`` in the source dtype,

with ``w = (q - 8) * scale + zero`` (the dequantization of PyTorch's CPU int4 kernel). This
layout is the same on every machine; PyTorch's packed layout depends on the ISA, so packing
happens on the target at load (``edgectl_runtime.kernels.cpu_int4``), into whichever kernel's layout the
plan chose.
Every other tensor is copied unchanged. ``config.json`` gains
``quantization_config = {"quant_method": "cpu_int4", ...}`` so vLLM picks the method itself.

Memory is bounded by the largest source tensor (plus one block of fp32 rows): the safetensors
file is written by hand, header first (all output shapes are known from the source header),
then one tensor at a time. The output is byte-for-byte deterministic: tensors in name order,
round-half-to-even, no timestamps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from edgectl.contract.int4_layout import (
    ALLOWED_GROUP_SIZES,
    DEFAULT_GROUP_SIZE,
    PORTABLE_FORMAT,
    choose_group_size,
    quantizable,
)
from edgectl_runtime.formats.groups import pack_nibbles, quantize_int4

# ---------------------------------------------------------------------------------------------
# Which tensors are quantized

# Embeddings, LM heads and norms stay in the source dtype: they are not LinearBase layers in
# vLLM (the LM head is quantized at load time instead, when EDGECTL_LM_HEAD=int4 or int8).
_NOT_LINEAR = re.compile(r"(^|\.)(embed_tokens|lm_head|wte|wpe|embed_in|embed_out|word_embeddings|"
                         r"output|embeddings|[^.]*norm[^.]*)$")
# vLLM fuses these into one layer (qkv_proj, gate_up_proj); the fused layer is int4 only if
# every part is, so siblings are decided together (int4_layout.quantizable_partitions).
_FUSED = re.compile(r"^(?P<prefix>.*)\.(?P<part>q_proj|k_proj|v_proj|gate_proj|up_proj)$")
_FUSED_GROUP = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}

_DTYPES = {  # safetensors dtype names
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
    torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
    torch.bool: "BOOL",
}
_FLOAT_NAMES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


@dataclass(frozen=True)
class SourceTensor:
    name: str
    file: Path
    dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]


@dataclass(frozen=True)
class OutputTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str
    role: str  # "copy" | "qweight" | "scales" | "zeros"
    group_size: int = 0

    @property
    def nbytes(self) -> int:
        size = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "I16": 2, "I32": 4,
                "I64": 8, "BOOL": 1}[self.dtype]
        count = 1
        for d in self.shape:
            count *= d
        return count * size


class QuantizeInputError(ValueError):
    """Bad input the user can fix (exit code 2, one line)."""


def _read_header(path: Path) -> dict:
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise QuantizeInputError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * 1024 * 1024:
            raise QuantizeInputError(f"{path} is not a safetensors file (header of {length} bytes)")
        return json.loads(f.read(length))


def list_source_tensors(src: Path) -> list[SourceTensor]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise QuantizeInputError(f"{src} has no *.safetensors files: quantize needs a Hugging Face "
                                 "checkpoint in safetensors format")
    tensors: dict[str, SourceTensor] = {}
    for path in files:
        for name, meta in _read_header(path).items():
            if name == "__metadata__":
                continue
            if name in tensors:
                raise QuantizeInputError(f"tensor {name} appears in two files ({tensors[name].file.name}, {path.name})")
            tensors[name] = SourceTensor(name, path, meta["dtype"], tuple(meta["shape"]))
    return [tensors[n] for n in sorted(tensors)]


def plan_outputs(tensors: list[SourceTensor], preferred: int) -> tuple[list[OutputTensor], list[str]]:
    """The output tensors (in write order) and the names of the quantized source weights."""
    candidates: dict[str, tuple[bool, int]] = {}
    for t in tensors:
        if not t.name.endswith(".weight") or len(t.shape) != 2 or t.dtype not in _FLOAT_NAMES:
            continue
        module = t.name[: -len(".weight")]
        if _NOT_LINEAR.search(module):
            continue
        ok, _ = quantizable(t.shape[0], t.shape[1], preferred)
        candidates[module] = (ok, t.shape[1])
    # Fused siblings: all or none.
    groups: dict[tuple[str, str], list[str]] = {}
    for module in candidates:
        m = _FUSED.match(module)
        if m:
            groups.setdefault((m["prefix"], _FUSED_GROUP[m["part"]]), []).append(module)
    for members in groups.values():
        all_ok = all(candidates[x][0] for x in members) and len({candidates[x][1] for x in members}) == 1
        for x in members:
            candidates[x] = (all_ok, candidates[x][1])

    outputs: list[OutputTensor] = []
    quantized: list[str] = []
    for t in tensors:
        module = t.name[: -len(".weight")] if t.name.endswith(".weight") else None
        if module is not None and candidates.get(module, (False, 0))[0]:
            n, k = t.shape
            g = choose_group_size(k, preferred)
            assert g is not None
            quantized.append(t.name)
            outputs.append(OutputTensor(f"{module}.qweight", "U8", (n, k // 2), t.name, "qweight", g))
            outputs.append(OutputTensor(f"{module}.scales", t.dtype, (n, k // g), t.name, "scales", g))
            outputs.append(OutputTensor(f"{module}.zeros", t.dtype, (n, k // g), t.name, "zeros", g))
        else:
            outputs.append(OutputTensor(t.name, t.dtype, t.shape, t.name, "copy"))
    return outputs, quantized


def _header_bytes(outputs: list[OutputTensor]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt", "edgectl_format": PORTABLE_FORMAT}}
    offset = 0
    for o in outputs:
        header[o.name] = {"dtype": o.dtype, "shape": list(o.shape), "data_offsets": [offset, offset + o.nbytes]}
        offset += o.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.contiguous()
    return memoryview(t.view(torch.uint8).reshape(-1).numpy())


def _iter_outputs(tensors: list[SourceTensor], outputs: list[OutputTensor]) -> Iterator[tuple[OutputTensor, torch.Tensor]]:
    from safetensors import safe_open

    by_name = {t.name: t for t in tensors}
    handles: dict[Path, object] = {}
    pending: dict[str, torch.Tensor] = {}
    try:
        for o in outputs:
            src = by_name[o.source]
            if src.file not in handles:
                handles[src.file] = safe_open(str(src.file), framework="pt")
            if o.role == "copy":
                yield o, handles[src.file].get_tensor(src.name)
                continue
            if o.role == "qweight":
                w = handles[src.file].get_tensor(src.name)
                q, s, z = quantize_int4(w, o.group_size, w.dtype)
                del w
                pending = {"qweight": pack_nibbles(q), "scales": s, "zeros": z}
                del q
            yield o, pending.pop(o.role)
    finally:
        handles.clear()


def write_safetensors(path: Path, tensors: list[SourceTensor], outputs: list[OutputTensor],
                      progress=None) -> None:
    total = sum(o.nbytes for o in outputs)
    done = 0
    next_report = 0.1
    with open(path, "wb") as f:
        f.write(_header_bytes(outputs))
        for i, (o, t) in enumerate(_iter_outputs(tensors, outputs)):
            if tuple(t.shape) != o.shape or _DTYPES[t.dtype] != o.dtype:
                raise RuntimeError(f"{o.name}: produced {t.dtype} {tuple(t.shape)}, header says {o.dtype} {o.shape}")
            f.write(_tensor_bytes(t))
            done += o.nbytes
            if progress and total and done / total >= next_report:
                progress(f"{100 * done // total}% written ({i + 1}/{len(outputs)} tensors)")
                next_report = (int(10 * done / total) + 1) / 10


# ---------------------------------------------------------------------------------------------
# The checkpoint

_WEIGHT_FILES = re.compile(r"(\.safetensors|\.safetensors\.index\.json|\.bin|\.bin\.index\.json|\.pt|\.pth|\.gguf)$")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def validate_source(src: Path, group_size: int) -> dict:
    """The source's config.json, or QuantizeInputError saying what is wrong."""
    if group_size not in ALLOWED_GROUP_SIZES:
        raise QuantizeInputError(f"group size {group_size} is not supported: use one of "
                                 f"{', '.join(str(g) for g in ALLOWED_GROUP_SIZES)}")
    if not src.is_dir():
        raise QuantizeInputError(f"{src} is not a directory: give a Hugging Face model directory")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise QuantizeInputError(f"{src} has no config.json: give a Hugging Face model directory")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise QuantizeInputError(f"{cfg_path} is not readable JSON ({exc})") from None
    qc = config.get("quantization_config")
    if qc:
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise QuantizeInputError(f"{src} is already quantized (quant_method {method}): "
                                 "quantize a bf16/fp16 checkpoint")
    return config


def quantize_checkpoint(src: Path, out: Path, group_size: int = DEFAULT_GROUP_SIZE, progress=None) -> dict:
    """Write the portable checkpoint of ``src`` to ``out`` (atomically) and return a summary."""
    src = src.resolve()
    out = out.absolute()
    config = validate_source(src, group_size)
    if out.exists():
        raise QuantizeInputError(f"{out} already exists: choose a new output directory or remove it")
    if not out.parent.is_dir():
        raise QuantizeInputError(f"{out.parent} does not exist: create it first")
    tensors = list_source_tensors(src)
    outputs, quantized = plan_outputs(tensors, group_size)
    if not quantized:
        raise QuantizeInputError(f"{src} has no linear weight that int4 can hold "
                                 "(2-D, out_features a multiple of 16, in_features a multiple of 32)")
    groups_used: dict[str, int] = {}
    for o in outputs:
        if o.role == "qweight":
            groups_used[str(o.group_size)] = groups_used.get(str(o.group_size), 0) + 1

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        for item in sorted(src.iterdir()):
            if item.is_file() and not _WEIGHT_FILES.search(item.name) and item.name != "config.json":
                shutil.copyfile(item, tmp / item.name)
        config = dict(config)
        config["quantization_config"] = {
            "quant_method": "cpu_int4",
            "format": PORTABLE_FORMAT,
            "bits": 4,
            "group_size": group_size,
            "zero_point": "float",  # w = (q - 8) * scale + zero
            "scale_dtype": sorted({o.dtype for o in outputs if o.role == "scales"}),
            "group_sizes_used": groups_used,
            "quantized_weights": len(quantized),
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_safetensors(tmp / "model.safetensors", tensors, outputs, progress)
        for item in tmp.iterdir():
            item.chmod(0o644)
        tmp.chmod(0o755)
        files = {item.name: _sha256(item) for item in sorted(tmp.iterdir())}
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    source_bytes = sum(t.file.stat().st_size for t in {t.file: t for t in tensors}.values())
    return {
        "schema": "edgectl.quantize/1",
        "source": str(src),
        "output": str(out),
        "format": PORTABLE_FORMAT,
        "group_size": group_size,
        "group_sizes_used": groups_used,
        "quantized_weights": len(quantized),
        "copied_tensors": sum(1 for o in outputs if o.role == "copy"),
        "source_bytes": source_bytes,
        "output_bytes": (out / "model.safetensors").stat().st_size,
        "sha256": files,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.quantize",
                                     description="Write a portable cpu_int4 checkpoint.")
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE)
    args = parser.parse_args(argv)

    def progress(line: str) -> None:
        print(f"quantize: {line}", file=sys.stderr, flush=True)

    try:
        summary = quantize_checkpoint(args.src, args.out, args.group_size, progress)
    except QuantizeInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
