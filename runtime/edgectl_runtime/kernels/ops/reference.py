"""What every op of edgectl's kernel library computes, in plain PyTorch (float64 where it sums).

Written once; every ISA level of every op is tested against these functions
(``tests/test_ops_*.py``). The packed layout is not part of the semantics: these take the
unpacked values of :mod:`edgectl_runtime.formats.blocks` (``quantize_w4`` / ``quantize_w8``).
"""

from __future__ import annotations

import torch

BLOCK = 32


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [m, k]`` -> ``q`` int8 ``[m, kb, 32]``, ``d`` and ``s`` fp32 ``[m, kb]``.

    Per row and block of 32 columns (zero padded past k): ``d = amax / 127``,
    ``q = round_half_even(x * (127 / amax))`` (0 for an all-zero block), ``s = sum(q)``.
    The products and quotients are fp32 operations, as in the kernels, so q is bit-exact.
    """
    m, k = x.shape
    kb = -(-k // BLOCK)
    v = torch.zeros((m, kb * BLOCK), dtype=torch.float32)
    v[:, :k] = x.to(torch.float32)
    v = v.reshape(m, kb, BLOCK)
    amax = v.abs().amax(-1)
    inv = torch.where(amax > 0, torch.tensor(127.0, dtype=torch.float32) / amax, torch.zeros_like(amax))
    q = torch.round(v * inv.unsqueeze(-1)).clamp_(-127, 127)
    return q.to(torch.int8), amax / 127.0, q.sum(-1)


def linear_w4a8(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``y [m, n]`` for ``x [m, k]`` and a W4 weight (``q [n, kb*32]``, ``d``/``m`` fp16 ``[n, kb]``):
    ``y = sum_b dw*dx * (qw . qx) + mw * dx * sum(qx)`` in float64, returned in x's dtype."""
    qx, dx, sx = quantize_activations(x)
    n = q.shape[0]
    kb = qx.shape[1]
    qw = q.to(torch.float64).reshape(n, kb, BLOCK)
    dots = torch.einsum("mbj,nbj->mnb", qx.to(torch.float64), qw)
    dx64 = dx.to(torch.float64).unsqueeze(1)  # [m, 1, kb]
    y = (dots * d.to(torch.float64).unsqueeze(0) * dx64).sum(-1)
    y += (m.to(torch.float64).unsqueeze(0) * dx64 * sx.to(torch.float64).unsqueeze(1)).sum(-1)
    return y.to(x.dtype)


def linear_dense(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The large-batch path of ``linear_w4a8`` / ``linear_w8a8``: ``x @ W^T`` with the dequantized
    weight ``w`` (fp32 ``[n, k]``, e.g. ``formats.blocks.dequantize_w4``), activations not quantized."""
    return (x.to(torch.float64) @ w.to(torch.float64).t()).to(x.dtype)


def linear_w8a8(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``y = sum_b dw*dx * (qw . qx)`` for a W8 weight (``q`` int8 ``[n, kb*32]``, ``d`` fp16 ``[n, kb]``)."""
    qx, dx, _ = quantize_activations(x)
    n = q.shape[0]
    kb = qx.shape[1]
    dots = torch.einsum("mbj,nbj->mnb", qx.to(torch.float64), q.to(torch.float64).reshape(n, kb, BLOCK))
    y = (dots * d.to(torch.float64).unsqueeze(0) * dx.to(torch.float64).unsqueeze(1)).sum(-1)
    return y.to(x.dtype)


def linear_w5a8(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``y = sum_b dw*dx * ((qw - 16) . qx)`` for a W5 weight (``q`` uint8 ``[n, kb*32]`` in 0..31, ``d``
    fp16 ``[n, kb]``; GGUF Q5_0's ``w = d (q - 16)``): the integer sums exact, as W8's."""
    return linear_w8a8(x, q.to(torch.int16) - 16, d)


def embedding_w4(ids: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor, k: int,
                 dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of the W4 matrix: ``d * q + m`` in fp32, rounded once to ``dtype``."""
    rows = ids.reshape(-1).long()
    w = q[rows].to(torch.float32).reshape(len(rows), -1, BLOCK) * d[rows].float().unsqueeze(-1) + m[rows].float().unsqueeze(-1)
    return w.reshape(len(rows), -1)[:, :k].to(dtype).reshape(*ids.shape, k)


def embedding_w8(ids: torch.Tensor, q: torch.Tensor, d: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    rows = ids.reshape(-1).long()
    w = q[rows].to(torch.float32).reshape(len(rows), -1, BLOCK) * d[rows].float().unsqueeze(-1)
    return w.reshape(len(rows), -1)[:, :k].to(dtype).reshape(*ids.shape, k)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``fused_add_rms_norm`` (vllm/ir/ops/layernorm.py), weight in x's dtype:
    returns ``(normed, x + residual)``."""
    orig = x.dtype
    s = x.to(torch.float32) + residual.to(torch.float32)
    new_residual = s.to(orig)
    var = s.pow(2).mean(dim=-1, keepdim=True)
    out = (s * torch.rsqrt(var + eps)).to(weight.dtype) * weight
    return out.to(orig), new_residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's ``rms_norm`` (vllm/ir/ops/layernorm.py), weight in x's dtype."""
    s = x.to(torch.float32)
    var = s.pow(2).mean(dim=-1, keepdim=True)
    return ((s * torch.rsqrt(var + eps)).to(weight.dtype) * weight).to(x.dtype)


def decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, seq_lens: torch.Tensor,
                     block_table: torch.Tensor, scale: float) -> torch.Tensor:
    """``out [tokens, heads, dim]``: one query token per sequence (its last position) attending to
    the first ``seq_lens[s]`` tokens of its paged KV cache, block ``j`` of sequence ``s`` at
    ``block_table[s, j]``, laid out as vLLM's CPU "vec" attention writes it (csrc/kernels.h): the
    halves ``key_cache``/``value_cache`` ``[blocks, kv_heads, block_size, dim]`` of one cache tensor,
    whose key block holds the keys column-major (key ``(t, d)`` at ``d * block_size + t``) and whose
    value block holds the values row-major. Query head ``i`` reads KV head ``i // (heads // kv_heads)``.
    ``softmax(scale * q . k) . v`` in float64, returned in the query's dtype; a sequence of no
    tokens gives zeros."""
    tokens, heads, dim = query.shape
    kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    out = torch.zeros_like(query)
    for s in range(tokens):
        n = int(seq_lens[s])
        if n == 0:
            continue
        ids = block_table[s, : -(-n // block_size)].long()
        blocks = len(ids)
        # key_cache[ids] copies each block's raw [block_size * dim] elements: read them as [dim, block_size]
        k = key_cache[ids].reshape(blocks, kv_heads, dim, block_size).permute(1, 0, 3, 2)
        k = k.reshape(kv_heads, blocks * block_size, dim)[:, :n].double()  # [kv_heads, n, dim]
        v = value_cache[ids].transpose(0, 1).reshape(kv_heads, -1, dim)[:, :n].double()
        q = query[s].double().reshape(kv_heads, heads // kv_heads, dim)
        p = torch.softmax(torch.einsum("hgd,hnd->hgn", q, k) * scale, dim=-1)
        out[s] = torch.einsum("hgn,hnd->hgd", p, v).reshape(heads, dim).to(query.dtype)
    return out


# -- edgectl's int8 KV (csrc/kernels.h): vLLM's cache tensor with int8 elements, a block's keys in groups of
# four dimensions (key ``(t, d)`` at ``(d // 4) * 4 * block_size + 4 * t + d % 4``), its values in groups of
# four tokens (value ``(t, d)`` at ``(t // 4) * 4 * dim + 4 * d + t % 4``), and a float32 scale per token,
# KV head and half in ``scales [blocks, kv_heads, 2, block_size]``. The block size a multiple of 4.
WEIGHT_RUN = 32  # slots of a block whose attention weights share one scale (decode_attention_int8)
QUANT_FLOOR = 1e-30  # a row or run whose largest magnitude is below it quantizes to zeros, scale 0 (kernels.h)


def _quantize_steps(top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``127 / top`` and ``top / 127`` in float32, both 0 where ``top`` is below :data:`QUANT_FLOOR`
    (``torch.full_like(top, 127) / top``, not ``127.0 / top``: the latter is reciprocal(top) * 127, another
    rounding)."""
    top = top.float()
    kept = top >= QUANT_FLOOR
    inv = torch.where(kept, torch.full_like(top, 127.0) / torch.where(kept, top, torch.ones_like(top)),
                      torch.zeros_like(top))
    return inv, torch.where(kept, top / 127.0, torch.zeros_like(top))


def quantize_kv_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., dim]`` -> int8 ``q`` and float32 ``scale [...]``: ``scale = max|x| / 127``,
    ``q = round_half_even(x * (127 / max|x|))`` in -127..127 (0 and scale 0 for a row whose max|x| is
    below :data:`QUANT_FLOOR`, an all-zero one)."""
    xf = x.float()
    inv, step = _quantize_steps(xf.abs().amax(dim=-1))
    q = torch.round(xf * inv.unsqueeze(-1)).clamp(-127, 127)
    return q.to(torch.int8), step


def kv_write_int8(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  scales: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Token ``i``'s ``key``/``value [tokens, kv_heads, dim]`` quantized (:func:`quantize_kv_rows`) into
    slot ``slot_mapping[i]`` (``block * block_size + t``; negative: skipped) of the int8 halves
    ``[blocks, kv_heads, block_size, dim]`` (keys in groups of four dimensions, values in groups of four
    tokens) and of ``scales``."""
    block_size, dim = key_cache.shape[2], key_cache.shape[3]
    kv_heads = key_cache.shape[1]
    kq, ks = quantize_kv_rows(key)
    vq, vs = quantize_kv_rows(value)
    for i in range(key.shape[0]):
        slot = int(slot_mapping[i])
        if slot < 0:
            continue
        b, t = divmod(slot, block_size)
        key_cache[b].view(kv_heads, dim * block_size).view(kv_heads, dim // 4, block_size, 4)[:, :, t] = \
            kq[i].view(kv_heads, dim // 4, 4)
        value_cache[b].view(kv_heads, block_size // 4, dim, 4)[:, t // 4, :, t % 4] = vq[i]
        scales[b, :, 0, t] = ks[i]
        scales[b, :, 1, t] = vs[i]


def _sequence_int8(key_cache: torch.Tensor, value_cache: torch.Tensor, scales: torch.Tensor,
                   block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The int8 keys and values of the blocks ``block_ids`` in token order, ``[kv_heads, tokens, dim]``
    each, and their scales ``[kv_heads, 2, tokens]``."""
    kv_heads, block_size, dim = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    ids = block_ids.long()
    blocks = len(ids)
    k = key_cache[ids].reshape(blocks, kv_heads, dim // 4, block_size, 4).permute(1, 0, 3, 2, 4)
    v = value_cache[ids].reshape(blocks, kv_heads, block_size // 4, dim, 4).permute(1, 0, 2, 4, 3)
    s = scales[ids].permute(1, 2, 0, 3).reshape(kv_heads, 2, blocks * block_size)
    return k.reshape(kv_heads, -1, dim), v.reshape(kv_heads, -1, dim), s


def dequantize_kv_int8(key_cache: torch.Tensor, value_cache: torch.Tensor, scales: torch.Tensor,
                       block_ids: torch.Tensor, n: int, dtype: torch.dtype = torch.float32
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` keys and values of a sequence whose blocks are ``block_ids``, as
    ``[kv_heads, n, dim]`` each in ``dtype`` (element times its token's scale)."""
    k, v, s = _sequence_int8(key_cache, value_cache, scales, block_ids)
    k = (k[:, :n].float() * s[:, 0, :n, None]).to(dtype)
    v = (v[:, :n].float() * s[:, 1, :n, None]).to(dtype)
    return k, v


def quantize_weights(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """Attention weights ``w [..., tokens]`` (>= 0, token ``t`` in slot ``t % block_size`` of its block)
    as ``decode_attention_int8`` uses them: in runs of :data:`WEIGHT_RUN` slots of a block (the last run of
    a block shorter when the block size is not a multiple), ``d = max w / 127`` and
    ``w8 = round_half_even(w * (127 / max w))`` in 0..127 (all 0 for a run whose maximum is below
    :data:`QUANT_FLOOR`); returns ``w8 * d``."""
    lead, n = w.shape[:-1], w.shape[-1]
    blocks, runs = -(-n // block_size), -(-block_size // WEIGHT_RUN)
    slots = torch.zeros(*lead, blocks * block_size, dtype=w.dtype)
    slots[..., :n] = w
    padded = torch.zeros(*lead, blocks, runs * WEIGHT_RUN, dtype=w.dtype)
    padded[..., :block_size] = slots.view(*lead, blocks, block_size)
    by_run = padded.view(*lead, blocks, runs, WEIGHT_RUN)
    inv, step = _quantize_steps(by_run.amax(dim=-1, keepdim=True))
    wq = torch.round(by_run * inv).clamp(0, 127) * step
    return wq.view(*lead, blocks, runs * WEIGHT_RUN)[..., :block_size].reshape(*lead, -1)[..., :n]


def decode_attention_int8(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          scales: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """:func:`decode_attention` over an int8 KV: each query row quantized as a key row is
    (:func:`quantize_kv_rows`), ``s_t = scale * qd * key_scale_t * (q8 . k8_t)``, the weights
    ``p_t = softmax(s)_t`` times the token's value scale quantized (:func:`quantize_weights`) and
    ``out = sum_t w_t * v8_t``; in float64."""
    tokens, heads, dim = query.shape
    kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    q8, qd = quantize_kv_rows(query)  # [tokens, heads, dim], [tokens, heads]
    out = torch.zeros_like(query)
    for s in range(tokens):
        n = int(seq_lens[s])
        if n == 0:
            continue
        k8, v8, sc = _sequence_int8(key_cache, value_cache, scales, block_table[s, : -(-n // block_size)])
        k = k8[:, :n].double() * sc[:, 0, :n, None].double()
        q = (q8[s].double() * qd[s].double()[:, None]).reshape(kv_heads, heads // kv_heads, dim)
        p = torch.softmax(torch.einsum("hgd,hnd->hgn", q, k) * scale, dim=-1)
        w = quantize_weights(p * sc[:, None, 1, :n].double(), block_size)
        out[s] = torch.einsum("hgn,hnd->hgd", w, v8[:, :n].double()).reshape(heads, dim).to(query.dtype)
    return out
