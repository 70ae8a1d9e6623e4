"""The walk over the tensors this process holds: their address ranges, by role."""

from __future__ import annotations


def all_gc_objects() -> list:
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
        for obj in all_gc_objects():
            if issubclass(type(obj), torch.Tensor):  # type(): no __class__ lookup on lazy proxies
                add("other tensors", obj)
    return out
