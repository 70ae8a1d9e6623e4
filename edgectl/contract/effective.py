"""Did the plan take effect? A plan against the settings read back from a running engine.

The effective settings (schema ``edgectl.effective/1``) are read inside the process that holds
the model (``runtime/edgectl_runtime/service/readback.py``): what the forward pass really uses, not what
a config object says. :func:`mismatches` is the one comparison, shared by the worker (which
refuses to serve on any difference, exit code ``EXIT_MISMATCH``) and the bench (which marks such
a pass invalid). The fields it compares:

    kv_cache_bytes         bytes of the KV tensors actually allocated
    rope_rows              {module: rows of its cos/sin table}
    linear_formats         {layer: "cpu_int4/g32" | "bf16" | ...}, the output head included; each int4
                           layer's group is what the plan's group size gives its width (for
                           weights quantized at load; a 4-bit checkpoint keeps its own groups)
    linear_in_features     {layer: in_features}, for that rule
    lm_head_format         the output head's format
    kernel_isa             the ISA level edgectl's own kernels dispatch to (avx512vnni | avx2 | scalar),
                           None where the library is not loaded
    threads                torch's intra-op threads in the engine
    processes              processes in the server's tree (itself included): 1 in the single-process
                           topology, more in vLLM's own
    kv_cache_dtype         the attention layers' KV cache dtype, and kv_tensor_dtypes the KV
                           tensors' own (uint8 for fp8)
    embedding_pack         {layer: {"state": "packed" | "not packed" | "no packed kernel", "lm_head": bool}}
                           for every dense embedding table (the LM head included); "no packed
                           kernel": vLLM tried and this CPU has no packed GEMM for it (AVX2:
                           runtime/edgectl_runtime/vllm_plugin/embedding.py), which a plan that keeps the copy accepts
    optional_imports       {package: "kept out" | "loaded" | "not imported"} in the server's process
    tokenizer              {"lean": bool, "processor_loaded": bool | None (read again after the warm-up,
                           which is when vLLM probes for a processor), "construction_inputs":
                           {"held": [...], "read_after_init": [...]} | None}
    idle_trim              {"enabled": bool, "available": bool (glibc's malloc_trim found), "trims": n,
                           "released_bytes", "last_ms", "max_ms", ...}: the trimmer's running figures
    python_optimize        the server process's ``sys.flags.optimize``
    max_model_len, max_num_seqs
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from edgectl.contract import int4_layout
from edgectl.contract.vllm_args import GGUF_LOAD_FORMAT

if TYPE_CHECKING:
    from edgectl.contract.plan import Plan

SCHEMA = "edgectl.effective/1"


def is_int4(fmt: str | None) -> bool:
    """Whether a read-back layer format is 4-bit (edgectl's cpu_int4, or a w4a* kernel)."""
    return fmt is not None and fmt.startswith(("cpu_int4", "w4a"))


def head_family(fmt: str | None) -> str:
    """A read-back head format as the plan names it: int4, int8 (edgectl's W8) or dense."""
    if is_int4(fmt):
        return "int4"
    return "int8" if fmt and fmt.startswith("w8a8") else "dense"


def mismatches(plan: Plan, effective: Mapping[str, Any]) -> list[str]:
    """Every way the running engine differs from the plan; empty when the plan took effect."""
    out: list[str] = []

    def differ(what: str, planned: Any, got: Any) -> None:
        if got != planned:
            out.append(f"{what} is {got!r}, the plan says {planned!r}")

    differ("max_model_len", plan.max_model_len, effective.get("max_model_len"))
    differ("max_num_seqs", plan.max_num_seqs, effective.get("max_num_seqs"))
    differ("KV cache bytes", plan.kv_cache_bytes, effective.get("kv_cache_bytes"))
    differ("threads", plan.threads, effective.get("threads"))
    out += _rope_rows(plan, effective)
    out += _linear_formats(plan, effective)
    if (plan.model.checkpoint_format == "gguf" and "load_format" in effective
            and effective["load_format"] != GGUF_LOAD_FORMAT):
        out.append(f"the model was loaded with {effective['load_format']!r}, a GGUF is served by {GGUF_LOAD_FORMAT!r}")
    out += _processes(plan, effective)
    out += _kv_dtype(plan, effective)
    out += _memory_levers(plan, effective)
    return out


def _rope_rows(plan: Plan, effective: Mapping[str, Any]) -> list[str]:
    rope = effective.get("rope_rows")
    if not isinstance(rope, Mapping) or not rope:
        return ["RoPE table rows could not be read back"]
    wrong = {k: v for k, v in rope.items() if v != plan.rope_rows}
    if wrong:
        name, rows = next(iter(wrong.items()))
        return [f"RoPE table {name} has {rows} rows, the plan says {plan.rope_rows}"]
    return []


def _linear_formats(plan: Plan, effective: Mapping[str, Any]) -> list[str]:
    """The linear layers' formats: 4-bit where the plan quantizes, in its groups; the output head's
    format; edgectl's kernel library loaded where the plan runs on it."""
    formats = effective.get("linear_formats")
    if not isinstance(formats, Mapping) or not formats:
        return ["linear layer formats could not be read back"]
    out: list[str] = []
    int4 = [n for n, f in formats.items() if is_int4(f)]
    if not plan.weight_format.is_int4:
        if int4:
            out.append(f"{len(int4)} linear layers are 4-bit, the plan says bf16 (e.g. {int4[0]})")
    else:
        out += _int4_body(plan, formats, int4, effective)
    head = effective.get("lm_head_format", formats.get("lm_head"))
    if head_family(head) != plan.lm_head_format:
        planned = "keeps it unquantized" if plan.lm_head_format == "dense" else f"has it {plan.lm_head_format}"
        out.append(f"the output head is {head}, the plan {planned}")
    if ((plan.weight_format == "w4a8" or plan.lm_head_format == "int8")
            and "kernel_isa" in effective and not effective["kernel_isa"]):
        out.append(f"edgectl's kernel library is not loaded, the plan's {plan.weight_format} runs on it")
    return out


def _int4_body(plan: Plan, formats: Mapping[str, Any], int4: list[str], effective: Mapping[str, Any]) -> list[str]:
    """A 4-bit plan: every layer but the output head 4-bit (``int4``: those that are), in the plan's groups."""
    out: list[str] = []
    body = {n: f for n, f in formats.items() if n != "lm_head"}
    # a GGUF served as it is keeps its 5-8-bit layers in edgectl's 8-bit blocks (docs/gguf.md)
    held = (lambda f: is_int4(f) or str(f).startswith("w8a8")) if plan.model.checkpoint_format == "gguf" \
        else is_int4
    not_int4 = sorted(n for n, f in body.items() if not held(f))
    if not int4:
        out.append(f"no linear layer is 4-bit, the plan says {plan.weight_format}")
    elif not_int4:
        out.append(f"{len(not_int4)} linear layers are not 4-bit although the plan quantizes them "
                   f"(e.g. {not_int4[0]}: {formats[not_int4[0]]})")
    # quantized at load by the plan's group rule (edgectl's w4a8 blocks are 32 columns whatever it says)
    if plan.model.checkpoint_format == "bf16" and plan.weight_format != "w4a8":
        out += _group_mismatches(plan, body, effective.get("linear_in_features"))
    return out


def _processes(plan: Plan, effective: Mapping[str, Any]) -> list[str]:
    """The processes serving: one in the single-process topology, several in vLLM's own."""
    processes = effective.get("processes")
    out: list[str] = []
    if plan.topology == "single-process" and processes != 1:
        out.append(f"{processes} processes serve, the plan's single-process topology has 1")
    if plan.topology == "stock" and not (isinstance(processes, int) and processes > 1):
        out.append(f"{processes} process(es) serve, vLLM's own topology has an API server and an engine")
    return out


# The KV tensors' element type per KV cache dtype (vLLM's CPU backend keeps fp8 KV as uint8).
KV_TENSOR_DTYPE = {"auto": "bfloat16", "fp8_e4m3": "uint8"}


def _kv_dtype(plan: Plan, effective: Mapping[str, Any]) -> list[str]:
    want = str(plan.kv_cache_dtype)
    layers = effective.get("kv_cache_dtype")
    tensors = effective.get("kv_tensor_dtypes")
    if not layers or not tensors:
        return ["the KV cache dtype could not be read back"]
    out = []
    if set(layers) != {want}:
        out.append(f"the attention layers' KV cache dtype is {', '.join(sorted(layers))}, the plan says {want}")
    if set(tensors) != {KV_TENSOR_DTYPE[want]}:
        out.append(f"the KV tensors are {', '.join(sorted(tensors))}, the plan's {want} KV is "
                   f"{KV_TENSOR_DTYPE[want]}")
    return out


def _memory_levers(plan: Plan, effective: Mapping[str, Any]) -> list[str]:
    out = []
    optimize = effective.get("python_optimize")
    if optimize != plan.levers.python_optimize:
        out.append(f"Python's optimization level is {optimize!r}, the plan says {plan.levers.python_optimize}")
    imports = effective.get("optional_imports")
    if not isinstance(imports, Mapping) or not imports:
        out.append("the optional imports could not be read back")
    else:
        skip = str(plan.levers.optional_imports) == "skip"
        wrong = sorted(n for n, state in imports.items() if state == ("loaded" if skip else "kept out"))
        if wrong:
            out.append(f"{', '.join(wrong)} {'loaded' if skip else 'kept out'}, the plan says "
                       f"{plan.levers.optional_imports}")
    tokenizer = effective.get("tokenizer")
    lean = str(plan.levers.tokenizer) == "lean"
    if not isinstance(tokenizer, Mapping):
        out.append("the tokenizer's state could not be read back")
    else:
        if bool(tokenizer.get("lean")) != lean:
            out.append(f"the tokenizer is {'lean' if tokenizer.get('lean') else 'as vLLM holds it'}, the plan's "
                       f"tokenizer is {plan.levers.tokenizer}")
        inputs = tokenizer.get("construction_inputs") or {}
        releasable = sorted(set(inputs.get("held") or []) - set(inputs.get("read_after_init") or []))
        if lean and releasable:
            out.append(f"the tokenizer still holds {', '.join(releasable)}, the plan's tokenizer is lean")
    trim = effective.get("idle_trim")
    if not isinstance(trim, Mapping):
        out.append("the idle trim's state could not be read back")
    elif bool(trim.get("enabled")) != plan.levers.idle_trim:
        out.append(f"the idle trim is {'on' if trim.get('enabled') else 'off'}, the plan's idle_trim is "
                   f"{'on' if plan.levers.idle_trim else 'off'}")
    elif plan.levers.idle_trim and not trim.get("available"):
        out.append("the idle trim is on but this C library has no malloc_trim (glibc's)")
    packs = effective.get("embedding_pack")
    if not isinstance(packs, Mapping):
        out.append("the embedding tables' packed copies could not be read back")
    else:  # empty when no embedding is dense (an int4 tied head)
        lm_head_only = str(plan.levers.embedding_pack) == "lm-head"
        # a table the plan leaves to vLLM is packed where the CPU has a packed GEMM, and only there
        kept = ("packed", "no packed kernel")
        wrong = sorted(n for n, layer in packs.items()
                       if (layer.get("state") in kept) != (not lm_head_only or bool(layer.get("lm_head"))))
        if wrong:
            out.append(f"embedding table(s) {', '.join(wrong)}: {packs[wrong[0]].get('state')}, the plan's "
                       f"embedding_pack is {plan.levers.embedding_pack}")
    return out


def _group_mismatches(plan: Plan, formats: Mapping[str, str], in_features: Any) -> list[str]:
    """Each int4 layer's group against the one the plan's rule gives its input width
    (``int4_layout.choose_group_size``: the plan's group where it divides K, else the nearest)."""
    if not isinstance(in_features, Mapping):
        return ["the int4 layers' input widths could not be read back (their group sizes cannot be checked)"]
    wrong = []
    for name, fmt in formats.items():
        group, k = group_size_of(fmt), in_features.get(name)
        if group is None:
            continue
        expected = int4_layout.choose_group_size(k, plan.group_size) if isinstance(k, int) else None
        if group != expected:
            wrong.append(f"{name} uses groups of {group}, the plan's group size {plan.group_size} gives {expected}")
    return [f"{len(wrong)} int4 layer(s) differ in group size (e.g. {wrong[0]})"] if wrong else []


def group_size_of(fmt: str | None) -> int | None:
    """The int4 group of a read-back layer format (``cpu_int4/g32`` → 32; a tied copy → None)."""
    if not fmt or not is_int4(fmt) or "tied" in fmt:
        return None
    match = re.search(r"/g(\d+)", fmt)
    return int(match.group(1)) if match else None
