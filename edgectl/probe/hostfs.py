"""Every read of ``/proc``, ``/sys`` and the cgroup tree goes through one :class:`HostFS`.

The object holds the root path, so a test (or a user with a bug report) points the probe at a
captured tree instead of ``/`` with no patching of ``open``. It can also record what it read,
which is how ``edgectl probe --capture DIR`` copies exactly the files the probe depends on.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path


class ReadFailed(Exception):
    """A host file could not be read or parsed; ``reason`` is one line for the ``unknown`` list."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Unknowns:
    """Collects the facts that could not be read, each with its reason (never a silent 0)."""

    entries: list[tuple[str, str]] = field(default_factory=list)

    def add(self, fact: str, reason: str) -> None:
        if all(f != fact for f, _ in self.entries):
            self.entries.append((fact, reason))

    def has(self, fact: str) -> bool:
        return any(f == fact for f, _ in self.entries)


class HostFS:
    """Reads files under ``root`` as if ``root`` were ``/``.

    Paths passed in are absolute host paths (``"/proc/meminfo"``); they are re-rooted here.
    """

    # Files the kernel generates are small; this bounds what a garbled fixture can make us read.
    MAX_BYTES = 4 * 1024 * 1024

    def __init__(self, root: str | os.PathLike[str] = "/", *, record: bool = False):
        self.root = Path(root)
        self.is_live = self.root.resolve() == Path("/")
        self._record = record
        self.recorded: dict[str, str] = {}  # host path -> text that was read

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def describe(self, host_path: str) -> str:
        """How to name ``host_path`` in a message: the real path for a fixture root."""
        return host_path if self.is_live else str(self.path(host_path))

    def read_text(self, host_path: str) -> str:
        """The text of ``host_path``; raises :class:`ReadFailed` with a one-line reason."""
        p = self.path(host_path)
        try:
            # /proc, /sys and cgroupfs files are regular files; a FIFO or device in a garbled tree
            # would block or stream forever
            if p.exists() and not p.is_dir() and not stat.S_ISREG(p.stat().st_mode):
                raise ReadFailed(f"{self.describe(host_path)} is not a regular file")
            with open(p, "rb") as f:
                # small reads: some /proc/sys handlers allocate a kernel buffer of the size asked
                # for, and a single 4 MiB read() fails there with ENOMEM
                chunks, size = [], 0
                while size <= self.MAX_BYTES:
                    chunk = f.read(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                data = b"".join(chunks)
        except FileNotFoundError:
            raise ReadFailed(f"{self.describe(host_path)} does not exist") from None
        except PermissionError:
            raise ReadFailed(f"{self.describe(host_path)} is not readable (permission denied)") from None
        except IsADirectoryError:
            raise ReadFailed(f"{self.describe(host_path)} is a directory, expected a file") from None
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            if exc.errno == errno.ENOTDIR:
                reason = "a parent of it is not a directory"
            raise ReadFailed(f"{self.describe(host_path)} could not be read ({reason})") from None
        if len(data) > self.MAX_BYTES:
            raise ReadFailed(f"{self.describe(host_path)} is larger than {self.MAX_BYTES} bytes: not a kernel file")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ReadFailed(f"{self.describe(host_path)} is not text") from None
        if self._record:
            self.recorded[host_path] = text
        return text

    def read_optional(self, host_path: str) -> str | None:
        """The text, or None when the file does not exist (other failures still raise)."""
        if not self.path(host_path).exists():
            return None
        return self.read_text(host_path)

    def exists(self, host_path: str) -> bool:
        return self.path(host_path).exists()

    def is_dir(self, host_path: str) -> bool:
        return self.path(host_path).is_dir()

    def listdir(self, host_path: str) -> list[str]:
        """Sorted entry names of a directory, or [] when it does not exist or cannot be listed."""
        try:
            return sorted(os.listdir(self.path(host_path)))
        except OSError:
            return []
