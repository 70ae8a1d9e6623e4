"""What a leaner Python path into vLLM's CPU attention would save a decode step (a study, not a lever):
edgectl's worker with ``CPUAttentionBackendImpl.forward`` and ``do_kv_cache_update``
(vllm/v1/attention/backends/cpu_attn.py) replaced by versions that call the same two C++ ops with the
same arguments, but keep each layer's key and value views of its cache instead of making them at every
call, skip slicing the query and output when the step has no padding, and pass the ops' arguments
positionally to ``torch.ops._C`` instead of through vLLM's keyword wrappers. Only a decoder layer's
calls with metadata and no output quantization take the lean path; anything else goes to vLLM's methods.

``kill -USR2 <pid>`` switches the lean path on and off (it starts off), so one server, one compiled graph
and one KV cache are measured both ways in alternating requests; the switch's state is appended to
/tmp/lean_attention.txt at each switch. Run it as the worker is run (``edgectl serve`` writes a plan):

    /opt/edgectl/venv/bin/python -OO -P scripts/study/lean_attention_methods.py --plan PLAN.json

docs/kernels.md "On x86_64-amx the C++ wrapper pays" (what vLLM's attention ops cost above their C++).
"""
import signal
import sys

from edgectl_runtime.service import worker as wk

LEAN = [False]
_VIEWS: dict[int, tuple] = {}  # id(layer) → (its KV cache tensor, key view, value view)


def _views(layer, kv_cache):
    kept = _VIEWS.get(id(layer))
    if kept is None or kept[0] is not kv_cache:
        blocks, kv_heads, block_size, _ = kv_cache.size()
        key_cache, value_cache = kv_cache.view(blocks, kv_heads, block_size * 2, -1).chunk(2, dim=2)
        kept = _VIEWS[id(layer)] = (kv_cache, key_cache, value_cache)
    return kept[1], kept[2]


def _install() -> None:
    import torch
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends import cpu_attn

    cls = cpu_attn.CPUAttentionBackendImpl
    forward, update = cls.forward, cls.do_kv_cache_update
    update_op, attention_op = torch.ops._C.cpu_attn_reshape_and_cache, torch.ops._C.cpu_attention_with_kv_cache

    def lean_update(self, layer, key, value, kv_cache, slot_mapping):
        if not LEAN[0] or self.attn_type != AttentionType.DECODER:
            return update(self, layer, key, value, kv_cache, slot_mapping)
        key_cache, value_cache = _views(layer, kv_cache)
        update_op(key, value, key_cache, value_cache, slot_mapping, layer.isa, layer._k_scale_float,
                  layer._v_scale_float, self.kv_cache_dtype)
        return None

    def lean_forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                     output_block_scale=None):
        if (not LEAN[0] or attn_metadata is None or output_scale is not None or output_block_scale is not None
                or self.attn_type != AttentionType.DECODER or self.sinks is not None):
            return forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                           output_block_scale)
        tokens = attn_metadata.num_actual_tokens
        q = query if query.size(0) == tokens else query[:tokens]
        out = output if output.size(0) == tokens else output[:tokens]
        key_cache, value_cache = _views(layer, kv_cache)
        attention_op(q, key_cache, value_cache, out, attn_metadata.query_start_loc, attn_metadata.seq_lens,
                     self.scale, attn_metadata.causal, self.alibi_slopes, self.sliding_window,
                     attn_metadata.block_table, self.logits_soft_cap, attn_metadata.scheduler_metadata, self.sinks,
                     attn_metadata.dynamic_causal, layer._k_scale_float, layer._v_scale_float, self.kv_cache_dtype)
        return output

    cls.forward, cls.do_kv_cache_update = lean_forward, lean_update


_orig = wk.one_openmp_thread_by_default


def _hook(*a, **k):
    out = _orig(*a, **k)  # the plan's environment is set: vLLM may be imported now
    from edgectl_runtime.vllm_plugin.lean import skip_optional_imports

    skip_optional_imports()
    _install()
    return out


def _switch(*_):
    LEAN[0] = not LEAN[0]
    with open("/tmp/lean_attention.txt", "a") as f:
        f.write(f"lean {'on' if LEAN[0] else 'off'}\n")


wk.one_openmp_thread_by_default = _hook
signal.signal(signal.SIGUSR2, _switch)
sys.exit(wk.main())
