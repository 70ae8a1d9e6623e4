"""The lean path into vLLM's attention ops (the plan's ``levers.lean_attention``,
runtime/edgectl_runtime/vllm_plugin/lean_attention.py) switched on and off inside one server, so one
compiled graph and one KV cache are measured both ways in alternating requests (the bench's
``lean-attention`` / ``vllm-attention-calls`` arms measure it as separate servers).

``kill -USR2 <pid>`` swaps vLLM's two CPU attention methods and the lean ones (it starts on vLLM's); the
switch's state is appended to /tmp/lean_attention.txt at each switch. Run it as the worker is run, on a
plan with the lever on; with edgectl's decode attention on too, its wrapper stays and what it falls back to
(prompts; the KV write is the class's method either way) is swapped:

    /opt/edgectl/venv/bin/python -OO -P scripts/study/lean_attention_methods.py --plan PLAN.json

docs/kernels.md "On x86_64-amx the C++ wrapper pays" (what vLLM's attention ops cost above their C++).
"""
import signal
import sys

from edgectl_runtime.service import worker as wk
from edgectl_runtime.vllm_plugin import lean_attention

LEAN = [True]  # which methods the class has now (vLLM's after the first switch at start)


def _switch(*_):
    from vllm.v1.attention.backends import cpu_attn

    cls = cpu_attn.CPUAttentionBackendImpl
    from edgectl_runtime.vllm_plugin import decode_attention

    if not lean_attention._ORIGINAL:  # the lever off
        return
    LEAN[0] = not LEAN[0]
    forward = lean_attention._forward if LEAN[0] else lean_attention._ORIGINAL["forward"]
    cls.do_kv_cache_update = lean_attention._update if LEAN[0] else lean_attention._ORIGINAL["update"]
    if decode_attention._ORIGINAL:  # edgectl's decode attention wraps the forward: swap what it falls back to
        decode_attention._ORIGINAL[0] = forward
    else:
        cls.forward = forward
    with open("/tmp/lean_attention.txt", "a") as f:
        f.write(f"lean {'on' if LEAN[0] else 'off'}\n")


_orig = wk.one_openmp_thread_by_default


def _hook(*a, **k):
    out = _orig(*a, **k)  # the plan's environment is set and the plugin registered when vLLM is imported
    from edgectl_runtime.vllm_plugin.lean import skip_optional_imports

    skip_optional_imports()  # as the worker would before vLLM's first import
    from vllm import plugins

    plugins.load_general_plugins()
    _switch()  # start on vLLM's methods
    return out


wk.one_openmp_thread_by_default = _hook
signal.signal(signal.SIGUSR2, _switch)
sys.exit(wk.main())
