"""vLLM's CPU attention called with less Python (lever ``EDGECTL_LEAN_ATTENTION``).

Every attention layer of every step goes through two of vLLM's Python methods
(``CPUAttentionBackendImpl.do_kv_cache_update`` and ``.forward``,
``vllm/v1/attention/backends/cpu_attn.py:344,463``), which view the layer's cache as key and value
halves at every call, slice the query and output even when the step has no padding, and reach the
C++ ops through keyword wrappers (``vllm/_custom_ops.py`` ``cpu_attn_reshape_and_cache``,
``cpu_attention_with_kv_cache``). At SmolLM2's size that Python is as long as the ops themselves
(docs/kernels.md "On x86_64-amx the C++ wrapper pays": the KV write 2.7 µs in C++, 10.2 µs through
vLLM's method; the attention 8.2 against 16.6 µs).

With the lever on, :func:`install` replaces both methods with versions that call **the same two C++
ops with the same arguments**, positionally on ``torch.ops._C``, with each layer's key and value
views made once per cache tensor (:func:`cache_halves`) and the query and output sliced only when the
step is padded. Only a decoder layer's calls with metadata, no output quantization and no attention
sinks (vLLM casts those lazily in its method) take the lean path; encoder and cross-attention calls and
everything else go to vLLM's methods as they are. The answer is the same bit for bit
(tests/test_lean_attention.py calls both on the same tensors).

Installed before :mod:`decode_attention` and :mod:`kv_int8`, which wrap these methods in turn: their
calls that stay on vLLM's side take the lean path. The lever is off unless set (the plugin is loaded by
every vLLM process in the venv, including a benchmark's unmodified "stock" arm). :func:`counts` is the
worker's read-back: whether installed and how many calls took each path.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from edgectl.contract import environment as runtime_env

_ORIGINAL: dict[str, object] = {}  # vLLM's forward and do_kv_cache_update, once installed
_DECODER: list = []  # vLLM's AttentionType.DECODER, looked up once
_COUNTS = {"lean": 0, "vllm": 0}  # attention calls (forward with metadata) by path
_HALVES = "_edgectl_cache_halves"  # (the layer's KV cache, its key and value views), kept on the vLLM impl


def cache_halves(impl, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value halves of a layer's cache ``[blocks, kv_heads, block_size, 2 * head]`` as vLLM's
    methods view them (``[blocks, kv_heads, 2 * block_size, head]`` chunked in two along dim 2); made once
    per cache tensor (a layer keeps its cache for the engine's life) instead of at every call."""
    kept = impl.__dict__.get(_HALVES)
    if kept is None or kept[0] is not kv_cache:
        blocks, kv_heads, block_size, _ = kv_cache.size()
        key_cache, value_cache = kv_cache.view(blocks, kv_heads, block_size * 2, -1).chunk(2, dim=2)
        kept = impl.__dict__[_HALVES] = (kv_cache, key_cache, value_cache)
    return kept[1], kept[2]


def _update(self, layer, key, value, kv_cache, slot_mapping):
    if self.attn_type != _DECODER[0]:
        return _ORIGINAL["update"](self, layer, key, value, kv_cache, slot_mapping)
    key_cache, value_cache = cache_halves(self, kv_cache)
    torch.ops._C.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, layer.isa,
                                            layer._k_scale_float, layer._v_scale_float, self.kv_cache_dtype)
    return None


def _forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
             output_block_scale=None):
    if (attn_metadata is None or output_scale is not None or output_block_scale is not None
            or self.attn_type != _DECODER[0] or self.sinks is not None):
        if attn_metadata is not None:
            _COUNTS["vllm"] += 1
        return _ORIGINAL["forward"](self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                                    output_block_scale)
    tokens = attn_metadata.num_actual_tokens
    key_cache, value_cache = cache_halves(self, kv_cache)
    torch.ops._C.cpu_attention_with_kv_cache(
        query if query.size(0) == tokens else query[:tokens], key_cache, value_cache,
        output if output.size(0) == tokens else output[:tokens], attn_metadata.query_start_loc,
        attn_metadata.seq_lens, self.scale, attn_metadata.causal, self.alibi_slopes, self.sliding_window,
        attn_metadata.block_table, self.logits_soft_cap, attn_metadata.scheduler_metadata, self.sinks,
        attn_metadata.dynamic_causal, layer._k_scale_float, layer._v_scale_float, self.kv_cache_dtype)
    _COUNTS["lean"] += 1
    return output


def install(environ: Mapping[str, str]) -> bool:
    """Replace vLLM's two attention methods if ``EDGECTL_LEAN_ATTENTION=1``; returns whether installed."""
    if not runtime_env.read_bool("EDGECTL_LEAN_ATTENTION", environ):
        return False
    if _ORIGINAL:
        return True
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends import cpu_attn

    cls = cpu_attn.CPUAttentionBackendImpl
    _DECODER.append(AttentionType.DECODER)
    _ORIGINAL.update(forward=cls.forward, update=cls.do_kv_cache_update)
    cls.forward, cls.do_kv_cache_update = _forward, _update
    return True


def counts() -> dict[str, object]:
    """Whether this process calls vLLM's attention ops the lean way (``path``: lean when installed, else
    vllm) and how many attention calls took each path since it started."""
    return {"path": "lean" if _ORIGINAL else "vllm", "calls": dict(_COUNTS)}
