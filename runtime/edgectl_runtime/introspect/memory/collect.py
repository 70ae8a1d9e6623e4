"""The attribution of this process, now: every part read from its own source, then summed."""

from __future__ import annotations

import os
from typing import Any

from edgectl_runtime.introspect.memory.attribution import attribute
from edgectl_runtime.introspect.memory.malloc import (
    allocator_preloaded,
    glibc_arena_heaps,
    mallinfo2,
    other_allocator_stats,
)
from edgectl_runtime.introspect.memory.proc import (
    Pagemap,
    read_smaps,
    thread_stack_pointers,
)
from edgectl_runtime.introspect.memory.process import process_settings
from edgectl_runtime.introspect.memory.python_heap import (
    pymalloc_stats,
    python_heap_by_package,
)
from edgectl_runtime.introspect.memory.tensors import tensor_ranges
from edgectl_runtime.introspect.memory.tokenizers import tokenizer_facts


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
