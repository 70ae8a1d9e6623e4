"""vLLM as it ships, given only the model: the stock arm of the speech and vision benches.

``python -m vllm.entrypoints.openai.api_server --model DIR`` with its defaults; only the served
name, host and port are given so the bench can reach it, and edgectl's plugin is left out
(``VLLM_PLUGINS``). Read-back: ``/v1/models`` (the model it loaded, its context), ``/metrics``
``vllm:cache_config_info`` (the KV it allocated). With ``plan_kv`` in its overrides it is given the
plan's KV bytes and requests at once (``--kv-cache-memory-bytes``, ``--max-num-seqs``), so its memory
compares with the planned arm's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edgectl.bench.arms import (
    ArmSpec,
    BenchContext,
    Crashed,
    PreparedArm,
    cache_config_info,
)
from edgectl.bench.server import ServerProcess
from edgectl.client import Client
from edgectl.contract.effective import SCHEMA as EFFECTIVE_SCHEMA
from edgectl.contract.effective import Effective
from edgectl.errors import EdgectlError


class StockVllmArm(PreparedArm):
    """vLLM's OpenAI server given only the model (and how to reach it)."""

    launcher = "vllm-stock"

    def __init__(self, spec: ArmSpec, ctx: BenchContext) -> None:
        super().__init__(spec, ctx)
        if spec.overrides.get("plan_kv") and ctx.planned is None:
            raise EdgectlError("it takes its KV bytes from edgectl's plan, and there is none")
        self.kv_cache_bytes = ctx.planned.kv_cache_bytes if spec.overrides.get("plan_kv") else None
        self.max_num_seqs = ctx.planned.max_num_seqs if spec.overrides.get("plan_kv") else None

    def server_args(self, port: int) -> list[str]:
        sized = ([] if self.kv_cache_bytes is None else
                 ["--kv-cache-memory-bytes", str(self.kv_cache_bytes), "--max-num-seqs", str(self.max_num_seqs)])
        return ["--model", self.ctx.model_path, "--served-model-name", self.ctx.model_name, *sized,
                "--host", "127.0.0.1", "--port", str(port)]

    def default_command(self, port: int, pass_dir: Path) -> list[str]:
        return [self.ctx.runtime_python, "-m", "vllm.entrypoints.openai.api_server", *self.server_args(port)]

    def env(self) -> dict[str, str]:
        # every general plugin but edgectl's (provenance.stock_plugins): vLLM as it ships
        return {**self.ctx.child_env, "VLLM_PLUGINS": self.ctx.stock_plugins}

    def wait_ready(self, client: Client, server: ServerProcess, deadline: float) -> None:
        try:
            super().wait_ready(client, server, deadline)
        except Crashed as exc:
            # vLLM ends with "Engine core initialization failed. See root cause above.": say that cause
            cause = engine_root_cause(server.log_tail(400))
            if cause is None or cause in str(exc):
                raise
            raise Crashed(f"{exc} (root cause: {cause})", invalid=exc.invalid) from None

    def readback(self, client: Client, server: ServerProcess) -> dict[str, Any]:
        models = client.get_json("/v1/models", timeout=30).get("data") or [{}]
        info = cache_config_info(client.get_text("/metrics", timeout=30))
        return {"schema": EFFECTIVE_SCHEMA,
                "readback_via": "/v1/models (model, context), /metrics vllm:cache_config_info (KV)",
                "max_model_len": models[0].get("max_model_len"), "model_path": models[0].get("root"),
                "cache_config_info": {k: info.get(k) for k in (
                    "num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "enable_prefix_caching")},
                "unverified": ["threads, dtype, max_num_seqs: stock vLLM has no read-back route for them"]}

    def check(self, effective: Effective, processes: int) -> list[str]:
        """The one setting the arm asks for: the model directory."""
        path = effective.model_path
        if path is None:
            return ["/v1/models does not say which model it loaded"]
        if Path(path).resolve() != Path(self.ctx.model_path).resolve():
            return [f"vLLM loaded {path}, not {self.ctx.model_path}"]
        got = (effective.cache_config_info or {}).get("kv_cache_memory_bytes")
        if self.kv_cache_bytes is not None and got not in (None, "None") and int(got) != self.kv_cache_bytes:
            return [f"vLLM's KV is {got} bytes, the arm asks for {self.kv_cache_bytes}"]
        return []

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kv_cache_bytes": self.kv_cache_bytes, "max_num_seqs": self.max_num_seqs}


_ERROR_LINE = re.compile(r"\b((?:\w+\.)*\w+(?:Error|Exception)): (.+)$")


def engine_root_cause(log_lines: list[str]) -> str | None:
    """The first exception other than RuntimeError in a vLLM server's log lines (``Type: message``):
    the engine core's failure, which the server's own last line only points to."""
    for line in log_lines:
        if " WARNING " in line or " INFO " in line:  # e.g. vLLM's ulimit warning names an OSError it may cause
            continue
        m = _ERROR_LINE.search(line)
        if m and m.group(1).split(".")[-1] != "RuntimeError":
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None
