"""The KV cache's element type: bf16 (the model's dtype) unless the context does not fit, then
fp8_e4m3 where vLLM's CPU attention runs it.

fp8 KV holds a token in half the bytes, at a fidelity cost measured against bf16 KV
(docs/memory.md, "KV cache dtype"). vLLM 0.32's CPU attention accepts it only on x86 with
AVX-512 or AMX and a head size divisible by 32 (``vllm/v1/attention/backends/cpu_attn.py:527-543``):
on an AVX2-only host it refuses to start, so the planner never offers it there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgectl.contract.plan import KvCacheDtype
from edgectl.errors import EdgectlError

if TYPE_CHECKING:
    from edgectl.contract.plan import Request
    from edgectl.models.facts import ModelFacts
    from edgectl.probe.facts import HostFacts

FP8 = KvCacheDtype.FP8_E4M3
# docs/memory.md, "KV cache dtype": 3 interleaved passes, the same KV bytes for every dtype.
FP8_COST = ("fp8_e4m3 KV against bf16 KV: top-1 agreement 0.930, mean KL 0.019 nats over the shipped prompt "
            "set, decode and prefill within the spread (SmolLM2-135M on x86_64-amx; fp8_e5m2 fell to 0.848, "
            "below the 0.90 bar, and is not offered; docs/memory.md)")


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
    """The KV dtypes to size with, preferred first: the one asked, else bf16 then (where it runs) fp8."""
    if request.kv_cache_dtype:
        dtype = KvCacheDtype(request.kv_cache_dtype)  # a known one: checked with the request
        if dtype is FP8:
            ok, why = fp8_runs(facts, model)
            if not ok:
                raise EdgectlError(f"--kv-cache-dtype {dtype} cannot run here: {why}; use --kv-cache-dtype auto")
        return [dtype]
    return [KvCacheDtype.AUTO, FP8] if fp8_runs(facts, model)[0] else [KvCacheDtype.AUTO]
