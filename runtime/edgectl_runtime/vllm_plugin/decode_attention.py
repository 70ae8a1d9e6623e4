"""Decode steps on edgectl's attention kernel (lever ``EDGECTL_DECODE_ATTENTION``).

vLLM 0.32's CPU attention (``CPUAttentionBackendImpl.forward``,
``vllm/v1/attention/backends/cpu_attn.py:344``) sends every call to its own op,
``cpu_attention_with_kv_cache``; the KV of the step is written before, by ``do_kv_cache_update``.
With the lever on, :func:`install` wraps that method: a call that is a pure decode step
(:func:`handles`: one query token per sequence, bf16 query and KV, a decoder layer with no
sliding window, soft cap, ALiBi or sinks, a head size and grouping the kernel takes, and a layer
whose KV vLLM writes in its "vec" layout: keys column-major in a block, values row-major,
``csrc/cpu/cpu_attn_vec.hpp`` ``reshape_and_cache``) runs
``torch.ops.edgectl.decode_attention`` on the same cache views vLLM would pass
(``runtime/edgectl_runtime/kernels/ops/csrc``; tested against ops/reference.py); every other call
(prefill, the vision tower's encoder attention, cross-attention, fp8 KV) goes to vLLM's method as
it is. With ``EDGECTL_KV_INT8=1`` too, every call of a decoder layer whose KV is edgectl's int8
goes to :mod:`kv_int8` (decode steps on ``torch.ops.edgectl.decode_attention_int8``). Why: vLLM's op reads a long context's KV at ~14 GB/s here, edgectl's at about twice that
(docs/vision.md "An attention of edgectl's").

On AMX hosts vLLM would pack a bf16 KV for its AMX kernel instead (``_get_attn_isa`` returns
"amx" for bf16 with blocks of a multiple of 32), which edgectl's kernel does not read: with the
lever on, :func:`install` has vLLM choose the "vec" layout there too (:func:`_vec_not_amx`), so
decode steps take edgectl's kernel and prefill runs vLLM's "vec" kernel instead of its AMX one
(what that costs a prompt: docs/vision.md "Decode attention on AMX hosts").

The lever is off unless set: the plugin is loaded by every vLLM process in the venv, including
a benchmark's unmodified "stock" arm. :func:`counts` says how many calls each side took in this
process (the worker's read-back, service/readback.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from edgectl.contract import environment as runtime_env
from edgectl.contract.decode_attention import MAX_BLOCK, shape_refused
from edgectl_runtime.vllm_plugin import kv_int8
from edgectl_runtime.vllm_plugin.lean_attention import cache_halves

logger = logging.getLogger("edgectl.decode_attention")

_ORIGINAL: list = []  # vLLM's forward, once installed
_ORIGINAL_ISA: list = []  # vLLM's _get_attn_isa, once installed
_DECODER: list = []  # vLLM's AttentionType.DECODER, looked up once
_COUNTS = {"edgectl": 0, "vllm": 0, "edgectl_prefill": 0}  # edgectl_prefill: an int8 KV's other calls
_FITS = "_edgectl_decode_attention_fits"  # layer_fits' answer, kept on the vLLM attention impl


def layer_fits(impl, layer) -> bool:
    """What about a layer lets the kernel take its decode calls; fixed once the layer exists, so
    asked once per layer (:func:`handles` runs on every call of every layer of every step)."""
    if getattr(layer, "isa", None) != "vec":  # the layout the kernel reads (vLLM sets it on the layer)
        return False
    if impl.attn_type != _DECODER[0] or impl.is_fp8_kv_cache or impl.alibi_slopes is not None:
        return False
    if impl.sliding_window != -1 or impl.logits_soft_cap or impl.sinks is not None:
        return False
    return shape_refused(impl.num_heads, impl.num_kv_heads, impl.head_size) is None


def handles(impl, layer, query: torch.Tensor, kv_cache: torch.Tensor, meta, output_scale, output_block_scale) -> bool:
    """Whether this call is a decode step edgectl's kernel computes exactly as vLLM's op would."""
    if meta is None or output_scale is not None or output_block_scale is not None:
        return False
    fits = impl.__dict__.get(_FITS)
    if fits is None:
        fits = impl.__dict__[_FITS] = layer_fits(impl, layer)
    if not fits:
        return False
    if meta.max_query_len != 1 or meta.dynamic_causal is not None or meta.encoder_cache is not None:
        return False
    if query.dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16 or query.dim() != 3:
        return False
    if kv_cache.size(2) > MAX_BLOCK or meta.num_actual_tokens != meta.seq_lens.size(0):
        return False
    return meta.seq_lens.dtype == torch.int32 and meta.block_table.dtype == torch.int32


def _forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
             output_block_scale=None):
    if kv_int8.owns(self):  # every call of the layer: vLLM cannot read edgectl's int8 KV
        kv_int8.forward(self, query, kv_cache, attn_metadata, output)
        if attn_metadata is not None:
            _COUNTS["edgectl" if attn_metadata.max_query_len == 1 else "edgectl_prefill"] += 1
        return output
    if not handles(self, layer, query, kv_cache, attn_metadata, output_scale, output_block_scale):
        if attn_metadata is not None:
            _COUNTS["vllm"] += 1
        return _ORIGINAL[0](self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                            output_block_scale)
    tokens = attn_metadata.num_actual_tokens
    key_cache, value_cache = cache_halves(self, kv_cache)
    torch.ops.edgectl.decode_attention(query[:tokens], key_cache, value_cache, output[:tokens], attn_metadata.seq_lens,
                                       attn_metadata.block_table, self.scale)
    _COUNTS["edgectl"] += 1
    return output


def install(environ: Mapping[str, str]) -> bool:
    """Wrap vLLM's CPU attention if ``EDGECTL_DECODE_ATTENTION=1`` and edgectl's kernel library loads;
    returns whether decode steps now take edgectl's kernel."""
    if not runtime_env.read_bool("EDGECTL_DECODE_ATTENTION", environ):
        return False
    if _ORIGINAL:
        return True
    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    if not ok:
        logger.warning("edgectl's decode attention is not available (vLLM's stays): %s", why)
        return False
    ops.load(environ)
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends import cpu_attn

    _DECODER.append(AttentionType.DECODER)
    _ORIGINAL.append(cpu_attn.CPUAttentionBackendImpl.forward)
    cpu_attn.CPUAttentionBackendImpl.forward = _forward
    # Looked up by name at each use (the metadata builder, vllm/platforms/cpu.py), so replacing the
    # module's attribute before the engine builds its attention metadata is enough.
    _ORIGINAL_ISA.append(cpu_attn._get_attn_isa)
    cpu_attn._get_attn_isa = _vec_not_amx
    kv_int8.install(environ)
    return True


def _vec_not_amx(dtype: torch.dtype, block_size: int, head_size: int | None = None,
                 kv_cache_dtype: str | None = None) -> str:
    """vLLM's choice of KV layout and kernel, with "vec" where it would choose "amx" (the other
    choices, fp8 KV's refusals among them, as vLLM makes them); "vec" for the one-byte KV that is
    edgectl's int8 (kv_int8.py: vLLM's fp8 refusals are about its own fp8 kernels, which never run)."""
    if kv_int8.enabled() and kv_cache_dtype not in (None, "auto"):
        return "vec"
    isa = _ORIGINAL_ISA[0](dtype, block_size, head_size, kv_cache_dtype)
    return "vec" if isa == "amx" else isa


def counts() -> dict[str, object]:
    """Which kernel this process's attention calls took since it started (``kernel``: edgectl when
    installed, else vllm). The layout each layer got is the worker's ``attention_isa`` read-back."""
    return {"kernel": "edgectl" if _ORIGINAL else "vllm", "calls": dict(_COUNTS)}
