"""The attention layers edgectl's decode-attention kernel takes, written once for the planner (whether
the lever can take any of a model's decode calls, ``planner/engine.py``) and the runtime's plugin
(which calls it takes, ``runtime/edgectl_runtime/vllm_plugin/decode_attention.py``).

Pure Python, no torch: the planner imports it. The limits are the kernel's
(``runtime/edgectl_runtime/kernels/ops/csrc/kernels.h`` ``kAttnMaxGroup``, ``kAttnMaxBlock``,
``kAttnMaxDim``); the kernel reads vLLM's "vec" KV layout only, and vLLM 0.32 keeps a head size of
16 mod 32 in its "vec16" layout instead (``_get_attn_isa``, vllm/v1/attention/backends/cpu_attn.py:527-532).
"""

from __future__ import annotations

MAX_GROUP, MAX_BLOCK, MAX_HEAD = 16, 512, 256  # query heads per KV head, tokens per KV block, head size


def shape_refused(num_heads: int, num_kv_heads: int, head_size: int) -> str | None:
    """Why the kernel takes no decode call of a decoder layer of this shape; None when it takes them."""
    if head_size % 32 and head_size % 16 == 0:
        return (f"vLLM keeps the KV of a head size of {head_size} (16 mod 32) in its \"vec16\" layout, which "
                "edgectl's decode attention does not read")
    if head_size % 16 or head_size > MAX_HEAD:
        return f"edgectl's decode attention takes head sizes that are multiples of 16 up to {MAX_HEAD}, not {head_size}"
    if num_kv_heads < 1 or num_heads % num_kv_heads or num_heads // num_kv_heads > MAX_GROUP:
        return (f"edgectl's decode attention takes up to {MAX_GROUP} query heads per KV head, whole groups; "
                f"{num_heads} query heads over {num_kv_heads} KV heads")
    return None
