"""What the loaded model actually holds, read from the live modules inside the engine.

:func:`collect_worker_facts` gathers the effective settings (``edgectl.effective/1``) that the
worker checks against its plan (``edgectl/contract/effective.py``); it builds on
:func:`describe_model`, which answers "did the settings take effect": the format of every linear layer
(including the LM head), the rows of every RoPE table, and the resident bytes of parameters and
buffers by dtype. It runs where the model lives, the vLLM worker process:

- ``LLM(..., worker_extension_cls="edgectl_runtime.service.readback.ReadbackExtension")`` then
  ``llm.collective_rpc("edgectl_describe")`` (one dict per worker); or
- ``describe_model(model)`` directly where the model is in-process.

Output (``edgectl.readback/1``)::

    {"schema": "edgectl.readback/1",
     "quantization": {"method": "cpu_int4", "kernel": "torch", "group_size": 128, "lm_head": "dense", ...} | null,
     "levers": {"EDGECTL_ROPE_CAP": "1", ...},           # the worker's effective runtime env
     "layers": [{"name": "model.layers.0.self_attn.qkv_proj", "kind": "linear",
                 "format": "cpu_int4/g64", "out_features": 960, "in_features": 576,
                 "group_size": 64, "reason": "..."}, ...],
     "formats": {"cpu_int4/g64": 120, "cpu_int4/g128": 30, "bf16-tied-embedding": 1},
     # or, on edgectl's kernels: {"w4a8/b32": 120, "w8a8/b32-tied-embedding": 1, "w8a8/b32": 1}
     # (layers also carry "kernel": torch | vllm | edgectl and "bits")
     "rope": [{"name": "...rotary_emb", "class": "RotaryEmbedding", "rows": 2048,
               "full_rows": 8192, "capped": true, "dtype": "bfloat16", "bytes": 262144}],
     "resident": {"by_dtype": {"uint8": ..., "bfloat16": ...}, "parameters_bytes": ...,
                  "buffers_bytes": ..., "total_bytes": ..., "outside_parameters_bytes": ...},
     "kernel": {"cpu_capability": "AVX512", "int4_block_rows": 64 | null,
                "edgectl_isa": "avx512vnni" | "avxvnni" | "avx2" | "scalar" | null, "torch_threads": 2},
     "ir_ops": {"rms_norm": ["edgectl", "native"], "fused_add_rms_norm": [...]}}

``outside_parameters_bytes`` estimates weights vLLM keeps outside the module's parameters: on
CPU a dense linear layer's weight is repacked for oneDNN and the parameter replaced by an empty
one (``layers/utils.py`` ``dispatch_cpu_unquantized_gemm``), so its bytes are counted as
``out x in x dtype size`` there.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from edgectl.contract.environment import SHORT_SPINCOUNT

SCHEMA = "edgectl.readback/1"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _short(dtype_name: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype_name, dtype_name)


def _layer_entry(name: str, module: torch.nn.Module, embed_weight: torch.Tensor | None) -> dict[str, Any] | None:
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    from edgectl_runtime.kernels.cpu_int4 import INFO_ATTR, CpuInt4LinearMethod

    if isinstance(module, ParallelLMHead):
        kind = "lm_head"
    elif isinstance(module, VocabParallelEmbedding):
        kind = "embedding"
    elif isinstance(module, LinearBase):
        kind = "linear"
    else:
        return None
    method = getattr(module, "quant_method", None)
    dtype = _dtype_name(getattr(module, "params_dtype", torch.get_default_dtype()))
    if kind == "linear":
        out_f = sum(getattr(module, "output_partition_sizes", [module.output_size]))
        in_f = getattr(module, "input_size_per_partition", module.input_size)
    else:
        out_f = module.num_embeddings_per_partition
        in_f = module.embedding_dim
    entry: dict[str, Any] = {"name": name, "kind": kind, "out_features": int(out_f), "in_features": int(in_f)}
    info = getattr(module, INFO_ATTR, None)
    if isinstance(method, CpuInt4LinearMethod):
        if method.tied_source is not None:
            src = method.tied_source.quant_method
            src_info = getattr(method.tied_source, INFO_ATTR, {})
            entry.update(format=f"{src_info.get('format', 'unknown')}-tied-embedding", group_size=src.group_size,
                         kernel=src.kernel, bits=src.bits, reason="tied to the quantized embedding")
        elif method.dense is not None:
            tied = kind == "lm_head" and embed_weight is not None and getattr(module, "weight", None) is embed_weight
            entry.update(format=f"{_short(dtype)}-tied-embedding" if tied else _short(dtype),
                         reason=(info or {}).get("reason", ""))
        elif info and "kernel" in info:
            entry.update(format=info["format"], group_size=info["group_size"], kernel=info["kernel"],
                         bits=info.get("bits", 4), reason=info.get("reason", ""))
        else:
            entry.update(format="unknown", reason=f"cpu_int4 layer in an unexpected state: {info}")
        return entry
    if method is None or type(method).__name__ in ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"):
        weight = getattr(module, "weight", None)
        tied = kind == "lm_head" and embed_weight is not None and weight is embed_weight
        entry["format"] = f"{_short(dtype)}-tied-embedding" if tied else _short(dtype)
        return entry
    entry["format"] = type(method).__name__
    return entry


def _rope_entries(model: torch.nn.Module) -> list[dict[str, Any]]:
    from edgectl_runtime.vllm_plugin.rope import INFO_ATTR as ROPE_INFO

    out = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        cache = getattr(module, "_buffers", {}).get("cos_sin_cache")
        if not isinstance(cache, torch.Tensor) or id(module) in seen:
            continue
        seen.add(id(module))
        info = getattr(module, ROPE_INFO, None) or {}
        out.append({
            "name": name,
            "class": type(module).__name__,
            "rows": int(cache.shape[0]),
            "full_rows": int(info.get("full_rows", cache.shape[0])),
            "capped": bool(info.get("capped", False)),
            "max_position_embeddings": int(getattr(module, "max_position_embeddings", 0) or 0),
            "dtype": _dtype_name(cache.dtype),
            "bytes": int(cache.numel() * cache.element_size()),
        })
    return out


def _resident(model: torch.nn.Module, layers: list[dict[str, Any]]) -> dict[str, Any]:
    by_dtype: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    totals = {"parameters_bytes": 0, "buffers_bytes": 0}

    def add(t: torch.Tensor, key: str) -> None:
        if t is None or t.is_meta:
            return
        ident = (t.untyped_storage().data_ptr(), t.storage_offset())
        if ident in seen:
            return  # tied / shared tensors count once
        seen.add(ident)
        nbytes = t.numel() * t.element_size()
        by_dtype[_dtype_name(t.dtype)] = by_dtype.get(_dtype_name(t.dtype), 0) + nbytes
        totals[key] += nbytes

    for p in model.parameters():
        add(p, "parameters_bytes")
    for b in model.buffers():
        add(b, "buffers_bytes")
    # Dense layers whose weight vLLM moved into a oneDNN handle (empty parameter left behind).
    outside = 0
    modules = dict(model.named_modules())
    for entry in layers:
        module = modules.get(entry["name"])
        weight = getattr(module, "weight", None) if module is not None else None
        if entry["format"] in ("bf16", "fp16", "fp32") and isinstance(weight, torch.Tensor) and weight.numel() == 0:
            outside += entry["out_features"] * entry["in_features"] * weight.element_size()
    return {"by_dtype": dict(sorted(by_dtype.items())), **totals,
            "total_bytes": totals["parameters_bytes"] + totals["buffers_bytes"],
            "outside_parameters_bytes": outside}


def describe_model(model: torch.nn.Module) -> dict[str, Any]:
    """The read-back of a loaded vLLM model (see the module docstring for the shape)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    from edgectl.contract import environment

    embed_weight = None
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead):
            embed_weight = getattr(module, "weight", None)
            break
    layers = []
    quant = None
    for name, module in model.named_modules():
        entry = _layer_entry(name, module, embed_weight)
        if entry is None:
            continue
        if entry["kind"] == "embedding" and "kernel" not in entry:
            continue  # a dense embedding is not a matmul; listed only when quantized
        layers.append(entry)
        cfg = getattr(getattr(module, "quant_method", None), "config", None)
        if quant is None and cfg is not None and hasattr(cfg, "describe"):
            quant = {"method": cfg.get_name(), **cfg.describe()}
    formats: dict[str, int] = {}
    for entry in layers:
        formats[entry["format"]] = formats.get(entry["format"], 0) + 1
    try:
        from edgectl_runtime.kernels.ops.tinygemm import packed_layout

        block_rows = packed_layout().block_rows
    except Exception:  # noqa: BLE001 - reported as unknown, never guessed
        block_rows = None
    from edgectl_runtime.kernels import ops

    loaded, _ = ops.available()
    edgectl_isa = ops.active_level() if loaded else None
    return {
        "schema": SCHEMA,
        "quantization": quant,
        "levers": environment.snapshot(os.environ),
        "layers": layers,
        "formats": dict(sorted(formats.items())),
        "rope": _rope_entries(model),
        "resident": _resident(model, layers),
        "kernel": {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "int4_block_rows": block_rows,
                   "edgectl_isa": edgectl_isa, "torch_threads": torch.get_num_threads()},
        "ir_ops": _ir_priorities(),
    }


def _ir_priorities() -> dict[str, list[str]]:
    """The implementation order vLLM's IR ops dispatch by in this process (vllm/ir/op.py
    ``get_priority``): e.g. whether the norms run edgectl's op (``fused_norm.py``)."""
    try:
        from vllm import ir
    except ImportError:
        return {}
    ops = {name: getattr(ir.ops, name, None) for name in ("rms_norm", "fused_add_rms_norm")}
    return {name: op.get_priority() for name, op in ops.items() if op is not None}


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


def _tensor_dtypes(tensors) -> set[str]:
    if isinstance(tensors, dict):
        tensors = list(tensors.values())
    if isinstance(tensors, (list, tuple)):
        return set().union(*(_tensor_dtypes(t) for t in tensors)) if tensors else set()
    return {_dtype_name(tensors.dtype)} if isinstance(tensors, torch.Tensor) else set()


def thread_wait() -> str:
    """How this process's OpenMP threads wait: GNU libgomp reads ``OMP_WAIT_POLICY`` from the
    environment when it loads (libgomp/env.c, ``parse_wait_policy``), before any of edgectl's code runs."""
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().upper()
    if policy in ("PASSIVE", "ACTIVE"):
        return policy.lower()  # active: spin and never sleep
    count = os.environ.get("GOMP_SPINCOUNT", "").strip()
    if count:
        return "spin-short" if count == SHORT_SPINCOUNT else f"spin-{count}"
    return "spin"


def collect_worker_facts(worker) -> dict[str, Any]:
    """The effective settings inside the model worker: KV bytes allocated, RoPE rows, linear formats, threads.

    Sent to the model worker with ``collective_rpc`` (in the single-process topology that is the
    server's own process; otherwise vLLM's worker process, through :class:`ReadbackExtension`), so
    what it reports is what the forward pass really uses, not what a config object says.
    """
    from edgectl_runtime.vllm_plugin import (
        compile_cache,
        decode_attention,
        kv_int8,
        lean_attention,
        tower_tiles,
    )

    runner = worker.model_runner
    kv = getattr(runner, "kv_caches", None)
    described = describe_model(runner.model)
    formats: dict[str, str] = {}
    in_features: dict[str, int] = {}
    lm_head = None
    for entry in described.get("layers", []):
        if entry.get("kind") == "lm_head":
            lm_head = entry["format"]
            formats["lm_head"] = entry["format"]
        elif entry.get("kind") == "linear":
            formats[entry["name"]] = entry["format"]
            in_features[entry["name"]] = entry["in_features"]
    from edgectl_runtime.vllm_plugin.embedding import packed_copies

    attention_layers = [m for m in runner.model.modules() if hasattr(getattr(m, "impl", None), "kv_cache_dtype")]
    attention = [m.impl for m in attention_layers]
    return {
        "worker_pid": os.getpid(),
        "kv_cache_bytes": _unique_storage_bytes(kv) if kv is not None else None,
        # what the attention kernels were built for, and what the KV tensors hold
        # (an attention layer whose KV is edgectl's int8 says int8: vLLM's own says fp8_e4m3, its allocation)
        "kv_cache_dtype": sorted({"int8" if kv_int8.owns(impl) else str(impl.kv_cache_dtype) for impl in attention}),
        "kv_tensor_dtypes": sorted(_tensor_dtypes(kv)) if kv is not None else [],
        # the CPU attention kernel each layer runs ("amx", "vec", "vec16", ...): vLLM picks it from
        # torch.cpu's ISA answers (vllm/v1/attention/backends/cpu_attn.py _get_attn_isa, set on the
        # layer by _set_isa_to_layers)
        "attention_isa": sorted({str(m.isa) for m in attention_layers if hasattr(m, "isa")}),
        # whose kernel the attention calls of this process took: {"kernel": edgectl | vllm, "calls": {...}}
        "decode_attention": decode_attention.counts(),
        # how a decoder layer's calls reach vLLM's attention ops: {"path": lean | vllm, "calls": {...}}
        "lean_attention": lean_attention.counts(),
        # the vision tower's batches: the lever as installed, the tower's calls and the batches they ran as
        "tower_tiles": tower_tiles.counts(),
        "embedding_pack": {p["name"]: {"state": p["state"], "lm_head": p["lm_head"]}
                           for p in packed_copies(runner.model)},
        "rope_rows": {r["name"]: r["rows"] for r in described.get("rope", [])},
        "linear_formats": formats,
        "linear_in_features": in_features,
        "linear_format_counts": described.get("formats", {}),
        "lm_head_format": lm_head,
        "resident": described.get("resident"),
        "quantization_readback": described.get("quantization"),
        "levers": described.get("levers"),
        "kernel": described.get("kernel"),
        "compile": compile_cache.facts(getattr(worker, "vllm_config", None)),
        "kernel_isa": (described.get("kernel") or {}).get("edgectl_isa"),
        "threads": torch.get_num_threads(),
        "thread_wait": thread_wait(),
        "speech_head": getattr(runner.model, "speech_head", None),
        "omp_cpus": sorted(os.sched_getaffinity(0)),
    }


def process_tree_facts(pid: int) -> dict[str, Any]:
    """How many processes serve (the server and every descendant)."""
    import psutil

    me = psutil.Process(pid)
    children = me.children(recursive=True)
    return {"server_pid": pid, "processes": 1 + len(children),
            "process_names": [me.name()] + [c.name() for c in children]}


class ReadbackExtension:
    """A vLLM worker extension (``worker_extension_cls``): adds collective_rpc calls that run
    in the worker process, next to the model."""

    def edgectl_describe(self) -> dict[str, Any]:
        return describe_model(self.get_model())

    def edgectl_effective(self) -> dict[str, Any]:
        """What the edgectl worker checks against its plan (``edgectl/contract/effective.py``)."""
        return collect_worker_facts(self)

    def edgectl_release_gloo_groups(self) -> dict[str, int | str]:
        """vLLM's one-rank gloo groups destroyed, in the worker process (``vllm_plugin/gloo_groups.py``)."""
        from edgectl_runtime.vllm_plugin.gloo_groups import release_one_rank_groups

        return release_one_rank_groups(self)
