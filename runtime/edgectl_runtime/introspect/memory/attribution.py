"""The attribution (``edgectl.memory/1``) from the parts read elsewhere: each part its rows, the
rows summed and compared with the measured PSS, what no source explains shown as its own line.
Pure given its inputs except for ``pagemap`` reads, so tests can hand in recorded smaps."""

from __future__ import annotations

import os
from typing import Any

from edgectl.contract.memory import SCHEMA
from edgectl_runtime.introspect.memory.mapped_files import (
    installed_site_dirs,
    package_of,
)
from edgectl_runtime.introspect.memory.proc import PAGE, Mapping, Pagemap

TENSOR_ROLES = ("KV cache", "weights", "RoPE", "other tensors")  # the order pages are claimed in


def attribute(maps: list[Mapping], *, tensors: dict[str, list[tuple[int, int]]] | None = None,
              pagemap: Pagemap | None = None, stacks: list[dict[str, Any]] | None = None,
              mallinfo: dict[str, int] | None = None, pymalloc: dict[str, int] | None = None,
              arena_heaps: list[Mapping] | None = None, model_dir: str | None = None,
              site_dirs: list[str] | None = None, extra: dict[str, Any] | None = None,
              other_alloc: tuple[str, dict[str, int]] | None = None) -> dict[str, Any]:
    """The attribution (``edgectl.memory/1``) from the parts read above. Pure given its inputs
    except for ``pagemap`` reads, so tests can hand in recorded smaps."""
    site_dirs = site_dirs if site_dirs is not None else installed_site_dirs()
    total_pss = sum(m.pss for m in maps)
    total_anon = sum(m.anonymous for m in maps)
    rows = _library_rows(maps, site_dirs, model_dir)
    anon_maps = [m for m in maps if not m.file_backed]
    stack_row, stack_maps = _stack_row(anon_maps, stacks or [])
    rows.append(stack_row)
    heap_like = [m for m in anon_maps if m.start not in stack_maps and not m.path.startswith("[v")]
    tensor_total = 0
    tensor_in: dict[int, int] = {}  # mapping start -> tensor bytes in it
    if tensors and pagemap is not None:
        tensor_rows, tensor_in = _tensor_rows(anon_maps, tensors, pagemap)
        rows += tensor_rows
        tensor_total = sum(r["bytes"] for r in tensor_rows)
    if other_alloc is not None:
        allocator_rows, extra_info = _other_allocator_rows(*other_alloc, tensor_total)
    elif mallinfo is not None:
        allocator_rows, extra_info = _glibc_rows(mallinfo, arena_heaps or [], tensor_total, tensor_in)
    else:
        allocator_rows, extra_info = [], {"mallinfo2": None}
    rows += allocator_rows
    if pymalloc is not None:
        rows.append({"group": "Python objects", "part": "pymalloc arenas (objects of 512 B or less)",
                     "bytes": pymalloc["total_bytes"], "in_use_bytes": pymalloc.get("allocated_block_bytes"),
                     "source": "sys._debugmallocstats"})
    attributed = sum(r["bytes"] for r in rows)
    rows.append({"group": "not attributed", "part": "measured PSS minus every part above", "bytes": total_pss - attributed,
                 "source": "difference"})
    return {
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
        "anon_outside_libraries_bytes": sum(m.pss for m in heap_like),
        "details": {**extra_info, "pymalloc": pymalloc, **(extra or {})},
    }


def _library_rows(maps: list[Mapping], site_dirs: list[str], model_dir: str | None) -> list[dict[str, Any]]:
    """File-backed mappings by package: the file pages, and the private (anonymous) pages in them."""
    files: dict[str, dict[str, int]] = {}
    for m in maps:
        if not m.file_backed:
            continue
        g = files.setdefault(package_of(m.path, site_dirs, model_dir), {"file": 0, "anon": 0})
        g["file"] += m.pss_file
        g["anon"] += m.anonymous
    return [{"group": "libraries and mapped files", "part": name, "bytes": g["file"] + g["anon"],
             "file_bytes": g["file"], "anon_bytes": g["anon"], "source": "smaps"}
            for name, g in sorted(files.items(), key=lambda kv: -(kv[1]["file"] + kv[1]["anon"]))]


def _containing(anon_maps: list[Mapping], addr: int) -> Mapping | None:
    for m in anon_maps:
        if m.start <= addr < m.end:
            return m
    return None


def _stack_row(anon_maps: list[Mapping], stacks: list[dict[str, Any]]
               ) -> tuple[dict[str, Any], dict[int, tuple[Mapping, list[str]]]]:
    """The thread stacks: the mappings holding each thread's stack pointer, and those mappings by start."""
    stack_maps: dict[int, tuple[Mapping, list[str]]] = {}
    for s in stacks:
        m = _containing(anon_maps, s["sp"])
        if m is not None:
            stack_maps.setdefault(m.start, (m, []))[1].append(s["name"])
    stack_bytes = sum(m.pss for m, _ in stack_maps.values())
    names: dict[str, int] = {}
    for _, threads in stack_maps.values():
        for n in threads:
            names[n] = names.get(n, 0) + 1
    row = {"group": "threads", "part": f"thread stacks ({sum(names.values())} threads)", "bytes": stack_bytes,
           "threads": dict(sorted(names.items())), "source": "smaps (mapping holding each stack pointer)"}
    return row, stack_maps


def _tensor_rows(anon_maps: list[Mapping], tensors: dict[str, list[tuple[int, int]]], pagemap: Pagemap
                 ) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The tensors by role, resident pages each counted once; and the tensor bytes in each
    anonymous mapping (by its start)."""
    rows: list[dict[str, Any]] = []
    tensor_in: dict[int, int] = {}
    claimed: set[int] = set()
    for role in TENSOR_ROLES:
        count = 0
        for lo, hi in tensors.get(role, []):
            pages = [p for p in pagemap.resident_pages(lo, hi) if p not in claimed]
            claimed.update(pages)
            # the bytes of the range on its resident pages (a storage rarely starts on a page)
            nbytes = sum(min(hi, (p + 1) * PAGE) - max(lo, p * PAGE) for p in pages)
            count += nbytes
            m = _containing(anon_maps, lo)
            if m is not None:
                tensor_in[m.start] = tensor_in.get(m.start, 0) + nbytes
        rows.append({"group": "tensors", "part": role, "bytes": count, "storages": len(tensors.get(role, [])),
                     "source": "engine tensors, resident pages in /proc/self/pagemap"})
    return rows, tensor_in


def _other_allocator_rows(name: str, st: dict[str, int], tensor_total: int
                          ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A preloaded allocator's in-use and resident-but-free bytes, from its own statistics."""
    rows = [{"group": f"malloc ({name})", "part": "in use: native allocations and Python objects > 512 B",
             "bytes": max(0, st.get("in_use", 0) - tensor_total), "source": f"{name} statistics, less the tensors"},
            {"group": f"malloc ({name})", "part": "free or metadata, still resident",
             "bytes": max(0, st.get("resident", 0) - st.get("in_use", 0)), "source": f"{name} statistics"}]
    return rows, {"allocator_stats": st}


def _glibc_rows(mallinfo: dict[str, int], heaps: list[Mapping], tensor_total: int, tensor_in: dict[int, int]
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """glibc's bytes in use (less the tensors inside them) and the free memory its arena heaps
    still hold resident."""
    heap_starts = {m.start for m in heaps}
    heap_rss = sum(m.pss for m in heaps)
    tensors_in_heaps = sum(v for k, v in tensor_in.items() if k in heap_starts)
    in_use = mallinfo["uordblks"] + mallinfo["hblkhd"]
    rows = [{"group": "malloc (glibc)", "part": "in use: native allocations and Python objects > 512 B",
             "bytes": max(0, in_use - tensor_total),
             "source": "mallinfo2 uordblks + hblkhd, less the tensors"},
            # uordblks counts what is in use in the arenas, tensors included
            {"group": "malloc (glibc)", "part": f"free, still resident in {len(heaps)} arena heap(s)",
             "bytes": max(0, heap_rss - mallinfo["uordblks"]),
             "free_bytes": mallinfo["fordblks"],
             "source": "smaps of [heap] and arena heaps, less mallinfo2 uordblks"}]
    details = {"mallinfo2": mallinfo, "arena_heaps": len(heaps), "arena_heaps_pss": heap_rss,
               "tensors_in_arena_heaps": tensors_in_heaps, "tensors_in_mmapped_chunks": tensor_total - tensors_in_heaps}
    return rows, details
