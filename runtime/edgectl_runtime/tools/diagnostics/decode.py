"""Engine decode and prefill speed per weight-format arm: interleaved passes, each a fresh engine.

``python -m edgectl_runtime.tools.diagnostics.decode MODEL_DIR --arms w4a16,w4a8-int8 [--passes 3]``

Every pass starts each arm in its own process (vLLM's offline engine, eager, one sequence,
prefix caching off), reads back the formats and the kernel ISA level the worker really holds,
then measures: decode = (N - 1) / (t(N tokens) - t(1 token)) on a fixed prompt with
``ignore_eos``; prefill = 512 fresh random token ids / t(1 token). Medians and [min-max] over
passes, and each arm's ratio to the first (the control arm). A measurement for choosing kernels
and activation dtypes on a device class; ``edgectl bench`` is the end-to-end measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

from edgectl_runtime.tools.diagnostics.arms import (
    ARMS,
    engine_kwargs,
    run_in_own_process,
)

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def _run(model: str, arm: str, dtype: str, tokens: int, seed: int) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**engine_kwargs(arm, model, dtype), enable_prefix_caching=False,
              worker_extension_cls="edgectl_runtime.service.readback.ReadbackExtension")
    rb = llm.collective_rpc("edgectl_describe")[0]
    ids = llm.get_tokenizer().encode(PROMPT)

    def timed(max_tokens: int, prompt: list[int]) -> float:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        return time.perf_counter() - t0

    timed(16, ids)  # warm-up
    t1 = min(timed(1, ids) for _ in range(3))
    tn = timed(tokens, ids)
    vocab = llm.get_tokenizer().vocab_size
    rng = random.Random(seed)
    prefill_ids = [rng.randrange(256, vocab) for _ in range(512)]
    tp = timed(1, prefill_ids)
    return {"arm": arm, "decode_tok_s": (tokens - 1) / (tn - t1), "prefill_tok_s": 512 / tp,
            "formats": rb["formats"], "isa": rb["kernel"].get("edgectl_isa"),
            "cpu_capability": rb["kernel"]["cpu_capability"], "ir_ops": rb.get("ir_ops")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.diagnostics.decode", description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--arms", default="w4a16,w4a8-int8")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="activation dtype; an arm name may end in @float32 / @bfloat16 to override it")
    p.add_argument("--run", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.run:
        arm, _, dtype = a.run.partition("@")
        result = _run(a.model, arm, dtype or a.dtype, a.tokens, a.seed)
        with open(a.result, "w") as f:
            json.dump(result, f)
        return 0
    arms = a.arms.split(",")
    unknown = [x for x in arms if x.partition("@")[0] not in ARMS]
    if unknown:
        print(f"error: unknown arm {unknown[0]!r}: use {', '.join(ARMS)} (optionally @float32)", file=sys.stderr)
        return 2
    samples: dict[str, list[dict]] = {arm: [] for arm in arms}
    for n in range(a.passes):
        for i, arm in enumerate(arms):
            env = dict(os.environ)
            env.update(ARMS[arm.partition("@")[0]].env)
            try:
                samples[arm].append(run_in_own_process(
                    "edgectl_runtime.tools.diagnostics.decode",
                    [a.model, "--tokens", str(a.tokens), "--dtype", a.dtype, "--seed", str(n * 100 + i), "--run", arm],
                    env))
            except RuntimeError as exc:
                print(f"error: arm {arm} failed: {exc}", file=sys.stderr)
                return 1
    out = {"schema": "edgectl.decode-diagnostic/1", "model": a.model, "passes": a.passes, "tokens": a.tokens,
           "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "EDGECTL_KERNEL_ISA")
                   if k in os.environ}, "arms": {}}
    control = arms[0]
    for arm, rows in samples.items():
        summary = {}
        for key in ("decode_tok_s", "prefill_tok_s"):
            vals = [r[key] for r in rows]
            ctrl = statistics.median(r[key] for r in samples[control])
            summary[key] = {"median": round(statistics.median(vals), 1), "min": round(min(vals), 1),
                            "max": round(max(vals), 1), "ratio_to_" + control: round(statistics.median(vals) / ctrl, 3)}
        summary.update(formats=rows[0]["formats"], isa=rows[0]["isa"], cpu_capability=rows[0]["cpu_capability"],
                       ir_ops=rows[0]["ir_ops"])
        out["arms"][arm] = summary
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
