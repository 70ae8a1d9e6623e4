"""The ``/proc/self`` readers of the attribution: the mappings (smaps), which pages are resident
(pagemap), and where each thread's stack is."""

from __future__ import annotations

import ctypes
import os
import re
import threading
from dataclasses import dataclass
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    rss: int = 0
    pss: int = 0
    anonymous: int = 0
    swap: int = 0

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def file_backed(self) -> bool:
        return self.path.startswith("/")

    @property
    def pss_file(self) -> int:
        # A private anonymous page (copy-on-write of a file page, or of an anonymous mapping)
        # is mapped by this process alone here, so its PSS is its size.
        return max(0, self.pss - self.anonymous)


_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) [0-9a-f]+ \S+ \d+\s*(.*)$")
_FIELDS = {"Rss": "rss", "Pss": "pss", "Anonymous": "anonymous", "Swap": "swap"}


def parse_smaps(text: str) -> list[Mapping]:
    out: list[Mapping] = []
    cur: Mapping | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            cur = Mapping(int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4).strip())
            out.append(cur)
            continue
        if cur is None:
            continue
        key, _, rest = line.partition(":")
        attr = _FIELDS.get(key)
        if attr:
            parts = rest.split()
            if parts and parts[-1] == "kB":
                setattr(cur, attr, int(parts[0]) * 1024)
    return out


def read_smaps(pid: int | str = "self") -> list[Mapping]:
    with open(f"/proc/{pid}/smaps") as f:
        return parse_smaps(f.read())


class Pagemap:
    """Which pages of this process are resident (bit 63 of each 8-byte pagemap entry).

    The present bit is readable without privileges (only the frame numbers are hidden)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/pagemap", os.O_RDONLY)

    def close(self) -> None:
        os.close(self._fd)

    def resident_pages(self, start: int, end: int) -> list[int]:
        first, last = start // PAGE, (end + PAGE - 1) // PAGE
        out: list[int] = []
        chunk = 1 << 16
        for lo in range(first, last, chunk):
            hi = min(last, lo + chunk)
            data = os.pread(self._fd, (hi - lo) * 8, lo * 8)
            for i in range(0, len(data), 8):
                if data[i + 7] & 0x80:
                    out.append(lo + i // 8)
        return out


def _current_thread_stack() -> tuple[int, int] | None:
    """(low, high) of the calling thread's stack, from pthread_getattr_np."""
    try:
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_ulong
        attr = ctypes.create_string_buffer(128)  # pthread_attr_t is 56 bytes on x86_64/aarch64
        if libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) != 0:
            return None
        addr, size = ctypes.c_void_p(), ctypes.c_size_t()
        ok = libc.pthread_attr_getstack(attr, ctypes.byref(addr), ctypes.byref(size)) == 0
        libc.pthread_attr_destroy(attr)
        if not ok or not addr.value:
            return None
        return addr.value, addr.value + size.value
    except (OSError, AttributeError):
        return None


def thread_stack_pointers() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every thread of this process with an address inside its stack; and those not located.

    A blocked thread's stack pointer is the second-to-last field of ``/proc/self/task/TID/syscall``;
    a running thread reports ``running`` there (the caller is located through its pthread
    attributes instead)."""
    me = threading.get_native_id()
    located, unknown = [], []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            comm = open(f"/proc/self/task/{tid}/comm").read().strip()
        except OSError:
            continue
        sp = None
        if int(tid) == me:
            rng = _current_thread_stack()
            sp = rng[1] - 1 if rng else None
        else:
            try:
                fields = open(f"/proc/self/task/{tid}/syscall").read().split()
            except OSError:
                fields = []
            if len(fields) >= 3 and fields[0] not in ("running",):
                try:
                    sp = int(fields[-2], 16)
                except ValueError:
                    sp = None
        (located if sp else unknown).append({"tid": int(tid), "name": comm, "sp": sp})
    return located, unknown
