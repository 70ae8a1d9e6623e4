"""Reading the effective settings inside the process that holds the model.

``collect_worker_facts`` is sent to the model worker with ``collective_rpc`` (in the
single-process topology that is this process; otherwise vLLM's worker process), so what
it reports is what the forward pass really uses, not what a config object says.
"""

from __future__ import annotations

import os
from typing import Any


def _unique_storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}

    def visit(t) -> None:
        if t is None:
            return
        if isinstance(t, (list, tuple)):
            for x in t:
                visit(x)
            return
        if isinstance(t, dict):
            for x in t.values():
                visit(x)
            return
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()

    visit(tensors)
    return sum(seen.values())


def collect_worker_facts(worker) -> dict[str, Any]:
    """Runs in the worker: KV bytes allocated, RoPE rows, linear formats, threads."""
    import torch

    from edgectl_runtime.readback import describe_model

    runner = worker.model_runner
    model = runner.model
    kv = getattr(runner, "kv_caches", None)
    described = describe_model(model)
    formats: dict[str, str] = {}
    lm_head = None
    for entry in described.get("layers", []):
        if entry.get("kind") == "lm_head":
            lm_head = entry["format"]
            formats["lm_head"] = entry["format"]
        elif entry.get("kind") == "linear":
            formats[entry["name"]] = entry["format"]
    return {
        "worker_pid": os.getpid(),
        "kv_cache_bytes": _unique_storage_bytes(kv) if kv is not None else None,
        "rope_rows": {r["name"]: r["rows"] for r in described.get("rope", [])},
        "linear_formats": formats,
        "linear_format_counts": described.get("formats", {}),
        "lm_head_format": lm_head,
        "resident": described.get("resident"),
        "quantization_readback": described.get("quantization"),
        "levers": described.get("levers"),
        "kernel": described.get("kernel"),
        "threads": torch.get_num_threads(),
        "omp_cpus": sorted(os.sched_getaffinity(0)),
    }


def process_tree_facts(pid: int) -> dict[str, Any]:
    """How many processes serve (the server and every descendant)."""
    import psutil

    me = psutil.Process(pid)
    children = me.children(recursive=True)
    return {"server_pid": pid, "processes": 1 + len(children),
            "process_names": [me.name()] + [c.name() for c in children]}
