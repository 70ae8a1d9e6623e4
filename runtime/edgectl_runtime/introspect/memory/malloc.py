"""The allocators' own figures: glibc's counters (``mallinfo2``) and arena heaps, or a preloaded
tcmalloc / jemalloc's statistics."""

from __future__ import annotations

import ctypes
import os

from edgectl_runtime.introspect.memory.proc import Mapping

HEAP_MAX = 64 << 20  # glibc: HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (malloc/arena.c)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def mallinfo2() -> dict[str, int] | None:
    """glibc's counters summed over all arenas (``malloc/malloc.c`` ``__libc_mallinfo2``), or None
    when the process does not allocate through glibc (another allocator preloaded)."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    mi = fn()
    return {name: int(getattr(mi, name)) for name, _ in _Mallinfo2._fields_}


def other_allocator_stats(path: str) -> dict[str, int] | None:
    """In-use and resident bytes of a preloaded tcmalloc or jemalloc, from its own statistics
    (tcmalloc: ``MallocExtension_GetNumericProperty``; jemalloc: ``mallctl`` after an
    ``epoch`` refresh)."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    name = os.path.basename(path)
    out: dict[str, int] = {}
    if "tcmalloc" in name:
        fn = lib.MallocExtension_GetNumericProperty
        fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
        for key, prop in (("in_use", b"generic.current_allocated_bytes"), ("heap", b"generic.heap_size"),
                          ("free", b"tcmalloc.pageheap_free_bytes"), ("unmapped", b"tcmalloc.pageheap_unmapped_bytes")):
            v = ctypes.c_size_t()
            if fn(prop, ctypes.byref(v)):
                out[key] = v.value
        if "heap" in out:
            out["resident"] = out["heap"] - out.get("unmapped", 0)
    elif "jemalloc" in name:
        fn = lib.mallctl
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t]
        epoch = ctypes.c_uint64(1)
        size = ctypes.c_size_t(8)
        fn(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), 8)
        for key, prop in (("in_use", b"stats.allocated"), ("active", b"stats.active"), ("resident", b"stats.resident"),
                          ("mapped", b"stats.mapped"), ("metadata", b"stats.metadata")):
            v = ctypes.c_size_t()
            size = ctypes.c_size_t(ctypes.sizeof(v))
            if fn(prop, ctypes.byref(v), ctypes.byref(size), None, 0) == 0:
                out[key] = v.value
    return out or None


def glibc_arena_heaps(maps: list[Mapping]) -> list[Mapping]:
    """Mappings that are glibc malloc heaps: ``[heap]`` (the main arena) and the non-main arenas'
    heaps — anonymous, HEAP_MAX-aligned, whose ``heap_info.size`` (third word) equals the
    read-write length of the mapping."""
    out = []
    for m in maps:
        if m.path == "[heap]":
            out.append(m)
        elif not m.path and m.perms.startswith("rw") and m.start % HEAP_MAX == 0 and m.size <= HEAP_MAX:
            try:
                size = ctypes.c_size_t.from_address(m.start + 16).value  # ar_ptr, prev, size
            except (ValueError, OSError):
                continue
            if size == m.size:
                out.append(m)
    return out


def allocator_preloaded(maps: list[Mapping]) -> str | None:
    """The replacement allocator mapped into this process (tcmalloc / jemalloc / mimalloc), if any."""
    for m in maps:
        name = os.path.basename(m.path)
        for alloc in ("tcmalloc", "jemalloc", "mimalloc"):
            if name.startswith(f"lib{alloc}"):
                return m.path
    return None


def malloc_in_use(preloaded: str | None) -> int | None:
    """Bytes the allocator has handed out and not had back: the preloaded one's, or glibc's."""
    if preloaded:
        st = other_allocator_stats(preloaded) or {}
        return st.get("in_use")
    mi = mallinfo2()
    return None if mi is None else mi["uordblks"] + mi["hblkhd"]
