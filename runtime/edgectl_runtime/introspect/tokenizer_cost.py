"""What a model's tokenizer costs the worker, measured once when the model is pulled.

The per-process runtime in a device profile was measured with one model, and so carries that
model's tokenizer; a model with a larger vocabulary holds more (Gemma-3's 262144 tokens and
514906 merges: docs/memory.md "A large vocabulary"). The planner adds the difference
(``edgectl/planner/ledger.py``), from this measurement.

Run in the runtime's interpreter, in a process of its own::

    python -m edgectl_runtime.introspect.tokenizer_cost MODEL_DIR [--tokenizer lean|vllm]

It builds what the worker's one process holds of the tokenizer, with vLLM's own functions: the
tokenizer as vLLM loads it (``vllm/tokenizers/registry.py`` ``cached_get_tokenizer``, which
also caches its vocabulary as a dict), the renderer's pool of deep copies
(``vllm/tokenizers/hf.py`` ``maybe_make_thread_pool``, ``renderer_num_workers + 1`` copies),
and, for ``vllm``, the second load vLLM makes looking for a processor's chat template
(``vllm/renderers/hf.py`` ``_try_get_processor_chat_template``). It prints one JSON line:
``bytes`` is the growth of the process's anonymous resident memory (``RssAnon``), each side read
after a garbage collection and glibc's ``malloc_trim(0)``, as the worker does after its warm-up.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import sys

SCHEMA = "edgectl.tokenizer-cost/1"


def _rss_anon() -> int:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure then includes what the allocator keeps
        pass
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("RssAnon is not in /proc/self/status")


def measure(model_dir: str, tokenizer: str = "lean") -> dict:
    from edgectl_runtime.vllm_plugin import lean

    if tokenizer == "lean":
        lean.share_tokenizer()
    from vllm.config import ModelConfig
    from vllm.renderers import hf as hf_renderer
    from vllm.tokenizers.hf import maybe_make_thread_pool
    from vllm.tokenizers.registry import cached_get_tokenizer

    copies = ModelConfig.__dataclass_fields__["renderer_num_workers"].default + 1
    before = _rss_anon()
    tok = cached_get_tokenizer(model_dir, tokenizer_mode="auto", trust_remote_code=False)
    pool = maybe_make_thread_pool(copy.copy(tok), copies)
    hf_renderer._try_get_processor_chat_template(tok, revision=None, code_revision=None, trust_remote_code=False)
    after = _rss_anon()
    held = [n for n in lean.CONSTRUCTION_INPUTS if n in vars(tok)]
    del pool
    return {"schema": SCHEMA, "bytes": max(0, after - before), "tokenizer": tokenizer,
            "vocab_size": len(tok.get_vocab()), "pool_copies": copies, "construction_inputs_held": held,
            "method": "RssAnon growth: vLLM's cached tokenizer, the renderer's pool of copies, the processor probe"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.introspect.tokenizer_cost")
    parser.add_argument("model_dir")
    parser.add_argument("--tokenizer", choices=("lean", "vllm"), default="lean")
    ns = parser.parse_args(argv)
    print(json.dumps(measure(ns.model_dir, ns.tokenizer)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
