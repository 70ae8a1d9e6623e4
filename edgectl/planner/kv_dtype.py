"""The KV cache's element type: bf16 (the model's dtype) unless the context does not fit, then
edgectl's int8 where its kernels take the model, else fp8_e4m3 where vLLM's CPU attention runs it.

fp8 KV holds a token in half the bytes, at a fidelity cost measured against bf16 KV
(docs/memory.md, "KV cache dtype"). vLLM 0.32's CPU attention accepts it only on x86 with
AVX-512 or AMX and a head size divisible by 32 (``vllm/v1/attention/backends/cpu_attn.py:527-543``):
on an AVX2-only host it refuses to start, so the planner never offers it there.

edgectl's int8 KV (``--kv-cache-dtype int8``: one byte per value and a scale per token and KV head,
runtime/edgectl_runtime/vllm_plugin/kv_int8.py) is written and read by edgectl's kernels on every
level they build for, AVX2 included; it needs a model whose every layer edgectl's decode attention
takes (``decode_attention_refused``), and it turns that lever on. Where both run, int8 is the one
taken when bf16 does not fit: it keeps more of bf16's answers (the costs below) and is read faster at
a long context (docs/memory.md); it is still not taken when bf16 fits, as neither is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgectl.contract.plan import KvCacheDtype
from edgectl.errors import EdgectlError
from edgectl.models.facts import SLIDING_ATTENTION
from edgectl.planner.engine import decode_attention_refused
from edgectl.planner.formats import kernels_run

if TYPE_CHECKING:
    from edgectl.contract.plan import Request
    from edgectl.models.facts import ModelFacts
    from edgectl.probe.facts import HostFacts

FP8 = KvCacheDtype.FP8_E4M3
# docs/memory.md, "KV cache dtype": 3 interleaved passes, the same KV bytes for every dtype.
FP8_COST = ("fp8_e4m3 KV against bf16 KV: top-1 agreement 0.930, mean KL 0.019 nats over the shipped prompt "
            "set, decode and prefill within the spread (SmolLM2-135M on x86_64-amx; fp8_e5m2 fell to 0.848, "
            "below the 0.90 bar, and is not offered; docs/memory.md)")


INT8 = KvCacheDtype.INT8
# docs/memory.md, "An int8 KV of edgectl's": SmolLM2-135M's bf16 weights, the shipped prompt set, 3 passes.
INT8_COST = ("edgectl's int8 KV against bf16 KV: top-1 agreement 0.953, mean KL 0.0023 nats over the shipped "
             "prompt set, next token 24 of 24 (vLLM's fp8_e4m3: 0.930, 0.019; SmolLM2-135M on x86_64-amx; "
             "docs/memory.md)")


def kv_cost(kv_dtype: KvCacheDtype) -> str:
    """What a one-byte KV costs in agreement with bf16 KV, measured."""
    return INT8_COST if kv_dtype is INT8 else FP8_COST


def int8_runs(facts: HostFacts, model: ModelFacts, request: Request) -> tuple[bool, str]:
    """Whether edgectl's int8 KV can hold this model's KV as asked, and why."""
    runs, why = kernels_run(facts)
    if not runs:
        return False, f"edgectl's int8 KV is written and read by its kernels: {why}"
    refused = decode_attention_refused(model)
    if refused:
        return False, f"edgectl's int8 KV is read by its decode attention, which {model.name} cannot take: {refused}"
    if model.sliding_window and (not model.layer_types or SLIDING_ATTENTION in model.layer_types):
        return False, (f"{model.name} has sliding-window layers ({model.sliding_window} tokens), whose KV edgectl's "
                       "int8 does not hold")
    if request.bench.decode_attention is False:
        return False, "edgectl's int8 KV is read by its decode attention only, which this request turns off"
    return True, "edgectl's kernels write and read it"


def fp8_runs(facts: HostFacts, model: ModelFacts) -> tuple[bool, str]:
    """Whether vLLM's CPU attention runs fp8 KV on this host for this model, and why."""
    isa = facts.cpu.isa
    if facts.cpu.arch != "x86_64" or not (isa.avx512 or isa.amx_tile):
        return False, ("vLLM's CPU attention refuses fp8 KV without AVX-512 or AMX "
                       "(vllm/v1/attention/backends/cpu_attn.py:540-543)")
    if model.head_dim % 32:
        return False, (f"vLLM's CPU attention needs a head size divisible by 32 for fp8 KV, {model.name}'s is "
                       f"{model.head_dim} (vllm/v1/attention/backends/cpu_attn.py:527-531)")
    return True, "vLLM's CPU attention runs fp8 KV with AVX-512 or AMX (vllm/v1/attention/backends/cpu_attn.py:540-543)"


def kv_dtype_candidates(facts: HostFacts, model: ModelFacts, request: Request) -> list[KvCacheDtype]:
    """The KV dtypes to size with, preferred first: the one asked, else bf16 then one byte a value:
    edgectl's int8 where it runs, else fp8 where it runs."""
    if request.kv_cache_dtype:
        dtype = KvCacheDtype(request.kv_cache_dtype)  # a known one: checked with the request
        if dtype is not KvCacheDtype.AUTO:
            ok, why = fp8_runs(facts, model) if dtype is FP8 else int8_runs(facts, model, request)
            if not ok:
                raise EdgectlError(f"--kv-cache-dtype {dtype} cannot run here: {why}; use --kv-cache-dtype auto")
        return [dtype]
    if int8_runs(facts, model, request)[0]:
        return [KvCacheDtype.AUTO, INT8]
    return [KvCacheDtype.AUTO, FP8] if fp8_runs(facts, model)[0] else [KvCacheDtype.AUTO]


def decode_attention_for(request: Request, kv_dtype: KvCacheDtype, default: tuple[bool, str]) -> tuple[bool, str]:
    """The decode-attention lever's default and why: on for an int8 KV (only edgectl's kernel reads it),
    else the modality's own default."""
    if kv_dtype is INT8:
        how = "asked for (--kv-cache-dtype int8)" if request.kv_cache_dtype == INT8 else "planned (bf16 KV does not fit)"
        return True, f"on: the int8 KV {how} is read by edgectl's decode attention only"
    return default
