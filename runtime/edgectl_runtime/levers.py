"""The plan's decisions as the runtime's environment (see ``edgectl_runtime/env.py``).

The worker puts these into its own environment before vLLM starts; in the stock topology
vLLM's spawned processes inherit them. One place maps plan → variables, so the bench's
lever pairs differ in exactly the variable under test.
"""

from __future__ import annotations

from typing import Any

# weight format → the cpu_int4 plugin's kernel (edgectl_runtime/env.py EDGECTL_INT4_KERNEL)
_KERNEL = {"w4a16": "torch", "w4a16-vllm": "vllm"}


def environment(plan: dict[str, Any]) -> dict[str, str]:
    levers = plan.get("levers", {})
    env = {
        "EDGECTL_ROPE_CAP": "1" if levers.get("rope_cap", True) else "0",
        "EDGECTL_LAYERWISE_REPACK": "1" if levers.get("layerwise_repack", True) else "0",
        "EDGECTL_INT4_LM_HEAD": "1" if plan.get("quantize_lm_head") else "0",
        "EDGECTL_INT4_GROUP_SIZE": str(plan.get("group_size", 128)),
    }
    kernel = _KERNEL.get(plan.get("weight_format", ""))
    if kernel:
        env["EDGECTL_INT4_KERNEL"] = kernel
    return env
