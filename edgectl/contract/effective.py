"""Did the plan take effect? A plan against the settings read back from a running engine.

The effective settings (schema ``edgectl.effective/1``) are read inside the process that holds
the model (``runtime/edgectl_runtime/readback.py``): what the forward pass really uses, not what
a config object says. :func:`mismatches` is the one comparison, shared by the worker (which
refuses to serve on any difference, exit code ``EXIT_MISMATCH``) and the bench (which marks such
a pass invalid). The fields it compares:

    kv_cache_bytes         bytes of the KV tensors actually allocated
    rope_rows              {module: rows of its cos/sin table}
    linear_formats         {layer: "cpu_int4/g32" | "bf16" | ...}, the output head included
    lm_head_format         the output head's format
    threads                torch's intra-op threads in the engine
    processes              processes in the server's tree (itself included)
    max_model_len, max_num_seqs
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgectl.contract.plan import Plan

SCHEMA = "edgectl.effective/1"


def is_int4(fmt: str | None) -> bool:
    """Whether a read-back layer format is 4-bit (edgectl's cpu_int4, or a w4a* kernel)."""
    return bool(fmt) and (fmt.startswith("cpu_int4") or fmt.startswith("w4a"))


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

    rope = effective.get("rope_rows")
    if not isinstance(rope, Mapping) or not rope:
        out.append("RoPE table rows could not be read back")
    else:
        wrong = {k: v for k, v in rope.items() if v != plan.rope_rows}
        if wrong:
            name, rows = next(iter(wrong.items()))
            out.append(f"RoPE table {name} has {rows} rows, the plan says {plan.rope_rows}")

    formats = effective.get("linear_formats")
    if not isinstance(formats, Mapping) or not formats:
        out.append("linear layer formats could not be read back")
    else:
        int4 = [n for n, f in formats.items() if is_int4(f)]
        if not plan.weight_format.is_int4:
            if int4:
                out.append(f"{len(int4)} linear layers are 4-bit, the plan says bf16 (e.g. {int4[0]})")
        else:
            body = {n: f for n, f in formats.items() if n != "lm_head"}
            not_int4 = sorted(n for n, f in body.items() if not is_int4(f))
            if not int4:
                out.append(f"no linear layer is 4-bit, the plan says {plan.weight_format}")
            elif not_int4:
                out.append(f"{len(not_int4)} linear layers are not 4-bit although the plan quantizes them "
                           f"(e.g. {not_int4[0]}: {formats[not_int4[0]]})")
        head = effective.get("lm_head_format", formats.get("lm_head"))
        if plan.quantize_lm_head and not is_int4(head):
            out.append(f"the output head is {head}, the plan quantizes it")
        if not plan.quantize_lm_head and is_int4(head):
            out.append(f"the output head is {head}, the plan keeps it unquantized")

    processes = effective.get("processes")
    if plan.topology == "single-process" and processes != 1:
        out.append(f"{processes} processes serve, the plan's single-process topology has 1")
    return out
