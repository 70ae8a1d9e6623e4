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

The modules, one job each: ``proc`` (the ``/proc/self`` readers: smaps, pagemap, thread
stacks), ``mapped_files`` (which package a mapped file belongs to), ``malloc`` (glibc's and a
preloaded allocator's counters, glibc's arena heaps), ``python_heap`` (pymalloc's arenas,
tracemalloc by package), ``tensors`` (the walk over the engine's tensors), ``tokenizers`` and
``process`` (what else the read-back reports), ``attribution`` (the parts summed, pure given
them), ``collect`` (all of it read from this process, now), ``__main__`` (the command line).

The result is plain data (``edgectl.memory/1``, ``edgectl/contract/memory.py``, which also
prints it). The control plane fetches it: ``edgectl status --memory``.
"""

from edgectl.contract.memory import SCHEMA, render_text  # noqa: F401  (the schema and its text view)
from edgectl_runtime.introspect.memory.attribution import attribute  # noqa: F401
from edgectl_runtime.introspect.memory.collect import collect, collect_in_worker  # noqa: F401
from edgectl_runtime.introspect.memory.mapped_files import package_of  # noqa: F401
from edgectl_runtime.introspect.memory.proc import (  # noqa: F401
    Mapping,
    Pagemap,
    parse_smaps,
    read_smaps,
)
