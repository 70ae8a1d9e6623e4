"""`edgectl models pull FILE.gguf --mmproj FILE`: llama.cpp's GGUF pair of a vision-language model (the
language model and its vision projector) turned back into the Hugging Face directory it was converted
from, offline, and pulled like a directory (:mod:`edgectl.models.pull_dir`): from then on ``inspect``,
``plan`` and ``deploy`` see a pulled Idefics3 / SmolVLM directory served dense bf16 (docs/vision.md).

Before anything is written the pair is checked (:func:`edgectl.models.llamacpp_pair.check_pair`: a
language model and a projector edgectl maps, of the same model), each problem one line, exit 2. Then,
in ``<cache>/.<name>.tmp-*``:

1. ``<runtime python> -P -m edgectl_runtime.tools.convert_gguf_vlm TEXT MMPROJ TMP`` (gguf-py, torch,
   offline): ``model.safetensors`` in bf16 and the tokenizer and chat template from the language model's GGUF;
2. config.json and processor_config.json from the two files' metadata (:mod:`edgectl.models.llamacpp_pair`);
3. the directory checked as ``pull DIR`` checks one (``pull_dir.check_directory`` and ``inspect_model``),
   the tokenizer's cost measured, every file hashed into the manifest (layout ``hf``; the source: both
   files' paths and sha256), and the directory renamed into place. Pulling the same pair again checks the
   copy and does nothing more.
"""

from __future__ import annotations

import datetime
import json
import re
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
from edgectl.models.cache import (
    LAYOUT_HF,
    MANIFEST_SCHEMA,
    Progress,
    PullResult,
    cache_dir,
    check_model_dir,
    check_space,
    make_dirs,
    pull_lock,
    quiet,
    read_manifest,
    remove_leftovers,
    sha256_file,
)
from edgectl.models.catalog import CATALOG, CatalogEntry
from edgectl.models.convert import (
    measure_tokenizer,
    seal_files,
    swap_into_place,
    write_manifest,
)
from edgectl.models.inspect import inspect_model
from edgectl.models.llamacpp_pair import (
    check_pair,
    hf_config_of_pair,
    processor_config,
    weight_bytes,
)
from edgectl.models.pull import local_name
from edgectl.models.pull_dir import check_directory
from edgectl.models.tool_output import last_json, tail

SOURCE_KIND = "llama.cpp pair"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Free space beyond the bf16 weights: the tokenizer and configs.
EXTRA_BYTES = 64 << 20


def _file_record(path: Path) -> dict[str, Any]:
    return {"path": str(path), "sha256": sha256_file(path), "bytes": path.stat().st_size}


def pull_pair(text: Path, mmproj: Path, environ: Mapping[str, str], progress: Progress = quiet,
              name: str | None = None) -> PullResult:
    """``edgectl models pull TEXT --mmproj MMPROJ [--name NAME]``: the pair turned back into a directory in
    the cache (``<cache>/<name>``, name from the language model's file unless given); refused with one
    line and nothing written when edgectl cannot."""
    text, mmproj = text.expanduser().resolve(), mmproj.expanduser().resolve()
    pair = check_pair(text, mmproj)
    if name is not None and not NAME.match(name):
        raise EdgectlError(f"--name {name!r}: a cache name is lower-case letters, digits and '-' (e.g. "
                           f"{local_name(Path(name + '.gguf'))})")
    name = name or local_name(text)
    if name in CATALOG:
        raise EdgectlError(f"{name} is a catalog model's name (`edgectl models list`): give the pair another with "
                           "--name")
    cache = cache_dir(environ)
    final = cache / name
    recorded = (read_manifest(final) or {}).get("source") or {}
    same_paths = (recorded.get("kind") == SOURCE_KIND and (recorded.get("text") or {}).get("path") == str(text)
                  and (recorded.get("mmproj") or {}).get("path") == str(mmproj))
    if final.exists() and not same_paths:
        raise EdgectlError(f"{final} already holds another model: give the pair another name with --name, or "
                           f"remove {final}")
    size = weight_bytes(pair)
    entry = CatalogEntry(name=name, description=f"the llama.cpp pair {text} + {mmproj}", licence="unknown",
                         package="", version="", member="", gguf_sha256=None, gguf_bytes=0, wheel_bytes=0,
                         converted_bytes=size, safetensors_sha256=None, modality="vision",
                         source_format="safetensors")
    make_dirs(cache)
    with pull_lock(cache, name, progress):
        remove_leftovers(cache, entry)
        progress(f"verify: sha256 of {text.name} and {mmproj.name}")
        source = {"kind": SOURCE_KIND, "text": _file_record(text), "mmproj": _file_record(mmproj),
                  "projector_type": pair.projector_type, "architecture": pair.architecture}
        if check_model_dir(final, entry, full=True) is None and recorded == source:
            progress(f"done: {text.name} + {mmproj.name} is already pulled as {final}")
            return PullResult(name, final, final, "already pulled", read_manifest(final) or {},
                              source_format=entry.source_format)
        check_space(cache, size + EXTRA_BYTES, f"converting {text.name} + {mmproj.name}")
        python = environment.runtime_python(environ)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
        try:
            progress(f"convert: {text.name} + {mmproj.name} -> a Hugging Face directory ({pair.architecture}, bf16, "
                     f"{size / 1e6:.0f} MB), offline")
            started = time.monotonic()
            report = _run_converter(python, text, mmproj, tmp, environ)
            (tmp / "config.json").write_text(
                json.dumps(hf_config_of_pair(pair, int(report["image_token_id"])), indent=2, sort_keys=True) + "\n")
            (tmp / "processor_config.json").write_text(json.dumps(processor_config(pair), indent=2, sort_keys=True)
                                                       + "\n")
            check_directory(tmp)  # what `pull DIR` checks, on what was written
            facts = inspect_model(tmp)
            assert facts.vision is not None
            progress(f"convert: {report['tensors']} tensors in {time.monotonic() - started:.0f} s; measuring what "
                     "its tokenizer costs the worker")
            v = facts.vision
            manifest = {
                "schema": MANIFEST_SCHEMA,
                "name": name,
                "source": source,
                "layout": LAYOUT_HF,
                "tokenizer_cost": measure_tokenizer(python, tmp, environ),
                "vision": {"tokens_per_tile": v.tokens_per_tile, "image_tokens_512": v.image_tokens_512,
                           "image_tokens_max": v.image_tokens_max},
                "files": seal_files(tmp),
                "converter": {"tool": launch.CONVERT_GGUF_VLM, "edgectl": edgectl.__version__, "python": python,
                              "note": "converted from a llama.cpp pair", "gguf_types": report.get("gguf_types"),
                              "tools": report.get("tools")},
                "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            write_manifest(tmp, manifest)
            swap_into_place(tmp, final, cache, name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    progress(f"done: {text.name} + {mmproj.name} is at {final}; serve it with `edgectl deploy {final}`")
    return PullResult(name, final, final, "pulled", manifest, source_format=entry.source_format)


def _run_converter(python: str, text: Path, mmproj: Path, out: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    try:
        done = subprocess.run(launch.command(python, launch.CONVERT_GGUF_VLM, [str(text), str(mmproj), str(out)]),
                              env=launch.environment(environ), capture_output=True, text=True)
    except OSError as exc:
        raise EdgectlError(f"the converter could not start: {exc}", exit_code=EXIT_FAILED) from None
    if done.returncode != 0:
        missing = [m for m in ("gguf", "torch", "safetensors", "transformers") if f"No module named '{m}'" in done.stderr]
        hint = (f"{python} lacks {', '.join(missing)}: install edgectl[runtime] into it" if missing
                else "nothing was written")
        raise EdgectlError(f"converting {text.name} + {mmproj.name} failed (exit {done.returncode}): "
                           f"{tail(done.stderr)}; {hint}", exit_code=EXIT_FAILED)
    report = last_json(done.stdout, "the converter")
    if not isinstance(report.get("image_token_id"), int):
        raise EdgectlError(f"the converter reported no image token id ({tail(done.stdout)})", exit_code=EXIT_FAILED)
    return report


__all__ = ["pull_pair"]
