"""Where the worker's resident memory goes: an attribution of its PSS that adds up.

Runs inside the worker (``GET /edgectl/memory``), because most of the parts can only be read
from inside: the allocator's own counters, Python's object allocator, the engine's tensors.
Every part comes from its own source, and the parts are then summed and compared with the
PSS the kernel reports for the same moment; what no source explains is shown as its own line
("not attributed"), never folded into another.

Sources, by part:

- **file-backed mappings** (``/proc/self/smaps``): shared libraries and other mapped files,
  grouped by the package that ships them (``site-packages/torch/...`` → torch, ``*.libs`` →
  its package), the interpreter, system libraries, the checkpoint. A library's writable data
  (relocations, ``.data``/``.bss``) is anonymous memory inside a file mapping: counted with
  its package, shown apart.
- **tensors** (the engine's own model and runner, read where they live; resident pages
  counted in ``/proc/self/pagemap``, each page once): weights (parameters and buffers), the
  KV cache, the RoPE table(s), and every other tensor Python can reach (the runner's input
  buffers, sampler state).
- **thread stacks**: the mapping that holds each thread's stack pointer
  (``/proc/self/task/TID/syscall``; the calling thread through ``pthread_getattr_np``).
- **malloc** (glibc ``mallinfo2()``, all arenas): bytes in use (``uordblks`` + ``hblkhd``)
  less the tensors found inside them = native allocations of every library plus Python
  objects larger than 512 bytes; and the free memory the arenas still hold resident (arena
  mappings identified in smaps — ``[heap]`` and the 64 MiB-aligned heaps of the other arenas,
  confirmed by their ``heap_info`` header — minus what is in use in them).
- **Python's object allocator** (``sys._debugmallocstats()``): pymalloc's arenas (objects of
  512 bytes or less), in use and free.
- **Python heap by package** (only when the worker runs under ``PYTHONTRACEMALLOC``, which
  traces every Python allocation from the interpreter's start at a cost in memory and
  speed): live Python allocations grouped by the package whose code made them.

The result is plain data (``edgectl.memory/1``, ``edgectl/contract/memory.py``, which also
prints it). The control plane fetches it: ``edgectl status --memory``.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import sysconfig
import threading
from dataclasses import dataclass
from typing import Any

from edgectl.contract.memory import SCHEMA, render_text  # noqa: F401  (the schema and its text view)

PAGE = os.sysconf("SC_PAGE_SIZE")
HEAP_MAX = 64 << 20  # glibc: HEAP_MAX_SIZE = 2 * DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (malloc/arena.c)


# -- /proc/self/smaps ---------------------------------------------------------------------------


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


# -- file-backed mappings by package --------------------------------------------------------------


def _site_dirs() -> list[str]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return sorted((d.rstrip("/") + "/" for d in dirs), key=len, reverse=True)


def package_of(path: str, site_dirs: list[str], model_dir: str | None = None) -> str:
    """The group a mapped file is counted under."""
    if model_dir and path.startswith(model_dir.rstrip("/") + "/"):
        return "checkpoint (mapped)"
    if path.endswith(" (deleted)"):
        path = path[: -len(" (deleted)")]
    for site in site_dirs:
        if path.startswith(site):
            top = path[len(site):].split("/", 1)[0]
            top = re.sub(r"\.libs$", "", top)  # auditwheel's vendored libraries
            top = re.sub(r"(-[0-9][^/]*)?\.(dist|egg)-info$", "", top)
            if top.endswith((".so", ".py")):
                top = top.split(".", 1)[0]  # a top-level extension module: its own name
            return top or "site-packages"
    real = os.path.realpath(sys.executable)
    if path in (real, sys.executable) or re.search(r"/libpython3[^/]*\.so", path):
        return "python interpreter"
    stdlib = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
    if path.startswith(stdlib):
        return "python stdlib"
    if path.startswith(("/usr/lib/", "/lib/", "/lib64/", "/usr/lib64/", "/usr/local/lib/")):
        return "system libraries"
    return "other files"


# -- pagemap: resident pages of address ranges -----------------------------------------------------


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


# -- thread stacks ------------------------------------------------------------------------------


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


# -- glibc malloc ------------------------------------------------------------------------------


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


# -- pymalloc ---------------------------------------------------------------------------------


def pymalloc_stats() -> dict[str, int] | None:
    """pymalloc's arenas, from ``sys._debugmallocstats()`` (which writes to the C stderr)."""
    import tempfile

    try:
        with tempfile.TemporaryFile(mode="w+b") as tmp:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(tmp.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
    except (OSError, AttributeError):
        return None
    out: dict[str, int] = {}
    for key, pattern in {
        "arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
        "arena_bytes": r"arenas \* (\d+) bytes/arena",
        "allocated_block_bytes": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
        "available_block_bytes": r"# bytes in available blocks\s*=\s*([\d,]+)",
        "unused_pools": r"(\d+) unused pools",
        "total_bytes": r"^Total\s*=\s*([\d,]+)",
    }.items():
        m = re.search(pattern, text, re.M)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out if "total_bytes" in out else None


# -- tensors ---------------------------------------------------------------------------------------


def _all_gc_objects() -> list:
    """Every object the garbage collector tracks, including the frozen ones: vLLM freezes the
    heap after start-up (``vllm/v1/engine/core.py:253`` ``freeze_gc_heap``), and
    ``gc.get_objects()`` leaves the permanent generation out."""
    import gc

    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    try:
        return gc.get_objects()
    finally:
        if frozen:
            gc.freeze()


def tensor_ranges(model=None, kv_caches=None) -> dict[str, list[tuple[int, int]]]:
    """Address ranges of the tensors this process holds, by role (unique storages).

    ``model``: the engine's model (parameters and buffers → weights; ``cos_sin_cache`` buffers
    → rope); ``kv_caches``: the runner's KV tensors (their storages are the allocated KV
    buffers). Every other tensor reachable from Python → ``other tensors``."""
    import gc

    import torch

    seen: set[int] = set()
    out: dict[str, list[tuple[int, int]]] = {"KV cache": [], "weights": [], "RoPE": [], "other tensors": []}

    def add(role: str, t) -> None:
        if not isinstance(t, torch.Tensor) or t.is_meta or t.device.type != "cpu":
            return
        try:  # a compiled graph keeps fake tensors whose storage refuses data_ptr(): they hold no memory
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return
        if not ptr or not nbytes or ptr in seen:
            return
        seen.add(ptr)
        out[role].append((ptr, ptr + nbytes))

    def visit(role: str, obj) -> None:
        if isinstance(obj, (list, tuple)):
            for x in obj:
                visit(role, x)
        elif isinstance(obj, dict):
            for x in obj.values():
                visit(role, x)
        else:
            add(role, obj)

    visit("KV cache", kv_caches)
    if model is not None:
        for name, buf in model.named_buffers():
            add("RoPE" if name.endswith("cos_sin_cache") else "weights", buf)
        for p in model.parameters():
            add("weights", p)
    import warnings

    with warnings.catch_warnings():  # isinstance() on deprecated torch aliases warns
        warnings.simplefilter("ignore")
        for obj in _all_gc_objects():
            if issubclass(type(obj), torch.Tensor):  # type(): no __class__ lookup on lazy proxies
                add("other tensors", obj)
    return out


# -- the attribution -----------------------------------------------------------------------------


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f}"


def attribute(maps: list[Mapping], *, tensors: dict[str, list[tuple[int, int]]] | None = None,
              pagemap: Pagemap | None = None, stacks: list[dict[str, Any]] | None = None,
              mallinfo: dict[str, int] | None = None, pymalloc: dict[str, int] | None = None,
              arena_heaps: list[Mapping] | None = None, model_dir: str | None = None,
              site_dirs: list[str] | None = None, extra: dict[str, Any] | None = None,
              other_alloc: tuple[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """The attribution (``edgectl.memory/1``) from the parts read above. Pure given its inputs
    except for ``pagemap`` reads, so tests can hand in recorded smaps."""
    site_dirs = site_dirs if site_dirs is not None else _site_dirs()
    total_pss = sum(m.pss for m in maps)
    total_anon = sum(m.anonymous for m in maps)
    rows: list[dict[str, Any]] = []

    # 1. file-backed mappings by package: the file pages, and the private (anonymous) pages in them
    files: dict[str, dict[str, int]] = {}
    for m in maps:
        if not m.file_backed:
            continue
        g = files.setdefault(package_of(m.path, site_dirs, model_dir), {"file": 0, "anon": 0})
        g["file"] += m.pss_file
        g["anon"] += m.anonymous
    for name, g in sorted(files.items(), key=lambda kv: -(kv[1]["file"] + kv[1]["anon"])):
        rows.append({"group": "libraries and mapped files", "part": name, "bytes": g["file"] + g["anon"],
                     "file_bytes": g["file"], "anon_bytes": g["anon"], "source": "smaps"})

    anon_maps = [m for m in maps if not m.file_backed]

    def containing(addr: int) -> Mapping | None:
        for m in anon_maps:
            if m.start <= addr < m.end:
                return m
        return None

    # 2. thread stacks
    stack_maps: dict[int, tuple[Mapping, list[str]]] = {}
    for s in stacks or []:
        m = containing(s["sp"])
        if m is not None:
            stack_maps.setdefault(m.start, (m, []))[1].append(s["name"])
    stack_bytes = sum(m.pss for m, _ in stack_maps.values())
    names: dict[str, int] = {}
    for _, threads in stack_maps.values():
        for n in threads:
            names[n] = names.get(n, 0) + 1
    rows.append({"group": "threads", "part": f"thread stacks ({sum(names.values())} threads)", "bytes": stack_bytes,
                 "threads": dict(sorted(names.items())), "source": "smaps (mapping holding each stack pointer)"})

    # 3. tensors, resident pages each counted once; and where they live
    heap_like = [m for m in anon_maps if m.start not in stack_maps and not m.path.startswith("[v")]
    tensor_total = 0
    tensor_in: dict[int, int] = {}  # mapping start -> tensor bytes in it
    if tensors and pagemap is not None:
        claimed: set[int] = set()
        for role in ("KV cache", "weights", "RoPE", "other tensors"):
            count = 0
            for lo, hi in tensors.get(role, []):
                pages = [p for p in pagemap.resident_pages(lo, hi) if p not in claimed]
                claimed.update(pages)
                # the bytes of the range on its resident pages (a storage rarely starts on a page)
                nbytes = sum(min(hi, (p + 1) * PAGE) - max(lo, p * PAGE) for p in pages)
                count += nbytes
                m = containing(lo)
                if m is not None:
                    tensor_in[m.start] = tensor_in.get(m.start, 0) + nbytes
            n = len(tensors.get(role, []))
            rows.append({"group": "tensors", "part": role, "bytes": count, "storages": n,
                         "source": "engine tensors, resident pages in /proc/self/pagemap"})
            tensor_total += count

    # 4. the allocators
    anon_rest = sum(m.pss for m in heap_like)
    if other_alloc is not None:
        name, st = other_alloc
        rows.append({"group": f"malloc ({name})", "part": "in use: native allocations and Python objects > 512 B",
                     "bytes": max(0, st.get("in_use", 0) - tensor_total), "source": f"{name} statistics, less the tensors"})
        rows.append({"group": f"malloc ({name})", "part": "free or metadata, still resident",
                     "bytes": max(0, st.get("resident", 0) - st.get("in_use", 0)), "source": f"{name} statistics"})
        extra_info = {"allocator_stats": st}
    elif mallinfo is not None:
        heaps = arena_heaps if arena_heaps is not None else []
        heap_starts = {m.start for m in heaps}
        heap_rss = sum(m.pss for m in heaps)
        tensors_in_heaps = sum(v for k, v in tensor_in.items() if k in heap_starts)
        tensors_elsewhere = tensor_total - tensors_in_heaps
        in_use = mallinfo["uordblks"] + mallinfo["hblkhd"]
        rows.append({"group": "malloc (glibc)", "part": "in use: native allocations and Python objects > 512 B",
                     "bytes": max(0, in_use - tensor_total),
                     "source": "mallinfo2 uordblks + hblkhd, less the tensors"})
        # uordblks counts what is in use in the arenas, tensors included
        rows.append({"group": "malloc (glibc)", "part": f"free, still resident in {len(heaps)} arena heap(s)",
                     "bytes": max(0, heap_rss - mallinfo["uordblks"]),
                     "free_bytes": mallinfo["fordblks"],
                     "source": "smaps of [heap] and arena heaps, less mallinfo2 uordblks"})
        extra_info = {"mallinfo2": mallinfo, "arena_heaps": len(heaps), "arena_heaps_pss": heap_rss,
                      "tensors_in_arena_heaps": tensors_in_heaps, "tensors_in_mmapped_chunks": tensors_elsewhere}
    else:
        extra_info = {"mallinfo2": None}
    if pymalloc is not None:
        rows.append({"group": "Python objects", "part": "pymalloc arenas (objects of 512 B or less)",
                     "bytes": pymalloc["total_bytes"], "in_use_bytes": pymalloc.get("allocated_block_bytes"),
                     "source": "sys._debugmallocstats"})

    attributed = sum(r["bytes"] for r in rows)
    rows.append({"group": "not attributed", "part": "measured PSS minus every part above", "bytes": total_pss - attributed,
                 "source": "difference"})
    out = {
        "schema": SCHEMA,
        "pid": os.getpid(),
        "pss_bytes": total_pss,
        "anon_bytes": total_anon,
        "file_bytes": total_pss - total_anon,
        # file pages also mapped by other processes are charged only in part to this one's PSS
        "file_rss_bytes": sum(max(0, m.rss - m.anonymous) for m in maps if m.file_backed),
        "attributed_bytes": attributed,
        "unattributed_fraction": (total_pss - attributed) / total_pss if total_pss else None,
        "rows": rows,
        "anon_outside_libraries_bytes": anon_rest,
        "details": {**extra_info, "pymalloc": pymalloc, **(extra or {})},
    }
    return out


def _malloc_in_use(preloaded: str | None) -> int | None:
    if preloaded:
        st = other_allocator_stats(preloaded) or {}
        return st.get("in_use")
    mi = mallinfo2()
    return None if mi is None else mi["uordblks"] + mi["hblkhd"]


def tokenizer_facts(model_dir: str | None, preloaded: str | None) -> dict[str, Any]:
    """How many tokenizer objects this process holds, and what one costs: a second copy of the
    backend is loaded from the model's ``tokenizer.json`` and the allocator's in-use bytes
    compared (after the PSS was read, so the copy is not in the figures above)."""
    import gc
    import warnings

    base = getattr(sys.modules.get("transformers.tokenization_utils_base"), "PreTrainedTokenizerBase", None)
    if base is None:
        return {"instances": 0, "python_wrappers": 0}
    inner_by_id: dict[int, Any] = {}
    wrappers = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in _all_gc_objects():
            if not issubclass(type(obj), base):
                continue
            wrappers += 1
            try:  # the instance dict only: getattr could run arbitrary __getattr__ code
                inner = object.__getattribute__(obj, "__dict__").get("_tokenizer")
            except (AttributeError, TypeError):
                inner = None
            if inner is not None:
                inner_by_id[id(inner)] = inner
    backends = sorted({f"{type(i).__module__}.{type(i).__name__}" for i in inner_by_id.values()})
    out: dict[str, Any] = {"instances": len(inner_by_id), "python_wrappers": wrappers, "backends": backends}
    path = os.path.join(model_dir, "tokenizer.json") if model_dir else None
    loader = next((type(i) for i in inner_by_id.values() if hasattr(type(i), "from_file")), None)
    if path and os.path.exists(path) and loader is not None:
        gc.collect()
        before = _malloc_in_use(preloaded)
        tok = loader.from_file(path)
        after = _malloc_in_use(preloaded)
        del tok
        if before is not None and after is not None:
            out["bytes_per_instance"] = after - before
    return out


def python_heap_by_package(site_dirs: list[str] | None = None, top: int = 20) -> dict[str, Any] | None:
    """Live Python allocations grouped by the package whose code made them — only when the worker
    runs under ``PYTHONTRACEMALLOC`` (tracing from the interpreter's start, at a cost in memory
    and speed). Code objects and module dicts built while a module is imported are allocated by
    the import machinery: they form their own group ("import machinery")."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return None
    site_dirs = site_dirs if site_dirs is not None else _site_dirs()
    snap = tracemalloc.take_snapshot()
    groups: dict[str, int] = {}
    for stat in snap.statistics("filename"):
        fname = stat.traceback[0].filename
        if fname.startswith("<frozen importlib") or "/importlib/" in fname:
            key = "import machinery (code objects, module namespaces)"
        elif fname.startswith("<"):
            key = fname
        else:
            key = package_of(fname, site_dirs)
        groups[key] = groups.get(key, 0) + stat.size
    traced, peak = tracemalloc.get_traced_memory()
    return {"traced_bytes": traced, "tracemalloc_overhead_bytes": tracemalloc.get_tracemalloc_memory(),
            "frames": tracemalloc.get_traceback_limit(),
            "by_package": dict(sorted(groups.items(), key=lambda kv: -kv[1])[:top])}


def process_settings() -> dict[str, Any]:
    """The memory-relevant settings this process runs with, read inside it (for the read-back)."""
    from edgectl_runtime.vllm_plugin.lean import optional_imports_state

    return {"python_optimize": sys.flags.optimize, "optional_imports": optional_imports_state(),
            "environ": {k: os.environ.get(k) for k in ("LD_PRELOAD", "MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_",
                                                       "PYTHONOPTIMIZE", "OMP_NUM_THREADS")},
            "threads": threading.active_count(), "modules": len(sys.modules),
            "modules_by_package": _modules_by_package()}


def _modules_by_package(top: int = 25) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in list(sys.modules):
        root = name.split(".", 1)[0]
        counts[root] = counts.get(root, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:top])


def collect(model=None, kv_caches=None, model_dir: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The attribution of this process, now.

    The kernel's and the allocators' figures are read first, the object walks (tensors,
    tokenizers) after: a walk over every Python object allocates a list of them, which must not
    be in the figures it explains. Tensor addresses do not move in between."""
    stacks, unlocated = thread_stack_pointers()
    maps = read_smaps()
    preloaded = allocator_preloaded(maps)
    other = None
    if preloaded:
        st = other_allocator_stats(preloaded)
        other = (os.path.basename(preloaded).split(".")[0].removeprefix("lib"), st) if st else None
    mi = mallinfo2()
    py = pymalloc_stats()
    tensors = tensor_ranges(model, kv_caches) if (model is not None or kv_caches is not None) else None
    pm = Pagemap()
    try:
        result = attribute(maps, tensors=tensors, pagemap=pm, stacks=stacks, mallinfo=mi, pymalloc=py,
                           arena_heaps=glibc_arena_heaps(maps), model_dir=model_dir, other_alloc=other,
                           extra={"threads_not_located": unlocated, "allocator": allocator_preloaded(maps) or "glibc",
                                  "process": process_settings(), **(extra or {})})
    finally:
        pm.close()
    result["details"]["python_heap"] = python_heap_by_package()
    tok = tokenizer_facts(model_dir, preloaded)
    result["details"]["tokenizer"] = tok
    if tok.get("instances") and tok.get("bytes_per_instance"):
        result["of_which"] = result.get("of_which", []) + [{
            "part": f"tokenizer ({tok['instances']} instance(s), each measured by loading a copy)",
            "bytes": tok["instances"] * tok["bytes_per_instance"], "within": "malloc in use"}]
    return result


def collect_in_worker(worker, model_dir: str | None = None) -> dict[str, Any]:
    """``collect`` for a vLLM worker (sent with ``collective_rpc``): its model and KV cache."""
    from edgectl_runtime.vllm_plugin.embedding import packed_copies

    runner = worker.model_runner
    result = collect(model=runner.model, kv_caches=getattr(runner, "kv_caches", None), model_dir=model_dir)
    packed = packed_copies(runner.model)
    result["details"]["embedding_pack"] = packed
    copies = [p for p in packed if p["state"] == "packed"]
    if copies:
        result["of_which"] = result.get("of_which", []) + [{
            "part": f"prepacked GEMM copies of embedding tables ({', '.join(p['name'] for p in copies)})",
            "bytes": sum(p["bytes"] for p in copies), "within": "malloc in use"}]
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m edgectl_runtime.introspect.memory URL``: fetch a worker's attribution and print it."""
    import argparse
    import json
    import urllib.request

    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.introspect.memory", description=main.__doc__)
    parser.add_argument("url", help="the worker's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    from edgectl.contract.worker import MEMORY_ROUTE

    with urllib.request.urlopen(ns.url.rstrip("/") + MEMORY_ROUTE, timeout=120) as r:
        att = json.loads(r.read())
    print(json.dumps(att, indent=1) if ns.json else render_text(att))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
