"""The speech bench's arms: the text bench's launchers where they fit, and the anchors.

- ``planned``: edgectl's worker on edgectl's plan for the model, the text bench's
  ``arms.WorkerArm`` as it is (read-back ``GET /edgectl/effective``, checked against the plan);
  ``planned-float16``, ``planned-float32``, ``planned-compiled``, ``planned-w4a8``,
  ``planned-w8a8`` and ``planned-w8a8-float32`` (not run unless asked): the same plan in float16 or
  float32, in vLLM's compiled mode, or with the linear layers on edgectl's w4a8 or w8a8 kernels (the
  rest in float32 for the last), each planned by the planner with that override.
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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgectl import launch
from edgectl.bench.arms import (
    ArmSpec,
    BenchContext,
    PreparedArm,
    WorkerArm,
    parse_names,
)
from edgectl.bench.stock_vllm import StockVllmArm
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
    ArmSpec("planned-w8a8", "worker", {"weight_format": "w8a8"},
            "edgectl's plan with Whisper's linear layers on edgectl's int8 kernels (w8a8, blocks of 32, one scale)"),
    ArmSpec("planned-w8a8-float32", "worker", {"weight_format": "w8a8", "speech_dtype": "float32"},
            "edgectl's plan with Whisper's linear layers on edgectl's int8 kernels and everything else in float32 "
            "(CTranslate2's int8 recipe)"),
    ArmSpec("planned-wait-passive", "worker", {"thread_wait": "passive"},
            "edgectl's plan with its OpenMP threads sleeping at once between parallel regions (OMP_WAIT_POLICY=PASSIVE)"),
    ArmSpec("planned-wait-spin", "worker", {"thread_wait": "spin"},
            "edgectl's plan with its OpenMP threads spinning before they sleep (libgomp's default)"),
    ArmSpec("planned-wait-spin-short", "worker", {"thread_wait": "spin-short"},
            "edgectl's plan with its OpenMP threads spinning briefly, then sleeping (GOMP_SPINCOUNT=10000)"),
    ArmSpec("planned-head-dense", "worker", {"speech_head": "dense"},
            "edgectl's plan with the logits from the dense table in the model's dtype (no int8 scan)"),
    ArmSpec("planned-1-thread", "worker", {"threads": 1}, "edgectl's plan on one OpenMP thread"),
    ArmSpec("planned-lean-attention", "worker", {"lean_attention": True},
            "edgectl's plan with the decoder's self-attention calls into vLLM's attention ops made the lean way "
            "(the same ops, the same arguments; cross-attention and the encoder keep vLLM's methods)"),
    ArmSpec("planned-vllm-attention-calls", "worker", {"lean_attention": False},
            "edgectl's plan with every attention call through vLLM's own methods (the control of the lean path)"),
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
    return parse_names(text, ARMS, DEFAULT_ARMS, "speech")


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
            arms.append(WorkerArm(spec, ctx) if spec.launcher == "worker" else StockVllmArm(spec, ctx))
        except EdgectlError as exc:
            skipped[name] = f"cannot be planned here: {exc.message}"
    return arms, skipped
