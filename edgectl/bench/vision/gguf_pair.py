"""llama.cpp's GGUF pair of a vision-language directory, for the bench's llama.cpp arm.

llama-server reads a vision-language model as two files: the language model's GGUF and the
vision projector's (``--mmproj``: the tower and the connector). Both are written from the very
directory the other arms serve by llama.cpp's own converter, ``convert_hf_to_gguf.py`` of the
cached build (``edgectl/llamacpp.py``, ``find_llama_tools``), once without and once with
``--mmproj``, in bf16 as the plan serves the weights (``--outtype bf16``). They are kept under the
model cache, as bench/requantize.py keeps its Q4_0 files::

    <EDGECTL_MODEL_CACHE>/vision-gguf/<source sha256[:16]>-<build>-<converter sha256[:8]>/
        model.gguf      the language model
        mmproj.gguf     the vision projector
        converted.json  the provenance: each file's sha256, the converter's version and sha256, the commands
        convert-text.log, convert-mmproj.log   what the converter printed

keyed by the directory's contents, the build and the converter script, so another model, build
or converter makes a new pair. A pair is written whole into a staging directory and moved into
place, or not at all.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.atomic import replace_dir
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import sha256_file

DIRECTORY = "vision-gguf"
TEXT_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"
PROVENANCE_FILE = "converted.json"
OUTTYPE = "bf16"  # the plan serves a vision model's weights in bf16 (docs/vision.md, "Format")
# What the converter is not given to read: edgectl's own record of the pull.
NOT_SOURCE = ("edgectl-model.json",)
CONVERT_TIMEOUT_S = 1800

Progress = Callable[[str], None]


@dataclass(frozen=True)
class GgufPair:
    """The language model's GGUF, the projector's, and how they were made."""

    text: Path
    mmproj: Path
    provenance: dict[str, Any]


@dataclass(frozen=True)
class Converter:
    """One build's converter: the script, the interpreter that runs it, the build it came with."""

    script: Path
    python: str
    build: str  # the build's directory name, its version (edgectl/llamacpp.py: <cache>/llama.cpp/<version>)
    source: str | None = None  # the build's SOURCE record: what it was built from

    def describe(self) -> dict[str, Any]:
        return {"script": str(self.script), "sha256": sha256_file(self.script), "build": self.build,
                "source": self.source, "python": self.python}


def source_digest(model_dir: Path) -> tuple[str, dict[str, str]]:
    """The directory's identity: sha256 over its files' names and sha256s (edgectl's record left out),
    and the per-file sha256s."""
    files = {p.name: sha256_file(p) for p in sorted(model_dir.iterdir())
             if p.is_file() and p.name not in NOT_SOURCE}
    whole = hashlib.sha256("".join(f"{name}\0{digest}\n" for name, digest in files.items()).encode()).hexdigest()
    return whole, files


def commands(converter: Converter, model_dir: Path, out_dir: Path) -> dict[str, list[str]]:
    """The converter's two runs: the language model, then the projector (``--mmproj``)."""
    base = [converter.python, str(converter.script), str(model_dir), "--outtype", OUTTYPE]
    return {"text": [*base, "--outfile", str(out_dir / TEXT_FILE)],
            "mmproj": [*base, "--mmproj", "--outfile", str(out_dir / MMPROJ_FILE)]}


def gguf_pair(model_dir: Path, converter: Converter, cache: Path, env: Mapping[str, str],
              progress: Progress) -> GgufPair:
    """The pair of ``model_dir``: kept from an earlier run, else converted now."""
    progress(f"llama.cpp's GGUF pair: sha256 of {model_dir}")
    digest, files = source_digest(model_dir)
    described = converter.describe()
    key = f"{digest[:16]}-{converter.build}-{described['sha256'][:8]}"
    dest = cache / DIRECTORY / key
    record = dest / PROVENANCE_FILE
    if record.is_file() and (dest / TEXT_FILE).is_file() and (dest / MMPROJ_FILE).is_file():
        progress(f"llama.cpp's GGUF pair: kept in {dest}")
        return GgufPair(dest / TEXT_FILE, dest / MMPROJ_FILE, json.loads(record.read_text()))
    progress(f"llama.cpp's GGUF pair: converting {model_dir} with {converter.script} ({OUTTYPE}, then --mmproj)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=dest.parent))
    try:
        argvs = commands(converter, model_dir, staging)
        for what, argv in argvs.items():
            _run(argv, staging / f"convert-{what}.log", env)
        provenance = {
            "converter": described, "outtype": OUTTYPE,
            # as run, with the staging directory named by the final one
            "commands": {w: [a.replace(str(staging), str(dest)) for a in argv] for w, argv in argvs.items()},
            "source": {"path": str(model_dir), "sha256": digest, "files": files},
            "text": _file_facts(staging / TEXT_FILE), "mmproj": _file_facts(staging / MMPROJ_FILE),
        }
        (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1) + "\n")
        replace_dir(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return GgufPair(dest / TEXT_FILE, dest / MMPROJ_FILE, provenance)


def _run(argv: list[str], log: Path, env: Mapping[str, str]) -> None:
    with log.open("wb") as f:
        try:
            done = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=dict(env), timeout=CONVERT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EdgectlError(f"{Path(argv[1]).name} could not run: {exc}", exit_code=EXIT_FAILED) from None
    if done.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise EdgectlError(f"{Path(argv[1]).name} failed (exit {done.returncode}): {tail}", exit_code=EXIT_FAILED)


def _file_facts(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise EdgectlError(f"the converter exited 0 but wrote no {path.name}", exit_code=EXIT_FAILED)
    return {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size}
