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
