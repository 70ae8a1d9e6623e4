"""`edgectl models pull` of a synthetic vision-language catalog entry (``synth-smolvlm-256m``).

The entry (edgectl/models/catalog.py, ``SyntheticSpec.language_model``) is a real VLM's shape around a
real catalog language model: its text model is that model's weights, only the vision tower and the
connector are seeded random. Steps (each announced on the progress callback):

1. the language model — the catalog model it names must be pulled (its GGUF kept); its bf16 copy
   (``convert.bf16_copy``, the one a benchmark's stock-vLLM arm reads) is made once if missing;
2. make — ``<runtime python> -P -m edgectl_runtime.tools.synth_vlm SPEC LM_DIR TMP`` (offline):
   config.json, model.safetensors (bf16), the processor's files and the chat template;
3. seal — what the tokenizer costs the worker measured, every file hashed into the manifest
   (layout ``hf``: the directory is served as it is), the directory renamed into place.

Everything is made in ``<cache>/.<name>.tmp-*``; an interrupted pull leaves only that, which the next
pull removes. A second pull checks the files against the manifest and makes nothing.
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
from edgectl.models.cache import (
    LAYOUT_HF,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    Progress,
    PullResult,
    cache_dir,
    check_gguf,
    check_model_dir,
    check_space,
    gguf_path,
    make_dirs,
    model_dir,
    pull_lock,
    read_manifest,
    remove_leftovers,
)
from edgectl.models.catalog import CATALOG, SYNTHETIC_PURPOSE, CatalogEntry
from edgectl.models.convert import (
    bf16_copy,
    measure_tokenizer,
    seal_files,
    swap_into_place,
    write_manifest,
)
from edgectl.models.tool_output import last_json, tail


def pull_synthetic_vision(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress) -> PullResult:
    """Make the synthetic VLM ``entry`` in the cache, from its pulled language model; once."""
    spec = entry.synthetic
    assert spec is not None and spec.language_model
    lm = CATALOG[spec.language_model]
    cache = cache_dir(environ)
    final = model_dir(entry, environ)
    # Refused before anything is written: the language model is the user's pull to make.
    if check_model_dir(model_dir(lm, environ), lm, full=False) is not None or \
            check_gguf(gguf_path(lm, environ), lm, full=False, manifest=read_manifest(model_dir(lm, environ))):
        raise EdgectlError(f"{entry.name} is made from {lm.name}'s weights, which are not pulled: run "
                           f"`edgectl models pull {lm.name}` first; nothing was written")
    make_dirs(cache)
    with pull_lock(cache, entry.name, progress):
        remove_leftovers(cache, entry)
        problem = check_model_dir(final, entry, full=True)
        if problem is None:
            progress(f"verify: {final}: every file matches {MANIFEST_NAME}")
            progress(f"done: {entry.name} is already made")
            return PullResult(entry.name, final, final, "already pulled", read_manifest(final) or {},
                              source_format=entry.source_format)
        if problem != "not pulled":
            progress(f"verify: {final}: {problem}; it will be made again")
        python = environment.runtime_python(environ)
        check_space(cache, entry.converted_bytes, f"making {entry.name}")
        language_model = bf16_copy(lm, environ, progress)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=cache))
        try:
            progress(f"make: {spec.shape_of}'s shape around {lm.name} ({language_model}), seed {spec.seed}: the "
                     f"vision tower and connector random ({spec.parameters / 1e6:.1f} M parameters in all, bf16)")
            started = time.monotonic()
            made = _make(python, json.dumps(spec.maker_spec()), language_model, tmp, environ)
            progress(f"make: done in {time.monotonic() - started:.0f} s; measuring what its tokenizer costs the worker")
            tokenizer = measure_tokenizer(python, tmp, environ)
            manifest = {
                "schema": MANIFEST_SCHEMA,
                "name": entry.name,
                "source": {"kind": "synthetic", "made_by": "edgectl models pull", "purpose": SYNTHETIC_PURPOSE,
                           "language_model": {"name": lm.name, "path": str(language_model)}},
                "synthetic": {"spec": spec.to_dict(), "maker": made,
                              "made": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
                "layout": LAYOUT_HF,
                "tokenizer_cost": tokenizer,
                "files": seal_files(tmp),
                "converter": {"tool": launch.SYNTH_VLM, "edgectl": edgectl.__version__, "python": python,
                              "tools": made.get("tools")},
                "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            write_manifest(tmp, manifest)
            swap_into_place(tmp, final, cache, entry.name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    progress(f"done: {entry.name} is at {final} (random vision tower: for speed, memory and agreement only)")
    action = "pulled" if problem == "not pulled" else "repaired"
    return PullResult(entry.name, final, final, action, manifest, source_format=entry.source_format)


def _make(python: str, spec: str, language_model: Path, out: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    env = launch.environment(environ)
    try:
        done = subprocess.run(launch.command(python, launch.SYNTH_VLM, [spec, str(language_model), str(out)]),
                              env=env, capture_output=True, text=True)
    except OSError as exc:
        raise EdgectlError(f"the synthetic vision model maker could not start: {exc}", exit_code=EXIT_FAILED) from None
    if done.returncode != 0:
        raise EdgectlError(f"the synthetic vision model maker failed (exit {done.returncode}): {tail(done.stderr)}",
                           exit_code=EXIT_FAILED)
    return last_json(done.stdout, "the synthetic vision model maker")


__all__ = ["pull_synthetic_vision"]
