"""The weight-format arms the diagnostics compare, each as vLLM settings plus the runtime
environment that selects it (the same variables the worker sets from a plan)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arm:
    quantization: str | None
    env: dict[str, str] = field(default_factory=dict)
    fused_norm: bool = False  # vLLM's norm IR ops on edgectl's provider (fused_norm.priority())


ARMS = {
    "bf16": Arm(None),
    "w4a16": Arm("cpu_int4", {"EDGECTL_INT4_KERNEL": "torch", "EDGECTL_LM_HEAD": "dense"}),
    "w4a16-int8": Arm("cpu_int4", {"EDGECTL_INT4_KERNEL": "torch", "EDGECTL_LM_HEAD": "int8"}),
    "w4a8": Arm("cpu_int4", {"EDGECTL_INT4_KERNEL": "edgectl", "EDGECTL_LM_HEAD": "dense"}, True),
    "w4a8-int8": Arm("cpu_int4", {"EDGECTL_INT4_KERNEL": "edgectl", "EDGECTL_LM_HEAD": "int8"}, True),
    "w4a8-int4": Arm("cpu_int4", {"EDGECTL_INT4_KERNEL": "edgectl", "EDGECTL_LM_HEAD": "int4"}, True),
    "w4a8-int8-nonorm": Arm("cpu_int4", {"EDGECTL_INT4_KERNEL": "edgectl", "EDGECTL_LM_HEAD": "int8"}, False),
}


def engine_kwargs(arm: str, model: str, dtype: str, max_model_len: int = 2048, kv_mib: int = 64) -> dict:
    """vLLM ``LLM(...)`` arguments of an arm (its environment must be set in the process already)."""
    a = ARMS[arm]
    kwargs = dict(model=model, max_model_len=max_model_len, max_num_seqs=1, kv_cache_memory_bytes=kv_mib << 20,
                  enforce_eager=True, dtype=dtype, seed=0)
    if a.quantization:
        kwargs["quantization"] = a.quantization
    if a.fused_norm:
        from edgectl_runtime.vllm_plugin import fused_norm

        kwargs["ir_op_priority"] = fused_norm.priority()
    return kwargs


def run_in_own_process(module: str, args: list[str], env: dict[str, str]) -> dict:
    """Run ``python -m MODULE ARGS --result PATH`` and return the JSON it wrote to PATH.

    The result goes through a file, not stdout: vLLM logs to stdout, also after the child's own
    output (at engine shutdown). RuntimeError with the end of the child's stderr if it failed.
    """
    fd, path = tempfile.mkstemp(prefix="edgectl-arm-", suffix=".json")
    os.close(fd)
    try:
        done = subprocess.run([sys.executable, "-m", module, *args, "--result", path], env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[-3:])}: exit {done.returncode}:\n{done.stderr[-3000:]}")
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)
