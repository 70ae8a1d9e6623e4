"""The GGUF in another llama.cpp format, for the bench's llama.cpp arms at their best.

llama.cpp's CPU backend repacks Q4_0, Q4_K, IQ4_NL and Q8_0 into interleaved tiles for its
AVX2/AVX-512 kernels and leaves Q4_1 on its generic dot product (``ggml/src/ggml-cpu/repack.cpp``,
``ggml_repack_get_optimal_repack_type``): a catalog GGUF in Q4_1 is llama.cpp's slowest 4-bit
format on x86, and a user of llama.cpp would run Q4_0 or Q4_K_M. So the bench writes those files
from the catalog's GGUF with the same build's ``llama-quantize --allow-requantize`` (the one
beside the ``llama-server`` it runs), and keeps each in a directory of its own under the model
cache::

    <EDGECTL_MODEL_CACHE>/requantized/<source sha256[:16]>-<TYPE>-<build>/
        model.gguf          the requantized file
        requantized.json    its provenance: the command, the build, the source's and its sha256
        llama-quantize.log  what llama-quantize printed (the tensors that needed a fallback type)
        config.json, tokenizer files   copied from the model's directory, so edgectl's worker
                            can serve the same file (the planned-q4_0 arm: identical weights)

keyed by the source's sha256, the type and the build, so a new build or another source file
makes a new one. A source already of the type is used as it is (nothing written).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.atomic import replace_dir
from edgectl.contract.gguf_header import read_gguf
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import sha256_file

QUANTIZE = "llama-quantize"  # beside llama-server in a build (edgectl/llamacpp.py, TARGETS)
MODEL_FILE = "model.gguf"
PROVENANCE_FILE = "requantized.json"
# What a worker needs beside the GGUF to serve it (the gguf-direct layout of a pulled model).
MODEL_DIR_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json", "special_tokens_map.json")
# llama.cpp's file types (include/llama.h, enum llama_ftype): GGUF's general.file_type.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 25: "IQ4_NL", 30: "IQ4_XS", 32: "BF16"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Variant:
    """The model in one llama.cpp format: its GGUF, the directory a worker serves, how it was made."""

    gguf_type: str
    gguf: Path
    model_dir: Path | None  # None: the source file as it is (its model's own directory serves it)
    provenance: dict[str, Any]


def file_type(path: Path) -> str | None:
    """The GGUF's llama.cpp file type by name (general.file_type), None when not recorded or unknown."""
    value = read_gguf(path).metadata.get("general.file_type")
    return FILE_TYPES.get(value) if isinstance(value, int) else None


_VERSION = re.compile(r"version:\s*(\S+)\s*\(build (\d+), commit ([0-9a-f]+)\)")


def build_version(llama_server: str) -> dict[str, str]:
    """``llama-server --version``: ``version: 0.5.0-dev (build 1, commit 0c1e570)`` as its parts."""
    try:
        done = subprocess.run([llama_server, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EdgectlError(f"{llama_server} --version: {exc}") from None
    text = done.stdout + done.stderr
    m = _VERSION.search(text)
    if not m:
        first = text.strip().splitlines()[:1]
        raise EdgectlError(f"{llama_server} --version printed no version line ({first[0] if first else 'nothing'})")
    return {"version": m.group(1), "build": m.group(2), "commit": m.group(3), "line": m.group(0)}


def quantize_beside(llama_server: str) -> Path:
    """The build's llama-quantize (beside its llama-server), or an EdgectlError saying how to get one."""
    path = Path(llama_server).parent / QUANTIZE
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise EdgectlError(f"no {QUANTIZE} beside {llama_server}: the Q4_0 and Q4_K_M arms need the same build's "
                           f"(`edgectl bench --build-llama-cpp` makes both)")
    return path


def variants(types: Iterable[str], source: Path, llama_server: str, model_dir: Path | None, cache: Path,
             progress: Progress) -> dict[str, Variant]:
    """The source GGUF in each of ``types``: made once by the build's llama-quantize, then kept."""
    types = list(dict.fromkeys(types))
    if not types:
        return {}
    source_type = file_type(source)
    out: dict[str, Variant] = {}
    made: list[str] = []
    for t in types:
        if t == source_type:
            out[t] = Variant(t, source, None, {"gguf_type": t, "source": str(source), "requantized": False,
                                               "note": f"the source GGUF is {t} already: used as it is"})
        else:
            made.append(t)
    if not made:
        return out
    quantize = quantize_beside(llama_server)
    build = build_version(llama_server)
    progress(f"llama.cpp formats: sha256 of {source.name}")
    source_sha = sha256_file(source)
    for t in made:
        out[t] = _variant(t, source, source_sha, source_type, quantize, build, model_dir, cache, progress)
    return out


def _variant(gguf_type: str, source: Path, source_sha: str, source_type: str | None, quantize: Path,
             build: dict[str, str], model_dir: Path | None, cache: Path, progress: Progress) -> Variant:
    key = f"{source_sha[:16]}-{gguf_type}-b{build['build']}-{build['commit']}"
    dest = cache / "requantized" / key
    record = dest / PROVENANCE_FILE
    if record.is_file() and (dest / MODEL_FILE).is_file():
        progress(f"llama.cpp formats: {gguf_type} kept in {dest}")
        return Variant(gguf_type, dest / MODEL_FILE, dest if model_dir else None, json.loads(record.read_text()))
    progress(f"llama.cpp formats: writing {gguf_type} from {source.name} ({source_type or 'type unknown'}) "
             f"with {QUANTIZE} --allow-requantize")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=dest.parent))
    try:
        argv = [str(quantize), "--allow-requantize", str(source), str(staging / MODEL_FILE), gguf_type]
        log = staging / "llama-quantize.log"
        with log.open("wb") as f:
            done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise EdgectlError(f"{QUANTIZE} to {gguf_type} failed (exit {done.returncode}): {tail}",
                               exit_code=EXIT_FAILED)
        if model_dir is not None:
            for name in MODEL_DIR_FILES:
                if (model_dir / name).is_file():
                    shutil.copy2(model_dir / name, staging / name)
        provenance = {
            "gguf_type": gguf_type, "requantized": True,
            "command": [QUANTIZE, "--allow-requantize", source.name, MODEL_FILE, gguf_type],
            "quantize": str(quantize), "llama_cpp": build,
            "source": {"path": str(source), "sha256": source_sha, "gguf_type": source_type,
                       "bytes": source.stat().st_size},
            "sha256": sha256_file(staging / MODEL_FILE), "bytes": (staging / MODEL_FILE).stat().st_size,
            "quantize_summary": _summary(log),
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1) + "\n")
        replace_dir(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Variant(gguf_type, dest / MODEL_FILE, dest if model_dir else None, provenance)


def _summary(log: Path) -> list[str]:
    """llama-quantize's own account: the sizes and how many tensors needed a fallback type."""
    keep = ("model size", "quant size", "fallback", "quantize time")
    return [ln.strip() for ln in log.read_text(errors="replace").splitlines() if any(k in ln for k in keep)]
