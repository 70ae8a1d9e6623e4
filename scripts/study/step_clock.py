"""edgectl's worker with wall-clock timers around the parts of vLLM's engine step (a study: where a decode
step's time goes by the clock, docs/kernels.md "On x86_64-amx the C++ wrapper pays"). Run it as the worker
is run, with a plan (``edgectl serve`` writes one; its environment as the worker's), send requests, then
``kill -USR1 <pid>``: the milliseconds a step of each part since the last signal are appended to
/tmp/step_clock.txt, and the timers restart.

    /opt/edgectl/venv/bin/python -OO -P scripts/study/step_clock.py --plan PLAN.json
"""
import collections
import signal
import sys
import time

from edgectl_runtime.service import worker as wk

T = collections.defaultdict(float); N = collections.Counter()
def wrap(cls, name, label):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - t; N[label] += 1
    setattr(cls, name, w)
_orig = wk.one_openmp_thread_by_default
def _hook(*a, **k):
    r = _orig(*a, **k)
    from edgectl_runtime.vllm_plugin.lean import skip_optional_imports
    skip_optional_imports()
    from vllm.model_executor.layers import logits_processor as lp
    from vllm.v1.core.sched import scheduler as s
    from vllm.v1.engine import core as c
    from vllm.v1.worker import gpu_model_runner as g
    wrap(c.EngineCore, "step", "0 step")
    wrap(s.Scheduler, "schedule", "1 schedule")
    wrap(s.Scheduler, "update_from_output", "2 update_from_output")
    wrap(g.GPUModelRunner, "execute_model", "3 execute_model")
    wrap(g.GPUModelRunner, "_update_states", "3a _update_states")
    wrap(g.GPUModelRunner, "_prepare_inputs", "3b _prepare_inputs")
    wrap(g.GPUModelRunner, "_determine_batch_execution_and_padding", "3c _determine_batch")
    wrap(g.GPUModelRunner, "_get_slot_mappings", "3d _get_slot_mappings")
    wrap(g.GPUModelRunner, "_build_attention_metadata", "3e _build_attention_metadata")
    wrap(g.GPUModelRunner, "_preprocess", "3f _preprocess")
    wrap(g.GPUModelRunner, "_model_forward", "3g _model_forward")
    wrap(lp.LogitsProcessor, "forward", "3h logits (the head)")
    wrap(g.GPUModelRunner, "sample_tokens", "4 sample_tokens")
    wrap(g.GPUModelRunner, "_sample", "4a _sample")
    wrap(g.GPUModelRunner, "_bookkeeping_sync", "4b _bookkeeping_sync")
    return r
wk.one_openmp_thread_by_default = _hook
def dump(*_):
    n = N["0 step"] or 1
    with open("/tmp/step_clock.txt", "a") as f:
        f.write(f"steps {n}\n")
        for k in sorted(T): f.write(f"{k:30s} {1e3*T[k]/n:7.3f} ms/step  calls {N[k]}\n")
    T.clear(); N.clear()
signal.signal(signal.SIGUSR1, dump)
sys.exit(wk.main())
