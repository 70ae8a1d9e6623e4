"""Fidelity of weight formats against bf16, offline: the bench's comparison on the shipped prompts.

``python -m edgectl_runtime.tools.diagnostics.fidelity MODEL_DIR [--arms bf16,w4a16,w4a8,w4a8-int8]``

Each arm loads the model in its own process (vLLM's offline engine, eager, one sequence) with
its ``cpu_int4`` settings, and collects, for every prompt of ``edgectl/data/prompts/fidelity.json``,
the top-20 log-probabilities at every teacher-forced position and at the next token — the
data ``edgectl bench`` collects over HTTP (``edgectl.bench.fidelity.collect_vllm``). Every arm is
then compared with the ``bf16`` arm by ``edgectl.contract.fidelity.compare``: top-1 agreement and
mean KL (top-20 + "other" bins). A measurement tool for choosing formats, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from edgectl.contract.fidelity import (
    METHOD,
    TOP_K,
    compare,
    perplexity,
    read_prompt_set,
)
from edgectl_runtime.tools.diagnostics.arms import (
    ARMS,
    engine_kwargs,
    run_in_own_process,
)


def _collect(model: str, arm: str, group: int, dtype: str) -> dict:
    """Runs in the arm's process: the collect_vllm structure, from the offline engine."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**engine_kwargs(arm, model, dtype), max_logprobs=TOP_K)
    tok = llm.get_tokenizer()
    ps = read_prompt_set()
    items = []
    for text in [*ps.prompts, ps.perplexity_text]:
        ids = tok.encode(text)
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                           SamplingParams(max_tokens=1, temperature=0, logprobs=TOP_K, prompt_logprobs=TOP_K))[0]
        positions = [None if p is None else {int(t): float(lp.logprob) for t, lp in p.items()}
                     for p in out.prompt_logprobs]
        nxt = {int(t): float(lp.logprob) for t, lp in out.outputs[0].logprobs[0].items()}
        items.append({"ids": ids, "positions": positions, "next": nxt})
    return {"method": "vllm-prompt-logprobs", "k": TOP_K, "prompts": items[:-1], "perplexity": items[-1]}


def run(model: str, arms: list[str], group: int, dtype: str) -> dict:
    raw = {}
    for arm in ["bf16", *[a for a in arms if a != "bf16"]]:
        env = dict(os.environ)
        env.update(ARMS[arm].env)
        env["EDGECTL_INT4_GROUP_SIZE"] = str(group)
        raw[arm] = run_in_own_process("edgectl_runtime.tools.diagnostics.fidelity",
                                      ["--group-size", str(group), "--dtype", dtype, model, "--collect", arm], env)
    out = {"schema": "edgectl.fidelity-offline/1", "model": model, "dtype": dtype, "group_size": group,
           "method": METHOD, "arms": {}}
    for arm, data in raw.items():
        cmp = compare(raw["bf16"], data)
        cmp["perplexity"] = perplexity(data["perplexity"])
        out["arms"][arm] = cmp
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.diagnostics.fidelity", description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--arms", default="bf16,w4a16,w4a8,w4a8-int8")
    p.add_argument("--group-size", type=int, default=32, help="cpu_int4 group for the w4a16 arms")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--collect", default=None, help=argparse.SUPPRESS)  # one arm, in its own process
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.collect:
        with open(a.result, "w") as f:
            json.dump(_collect(a.model, a.collect, a.group_size, a.dtype), f)
        return 0
    unknown = [x for x in a.arms.split(",") if x not in ARMS]
    if unknown:
        print(f"error: unknown arm {unknown[0]!r}: use {', '.join(ARMS)}", file=sys.stderr)
        return 2
    print(json.dumps(run(a.model, a.arms.split(","), a.group_size, a.dtype), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
