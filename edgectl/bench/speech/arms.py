"""The speech bench's arms: the text bench's launchers where they fit, and the anchors.

- ``planned``: edgectl's worker on edgectl's plan for the model, the text bench's
  ``arms.WorkerArm`` as it is (read-back ``GET /edgectl/effective``, checked against the plan);
  ``planned-float16``, ``planned-float32``, ``planned-compiled`` and ``planned-w4a8`` (not run
  unless asked): the same plan in float16 or float32, in vLLM's compiled mode, or with the linear
  layers on edgectl's w4a8 kernels, each planned by the planner with that override.
- ``stock``: vLLM as it ships, ``python -m vllm.entrypoints.openai.api_server --model DIR`` with
  its defaults; only the served name, host and port are given so the bench can reach it, and
  edgectl's plugin is left out (``VLLM_PLUGINS``). Read-back: ``/v1/models`` (the model it loaded,
  its context), ``/metrics`` ``vllm:cache_config_info`` (the KV it allocated). ``stock-kv`` (not
  run unless asked): the same given the plan's KV bytes and transcriptions at once, as the text
  bench's ``stock`` is, so its memory compares with the planned arm's.
- ``faster-whisper-int8``, ``faster-whisper-float32``, ``whisper.cpp``: the anchors, not servers.
  One run of ``edgectl_runtime.tools.speech_anchor`` per measurement (the clip set one by one,
  then four clips at once in each of the engine's ways of doing four), faster-whisper on the
  CTranslate2 files the model was pulled from, whisper.cpp on a ggml file made from the same
  weights (``edgectl_runtime.tools.whisper_ggml``, float16 as whisper.cpp's own models).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgectl import launch
from edgectl.bench.arms import (
    ArmSpec,
    BenchContext,
    Crashed,
    PreparedArm,
    WorkerArm,
    cache_config_info,
)
from edgectl.bench.server import ServerProcess
from edgectl.client import Client
from edgectl.contract.effective import SCHEMA as EFFECTIVE_SCHEMA
from edgectl.contract.effective import Effective
from edgectl.errors import EdgectlError

# The anchors' ways of doing four clips at once (the driver's --mode): faster-whisper's four worker
# processes, each with its own model, and its BatchedInferencePipeline, one model decoding the four
# together; whisper.cpp has no batched pipeline, only the workers. The better one is quoted.
FASTER_WHISPER_TOGETHER = ("workers", "batched")
WHISPER_CPP_TOGETHER = ("workers",)

ARMS: dict[str, ArmSpec] = {a.name: a for a in [
    ArmSpec("planned", "worker", {}, "edgectl's worker on edgectl's plan for the model"),
    ArmSpec("planned-float16", "worker", {"weight_format": "float16"},
            "edgectl's plan with the weights and activations in float16, as the checkpoint stores them"),
    ArmSpec("planned-float32", "worker", {"weight_format": "float32"},
            "edgectl's plan with the weights and activations in float32 (what a CPU without bf16 arithmetic gets)"),
    ArmSpec("planned-compiled", "worker", {"compilation": "default"},
            "edgectl's plan with vLLM's compiled mode (it compiles Whisper's decoder, not the encoder)"),
    ArmSpec("planned-w4a8", "worker", {"weight_format": "w4a8"},
            "edgectl's plan with Whisper's linear layers on edgectl's int4 kernels (w4a8, blocks of 32)"),
    ArmSpec("planned-wait-passive", "worker", {"thread_wait": "passive"},
            "edgectl's plan with its OpenMP threads sleeping at once between parallel regions (OMP_WAIT_POLICY=PASSIVE)"),
    ArmSpec("planned-wait-spin", "worker", {"thread_wait": "spin"},
            "edgectl's plan with its OpenMP threads spinning before they sleep (libgomp's default)"),
    ArmSpec("planned-head-dense", "worker", {"speech_head": "dense"},
            "edgectl's plan with the logits from the dense table in the model's dtype (no int8 scan)"),
    ArmSpec("planned-1-thread", "worker", {"threads": 1}, "edgectl's plan on one OpenMP thread"),
    ArmSpec("stock", "vllm-stock", {}, "vLLM as it ships: python -m vllm.entrypoints.openai.api_server --model DIR "
                                       "with its defaults (the served name, host and port only; edgectl's plugin "
                                       "left out)"),
    ArmSpec("stock-kv", "vllm-stock", {"plan_kv": True},
            "vLLM as it ships, given the plan's KV bytes and transcriptions at once (--kv-cache-memory-bytes, "
            "--max-num-seqs): its memory at the planned arm's KV (with its defaults vLLM takes 92% of the "
            "host's memory for KV, and refuses to start when other work holds more than 8%)"),
    ArmSpec("faster-whisper-int8", "anchor",
            {"engine": "faster-whisper", "compute_type": "int8", "together": FASTER_WHISPER_TOGETHER},
            "faster-whisper on the CTranslate2 files the model was pulled from, int8 compute"),
    ArmSpec("faster-whisper-float32", "anchor",
            {"engine": "faster-whisper", "compute_type": "float32", "together": FASTER_WHISPER_TOGETHER},
            "faster-whisper on the CTranslate2 files the model was pulled from, float32 compute"),
    ArmSpec("whisper.cpp", "anchor", {"engine": "whisper.cpp", "compute_type": "float16", "together": WHISPER_CPP_TOGETHER},
            "whisper.cpp (pywhispercpp's bundled library) on a ggml file of the same weights, float16"),
]}
DEFAULT_ARMS = ("planned", "stock", "faster-whisper-int8", "faster-whisper-float32", "whisper.cpp")
# The Python module each anchor engine needs in the runtime interpreter, and the package that has it.
ENGINE_MODULES = {"faster-whisper": "faster_whisper", "whisper.cpp": "pywhispercpp"}
PACKAGES = {"faster-whisper": "faster-whisper", "whisper.cpp": "pywhispercpp"}


def parse_arm_names(text: str | None) -> list[str]:
    """``--arms a,b`` (or ``all``) as known speech arm names, in the order given."""
    if not text:
        return list(DEFAULT_ARMS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(ARMS)
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise EdgectlError(f"--arms: unknown speech arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)} (or all)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EdgectlError(f"--arms: {', '.join(dupes)} given twice")
    if not names:
        raise EdgectlError(f"--arms: no arm given; known: {', '.join(ARMS)} (or all)")
    return names


class StockSpeechArm(PreparedArm):
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


class AnchorArm:
    """An engine measured in its own process, one run per measurement (no server)."""

    launcher = "anchor"

    def __init__(self, spec: ArmSpec, ctx: BenchContext, model: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.ctx = ctx
        self.engine: str = spec.overrides["engine"]
        self.compute_type: str = spec.overrides["compute_type"]
        self.together_modes: tuple[str, ...] = tuple(spec.overrides["together"])
        self.model = model  # faster-whisper: the CTranslate2 directory; whisper.cpp: the ggml file

    def threads(self, mode: str, concurrency: int) -> int:
        """Threads of one model instance: every usable CPU, shared out among ``workers``."""
        return max(1, self.ctx.usable_cpus // concurrency) if mode == "workers" else self.ctx.usable_cpus

    def args(self, mode: str, concurrency: int, clips_json: Path) -> list[str]:
        return ["--engine", self.engine, "--model", str(self.model), "--clips", str(clips_json),
                "--compute-type", self.compute_type, "--threads", str(self.threads(mode, concurrency)),
                "--mode", mode, "--concurrency", str(concurrency)]

    def command(self, mode: str, concurrency: int, clips_json: Path) -> list[str]:
        args = self.args(mode, concurrency, clips_json)
        custom = self.ctx.launchers.get(self.launcher)
        if custom is not None:  # a stand-in for the driver (tests): its command, then the driver's arguments
            return [*custom(self, 0, clips_json), *args]  # type: ignore[arg-type]
        return launch.command(self.ctx.runtime_python, launch.SPEECH_ANCHOR, args)

    def env(self) -> dict[str, str]:
        return dict(self.ctx.child_env)

    def describe(self) -> dict[str, Any]:
        return {"launcher": self.launcher, "description": self.spec.description, "engine": self.engine,
                "compute_type": self.compute_type, "model": str(self.model),
                "together_modes": list(self.together_modes), "plan": None}


SpeechArm = PreparedArm | AnchorArm


def prepare_arms(names: list[str], ctx: BenchContext, *,
                 anchor_models: Mapping[str, Path | str]) -> tuple[list[SpeechArm], dict[str, str]]:
    """The arms to run, and the arms skipped with the reason. ``anchor_models``: per engine, the
    file or directory it reads, or (a string) why it cannot run here."""
    arms: list[SpeechArm] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = ARMS[name]
        if spec.launcher == "anchor":
            model = anchor_models.get(spec.overrides["engine"], "not prepared")
            if isinstance(model, str):
                skipped[name] = model
            else:
                arms.append(AnchorArm(spec, ctx, model))
            continue
        try:
            arms.append(WorkerArm(spec, ctx) if spec.launcher == "worker" else StockSpeechArm(spec, ctx))
        except EdgectlError as exc:
            skipped[name] = f"cannot be planned here: {exc.message}"
    return arms, skipped
