"""`edgectl models pull DIR`: a Hugging Face directory of a vision-language model the user brings, made a
pulled model like a catalog one (issue 34: no vision-language weights install from PyPI in a form vLLM
loads, so the user brings them, as Ollama and llama.cpp users do).

Recognised by config.json's architecture (edgectl/models/architectures.py,
``VISION_LANGUAGE_ARCHITECTURES``: Idefics3 / SmolVLM). Before anything is written, the directory is
checked for what vLLM's processor and loader read offline — the weights (every shard a
``model.safetensors.index.json`` names), the image processor's settings, a tokenizer and a chat template
— and inspected like any model (:mod:`edgectl.models.vision_inspect`: the model's own code asked for,
a processor that disagrees with config.json): each problem is one line, exit 2, nothing written.

Then the files vLLM reads (``KEPT_SUFFIXES`` at the top of the directory; not an ``onnx/`` folder or
other formats' weights) are copied into ``<cache>/<name>`` (name from the directory's, as a pulled
GGUF's from its file) through a temporary directory, the tokenizer's cost measured, every file hashed
into the manifest (layout ``hf``: served as it is), and the directory renamed into place. Pulling the
same directory again checks the copy and does nothing more.
"""

from __future__ import annotations

import datetime
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import edgectl
from edgectl.contract import environment
from edgectl.errors import EdgectlError
from edgectl.models import architectures, config_json
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
)
from edgectl.models.catalog import CatalogEntry
from edgectl.models.convert import (
    measure_tokenizer,
    seal_files,
    swap_into_place,
    write_manifest,
)
from edgectl.models.inspect import inspect_model
from edgectl.models.pull import local_name
from edgectl.models.tokenizer_files import (
    TOKENIZER_FILES,
    has_chat_template,
    has_tokenizer,
)

# The top-level files copied: configs, processor and tokenizer files, chat templates, the safetensors
# weights and their index, SentencePiece models, BPE merges / vocabularies.
KEPT_SUFFIXES = (".json", ".jinja", ".safetensors", ".model", ".txt")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def check_directory(path: Path) -> str:
    """The directory's vision-language architecture, after checking it holds what vLLM reads offline;
    EdgectlError naming the first thing missing."""
    config = config_json.read_config(path)
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None or not architectures.is_vision_language(arch):
        text = arch is not None and (architectures.is_supported(arch) or architectures.is_speech_to_text(arch))
        advice = (f"a {arch} directory is served from where it is: `edgectl deploy {path}`" if text else
                  f"edgectl reads {', '.join(architectures.VISION_LANGUAGE_ARCHITECTURES)}")
        raise EdgectlError(f"{path}: `models pull DIR` takes a vision-language model directory, config.json names "
                           f"{arch!r}; {advice}")
    shards = _shards(path)
    missing = [s for s in shards if not (path / s).is_file()]
    if not shards:
        raise EdgectlError(f"{path}: no *.safetensors weights (nor {SAFETENSORS_INDEX}): vLLM loads safetensors; "
                           "copy the model's weights")
    if missing:
        raise EdgectlError(f"{path / SAFETENSORS_INDEX} names {', '.join(missing)}, which {path} does not have: copy "
                           "every shard")
    if not has_tokenizer(path):
        raise EdgectlError(f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}): vLLM's processor needs "
                           "one; copy the model's tokenizer files")
    if not has_chat_template(path):
        raise EdgectlError(f"{path}: no chat template (chat_template.jinja, chat_template.json or tokenizer_config.json's "
                           "chat_template): vLLM needs one to place the image in a chat; copy the model's")
    return arch


def _shards(path: Path) -> list[str]:
    """The weight files: those the index names, else the *.safetensors at the top."""
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EdgectlError(f"{index}: not a safetensors index ({exc}); copy it again") from None
    return sorted(p.name for p in path.glob("*.safetensors"))


def kept_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in KEPT_SUFFIXES
                  and not p.name.startswith(".") and p.name != "edgectl-model.json")


def pull_dir(path: Path, environ: Mapping[str, str], progress: Progress = quiet) -> PullResult:
    """``edgectl models pull DIR``: the vision-language directory ``path`` checked, copied into the cache
    with its manifest; refused with one line and nothing written when vLLM could not serve it."""
    path = path.expanduser().resolve()
    arch = check_directory(path)
    facts = inspect_model(path)  # refuses, with one line, what the planner and vLLM could not use
    assert facts.vision is not None
    name = local_name(path)
    files = kept_files(path)
    size = sum(f.stat().st_size for f in files)
    entry = CatalogEntry(name=name, description=f"the {arch} directory {path}", licence="unknown", package="",
                         version="", member="", gguf_sha256=None, gguf_bytes=0, wheel_bytes=0, converted_bytes=size,
                         safetensors_sha256=None, modality="vision", source_format="safetensors")
    cache = cache_dir(environ)
    final = cache / name
    recorded = ((read_manifest(final) or {}).get("source") or {}).get("path")
    if final.exists() and recorded != str(path):
        raise EdgectlError(f"{final} already holds another model: rename {path.name}, or remove {final}")
    make_dirs(cache)
    with pull_lock(cache, name, progress):
        remove_leftovers(cache, entry)
        if check_model_dir(final, entry, full=True) is None:
            progress(f"done: {path.name} is already pulled as {final}")
            return PullResult(name, final, final, "already pulled", read_manifest(final) or {},
                              source_format=entry.source_format)
        check_space(cache, size, f"copying {path.name}")
        python = environment.runtime_python(environ)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
        try:
            progress(f"copy: {len(files)} files of {path} ({size / 1e6:.0f} MB) -> {final}")
            for f in files:
                shutil.copyfile(f, tmp / f.name)
            progress("copy: done; measuring what its tokenizer costs the worker")
            v = facts.vision
            manifest = {
                "schema": MANIFEST_SCHEMA,
                "name": name,
                "source": {"kind": "directory", "path": str(path), "architecture": arch,
                           "skipped": sorted(p.name for p in path.iterdir() if p not in files)},
                "layout": LAYOUT_HF,
                "tokenizer_cost": measure_tokenizer(python, tmp, environ),
                "vision": {"tokens_per_tile": v.tokens_per_tile, "image_tokens_512": v.image_tokens_512,
                           "image_tokens_max": v.image_tokens_max},
                "files": seal_files(tmp),
                "converter": {"tool": "copied as it is", "edgectl": edgectl.__version__},
                "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            write_manifest(tmp, manifest)
            swap_into_place(tmp, final, cache, name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    progress(f"done: {path.name} is at {final}")
    return PullResult(name, final, final, "pulled", manifest, source_format=entry.source_format)


__all__ = ["check_directory", "pull_dir"]
