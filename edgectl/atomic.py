"""Writing a file so that readers see the old content or the new, never a part."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to a temporary file beside ``path``, sync it, then rename it over ``path``.

    A failure leaves ``path`` as it was and no temporary file behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def replace_dir(staging: Path, dest: Path) -> None:
    """Put a directory written whole in ``staging`` (beside ``dest``) in place of ``dest``: its files
    made readable to every user (the service user reads the model cache too), then one rename."""
    for p in (staging, *staging.iterdir()):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(staging, dest)
