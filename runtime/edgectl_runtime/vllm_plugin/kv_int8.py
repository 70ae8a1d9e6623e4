"""An int8 KV cache written and read by edgectl (lever ``EDGECTL_KV_INT8``, with ``EDGECTL_DECODE_ATTENTION``).

vLLM is started with ``--kv-cache-dtype fp8_e4m3`` so that it allocates one byte per value (its
fp8 cache tensors are uint8); edgectl then owns every byte of those tensors for each decoder
layer it takes (:func:`fits`):

- the write: ``do_kv_cache_update`` (``vllm/v1/attention/backends/cpu_attn.py:463``) becomes
  ``torch.ops.edgectl.kv_write_int8``, a scale per token and KV head kept in a float32 tensor of
  this module's beside the layer's cache (:func:`_scales`), the layout of csrc/kernels.h;
- a decode step (one query token per sequence): ``torch.ops.edgectl.decode_attention_int8``;
- any other call of the layer (a prompt, a chunk of one, a batch mixing both): the sequence's keys
  and values dequantized (ops/reference.py ``dequantize_kv_int8``, the semantics the kernel is tested
  against) and PyTorch's scaled-dot-product attention, causal from the sequence's cached tokens.

vLLM's own fp8 path never sees these tensors, so neither its e4m3 rounding (which lost the shape
model's image answer, docs/vision.md "vLLM's fp8 KV") nor its AVX-512-or-AMX requirement applies.
A decoder layer the kernel cannot take in a model served this way would have vLLM read edgectl's
bytes as fp8: :func:`forward` refuses it at its first call (the planner offers int8 only where every
layer fits, ``edgectl/planner/kv_dtype.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from edgectl.contract import environment as runtime_env
from edgectl.contract.decode_attention import MAX_BLOCK, shape_refused
from edgectl_runtime.kernels.ops.reference import dequantize_kv_int8

_ON: list[bool] = []  # installed
_DECODER: list = []  # vLLM's AttentionType.DECODER
_COUNTS = {"writes": 0, "decode": 0, "prefill": 0}
_FITS = "_edgectl_kv_int8_fits"
_VIEWS = "_edgectl_kv_int8_views"  # (the layer's cache tensor, its int8 key and value halves, its scales)
_SCALES: dict[int, torch.Tensor] = {}  # each owned layer's scales, by id of its vLLM attention impl


def enabled() -> bool:
    return bool(_ON)


def install(environ: Mapping[str, str]) -> bool:
    """On if ``EDGECTL_KV_INT8=1`` (the caller installs it only with edgectl's decode attention)."""
    if not runtime_env.read_bool("EDGECTL_KV_INT8", environ):
        return False
    if _ON:
        return True
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends import cpu_attn

    _DECODER.append(AttentionType.DECODER)
    original = cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        if not owns(self):
            return original(self, layer, key, value, kv_cache, slot_mapping)
        key_cache, value_cache, scales = _views(self, kv_cache)
        tokens = slot_mapping.size(0)
        torch.ops.edgectl.kv_write_int8(key[:tokens], value[:tokens], key_cache, value_cache, scales,
                                        slot_mapping.long())
        _COUNTS["writes"] += 1

    cpu_attn.CPUAttentionBackendImpl.do_kv_cache_update = do_kv_cache_update

    # The metadata builder asks vLLM's C++ for its kernel's work split with the KV dtype
    # (``cpu_attn_get_scheduler_metadata``, cpu_attn.py:253); vLLM's builds without AVX-512 have no fp8
    # configuration and refuse it ("Unsupported CPU attention configuration"), though edgectl's kernels never
    # read that split. Asked as for bf16 instead: the one-byte allocation is edgectl's int8.
    builder_init = cpu_attn.CPUAttentionMetadataBuilder.__init__

    def init(self, *args, **kwargs):
        builder_init(self, *args, **kwargs)
        if self.kv_cache_dtype not in (None, "auto"):
            self.kv_cache_dtype = "auto"

    cpu_attn.CPUAttentionMetadataBuilder.__init__ = init
    _ON.append(True)
    return True


def fits(impl) -> str | None:
    """Why edgectl's int8 KV cannot hold this decoder layer, or None."""
    if impl.alibi_slopes is not None or impl.sliding_window != -1 or impl.logits_soft_cap or impl.sinks is not None:
        return "a sliding window, soft cap, ALiBi or attention sinks"
    return shape_refused(impl.num_heads, impl.num_kv_heads, impl.head_size)


def owns(impl) -> bool:
    """Whether this layer's KV is edgectl's int8 (on, a decoder layer, vLLM's one-byte KV)."""
    if not _ON:
        return False
    own = impl.__dict__.get(_FITS)
    if own is None:
        own = impl.attn_type == _DECODER[0] and impl.is_fp8_kv_cache
        if own:
            why = fits(impl)
            if why is not None:
                raise RuntimeError(f"edgectl's int8 KV cannot hold a decoder layer with {why} (heads "
                                   f"{impl.num_heads}, KV heads {impl.num_kv_heads}, head size {impl.head_size}); "
                                   "plan this model with --kv-cache-dtype auto")
        impl.__dict__[_FITS] = own
    return own


def _views(impl, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int8 key and value halves of a layer's uint8 cache ``[blocks, kv_heads, block_size, 2 * dim]``
    and the scales beside it (zeros at first), kept for the cache tensor's life."""
    kept = impl.__dict__.get(_VIEWS)
    if kept is None or kept[0] is not kv_cache:
        blocks, kv_heads, block_size, _ = kv_cache.size()
        if block_size > MAX_BLOCK:
            raise RuntimeError(f"edgectl's int8 KV takes blocks of at most {MAX_BLOCK} tokens, not {block_size}")
        key_cache, value_cache = kv_cache.view(torch.int8).view(blocks, kv_heads, 2 * block_size, -1).chunk(2, dim=2)
        scales = torch.zeros(blocks, kv_heads, 2, block_size, dtype=torch.float32)
        kept = impl.__dict__[_VIEWS] = (kv_cache, key_cache, value_cache, scales)
        _SCALES[id(impl)] = scales
    return kept[1], kept[2], kept[3]


def scales_bytes() -> int:
    """Bytes of the scale tensors this process holds (the KV's bytes beyond vLLM's cache tensors)."""
    return sum(t.numel() * t.element_size() for t in _SCALES.values())


def forward(impl, query: torch.Tensor, kv_cache: torch.Tensor, meta, output: torch.Tensor) -> torch.Tensor:
    """A decoder layer's attention over its int8 KV (the step's keys and values already written)."""
    if meta is None:  # vLLM's warm-up
        return output
    key_cache, value_cache, scales = _views(impl, kv_cache)
    tokens = meta.num_actual_tokens
    if meta.max_query_len == 1 and tokens == meta.seq_lens.size(0):
        torch.ops.edgectl.decode_attention_int8(query[:tokens], key_cache, value_cache, scales, output[:tokens],
                                                meta.seq_lens, meta.block_table, impl.scale)
        _COUNTS["decode"] += 1
        return output
    _prefill(impl, query, key_cache, value_cache, scales, meta, output)
    _COUNTS["prefill"] += 1
    return output


def _prefill(impl, query, key_cache, value_cache, scales, meta, output) -> None:
    block_size = key_cache.size(2)
    starts = meta.query_start_loc.tolist()
    lens = meta.seq_lens.tolist()
    for r, n in enumerate(lens):
        first, last = starts[r], starts[r + 1]
        q_len = last - first
        if q_len == 0:
            continue
        if q_len == 1:
            torch.ops.edgectl.decode_attention_int8(query[first:last], key_cache, value_cache, scales,
                                                    output[first:last], meta.seq_lens[r:r + 1],
                                                    meta.block_table[r:r + 1], impl.scale)
            continue
        k, v = dequantize_kv_int8(key_cache, value_cache, scales, meta.block_table[r, : -(-n // block_size)], n,
                                  query.dtype)
        # [1, heads, tokens, dim]: four dimensions, so that PyTorch takes its fused CPU attention (flash)
        # rather than the reference "math" one, which holds every score in float32
        # (query head i reads KV head i // group: enable_gqa)
        q, k, v = query[first:last].transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        if q_len == n:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=impl.scale,
                                                                   enable_gqa=True)
        else:  # a chunk after cached tokens: query i sits at position n - q_len + i
            mask = torch.arange(n)[None, :] <= torch.arange(n - q_len, n)[:, None]
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=impl.scale,
                                                                   enable_gqa=True)
        output[first:last] = out[0].transpose(0, 1)


def counts() -> dict[str, int]:
    """The int8 KV's writes, decode calls and other calls in this process since it started."""
    return dict(_COUNTS)
