"""A plan as vLLM server arguments: the one translation, used by the worker and the bench.

Pure: the control plane can show exactly what the worker will run (``deploy --dry-run``)
without importing vLLM.
"""

from __future__ import annotations

from typing import Any

CPU_INT4 = "cpu_int4"


def quantization_for(plan: dict[str, Any]) -> str | None:
    """The ``--quantization`` a plan needs, or None when the checkpoint says it itself."""
    if plan["weight_format"] == "bf16":
        return None
    if plan["model"].get("checkpoint_format") in ("cpu_int4", "gptq", "awq"):
        return None  # config.json's quantization_config names the method
    if plan["weight_format"] in ("w4a16", "w4a16-vllm"):
        return CPU_INT4  # the plugin's kernel (torch or vLLM's) comes from EDGECTL_INT4_KERNEL
    raise ValueError(f"unknown weight format {plan['weight_format']!r}")


def server_args(plan: dict[str, Any], *, stock: bool = False) -> list[str]:
    """Arguments for vLLM's OpenAI server that carry every setting of the plan.

    ``stock=True`` drops what only edgectl's runtime understands (its quantization method and
    the in-process executor) — the bench's control arm: unmodified vLLM on the same model
    with the same context, concurrency and KV bytes.
    """
    serve = plan["serve"]
    args = [
        "--model", plan["model"]["path"],
        "--served-model-name", plan["model"]["name"],
        "--host", str(serve["host"]),
        "--port", str(serve["port"]),
        "--dtype", "bfloat16",
        "--max-model-len", str(plan["max_model_len"]),
        "--max-num-seqs", str(plan["max_num_seqs"]),
        "--max-num-batched-tokens", str(plan["max_num_batched_tokens"]),
        "--kv-cache-memory-bytes", str(plan["kv_cache_bytes"]),
        "--block-size", str(plan["block_size"]),
        "--seed", "0",
    ]
    if plan["compilation"] == "eager":
        args.append("--enforce-eager")
    if not stock:
        quant = quantization_for(plan)
        if quant:
            args += ["--quantization", quant]
        if plan["topology"] == "single-process":
            args += ["--distributed-executor-backend", "uni"]
        else:
            # vLLM's worker is another process: the read-back runs there, called by name
            # (a function cannot be sent to it).
            args += ["--worker-extension-cls", "edgectl_runtime.readback.ReadbackExtension"]
        args += ["--shutdown-timeout", str(max(1, int(plan["timeouts"]["stop_s"]) - 5))]
    return args
