"""The vision bench's arms: the text and speech benches' launchers, and llama-server with ``--mmproj``.

- ``planned``: edgectl's worker on edgectl's plan for the model, served as ``deploy`` serves it
  (the text bench's ``arms.WorkerArm`` as it is: read-back ``GET /edgectl/effective``, checked
  against the plan; READY after its own answer about a shipped image), planned for
  ``measure.CONCURRENT_IMAGES`` requests at once.
- ``vllm-attention``: the plan with every attention call on vLLM's own CPU op (edgectl's decode
  attention off), the control of that lever; the worker reads back which kernel its calls took.
- ``bf16``: the plan with the language model dense bf16 and eager, as the tower (the default before
  edgectl's kernels were; where they do not run, the plan itself); ``compiled``: the same in vLLM's
  torch.compile mode (it compiles the language model; the tower stays eager).
- ``w4a8`` / ``w8a8``: the plan with its language model's linear layers and head in edgectl's 4- / 8-bit
  blocks (``--format``), the tower and the connector bf16, compiled as the planner compiles them; the
  worker reads back each layer's format. ``w4a8-compiled`` / ``w8a8-compiled`` say the mode outright;
  ``w8a8-eager`` runs the 8-bit blocks without torch.compile.
- ``kv-fp8``: the plan with fp8_e4m3 KV (vLLM's own attention reads it), half the bytes of the image's KV
  a decoded token reads.
- ``kv-int8``: the plan with edgectl's int8 KV (a scale per token and KV head, written and read by
  edgectl's kernels, runtime/edgectl_runtime/vllm_plugin/kv_int8.py), the same half of the bytes.
- ``tower-whole``: the plan with the vision tower over all of an image's tiles in one batch, as vLLM runs
  it (``tower_tiles`` 0), the control of that lever; ``tower-4``: four tiles a batch. The worker reads back
  the tiles a batch and the batches the tower ran as.
- ``stock``: vLLM as it ships for this model (``stock_vllm.StockVllmArm``: ``--model DIR`` and its
  defaults), if it starts; ``stock-kv`` (not run unless asked): the same given the plan's KV bytes
  and requests at once, so its memory compares with the planned arm's.
- ``llama.cpp``: ``llama-server -m model.gguf --mmproj mmproj.gguf`` on the pair llama.cpp's own
  converter wrote from the same directory (gguf_pair.py), the text bench's ``arms.LlamaCppArm``
  with the projector added; it runs once per thread count of the sweep (``<arm>-t<N>``), the best
  median quoted. Read-back: ``GET /props`` (context, slots, the model, ``modalities.vision``) and
  its log (threads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgectl.bench.arms import ARMS as TEXT_ARMS
from edgectl.bench.arms import (
    ArmSpec,
    BenchContext,
    LlamaCppArm,
    PreparedArm,
    WorkerArm,
    parse_names,
)
from edgectl.bench.server import ServerProcess
from edgectl.bench.stock_vllm import StockVllmArm
from edgectl.client import Client
from edgectl.contract.effective import Effective
from edgectl.errors import EdgectlError

ARMS: dict[str, ArmSpec] = {a.name: a for a in [
    ArmSpec("planned", "worker", {}, "edgectl's worker on edgectl's vision plan for the model, as deploy serves it"),
    ArmSpec("vllm-attention", "worker", {"decode_attention": False},
            "edgectl's vision plan with every attention call on vLLM's CPU op (edgectl's decode attention off)"),
    ArmSpec("edgectl-attention", "worker", {"decode_attention": True},
            "edgectl's vision plan with decode steps on edgectl's attention kernel (on AMX hosts vLLM then writes its "
            "KV in the \"vec\" layout, its prefill on vLLM's vec kernel; read back from the worker)"),
    # the language model's lever as the text bench has it (a decoder layer's calls; the tower never takes them)
    TEXT_ARMS["lean-attention"], TEXT_ARMS["vllm-attention-calls"],
    ArmSpec("w4a8", "worker", {"weight_format": "w4a8"},
            "edgectl's vision plan with its language model in edgectl's 4-bit blocks (int8 activations, int8 head), "
            "the tower and connector bf16"),
    ArmSpec("w8a8", "worker", {"weight_format": "w8a8"},
            "edgectl's vision plan with its language model in edgectl's 8-bit blocks (int8 activations, int8 head), "
            "the tower and connector bf16"),
    ArmSpec("bf16", "worker", {"weight_format": "bf16", "compilation": "eager"},
            "edgectl's vision plan with the language model dense bf16, eager (the tower bf16 as always)"),
    ArmSpec("compiled", "worker", {"weight_format": "bf16", "compilation": "default"},
            "the bf16 arm in vLLM's torch.compile mode (the language model compiled; the tower eager)"),
    ArmSpec("w8a8-eager", "worker", {"weight_format": "w8a8", "compilation": "eager"},
            "the w8a8 arm without torch.compile"),
    ArmSpec("w4a8-compiled", "worker", {"weight_format": "w4a8", "compilation": "default"},
            "the w4a8 arm in vLLM's torch.compile mode"),
    ArmSpec("w8a8-compiled", "worker", {"weight_format": "w8a8", "compilation": "default"},
            "the w8a8 arm in vLLM's torch.compile mode"),
    ArmSpec("kv-fp8", "worker", {"kv_cache_dtype": "fp8_e4m3"},
            "the plan with fp8_e4m3 KV: the image's KV read in half the bytes a decoded token (vLLM's own "
            "attention reads it; AVX-512 or AMX only)"),
    ArmSpec("kv-int8", "worker", {"kv_cache_dtype": "int8"},
            "the plan with edgectl's int8 KV (a scale per token and KV head): the image's KV read in half the bytes "
            "a decoded token, by edgectl's decode attention (on with it)"),
    ArmSpec("tower-whole", "worker", {"tower_tiles": 0},
            "edgectl's vision plan with the tower over all of an image's tiles in one batch, as vLLM runs it"),
    ArmSpec("tower-4", "worker", {"tower_tiles": 4}, "edgectl's vision plan with the tower over four tiles at a time"),
    ArmSpec("stock", "vllm-stock", {}, "vLLM as it ships: python -m vllm.entrypoints.openai.api_server --model DIR "
                                       "with its defaults (the served name, host and port only; edgectl's plugin "
                                       "left out)"),
    ArmSpec("stock-kv", "vllm-stock", {"plan_kv": True},
            "vLLM as it ships, given the plan's KV bytes and requests at once (--kv-cache-memory-bytes, "
            "--max-num-seqs): its memory at the planned arm's KV"),
    ArmSpec("llama.cpp", "llama.cpp", {},
            "llama-server with --mmproj on the GGUF pair llama.cpp's converter wrote from the same directory (bf16)"),
]}
DEFAULT_ARMS = ("planned", "stock", "llama.cpp")


def parse_arm_names(text: str | None) -> list[str]:
    """``--arms a,b`` (or ``all``) as known vision arm names, in the order given."""
    return parse_names(text, ARMS, DEFAULT_ARMS, "vision")


class VisionLlamaCppArm(LlamaCppArm):
    """llama-server on the language model's GGUF with the vision projector's (``--mmproj``)."""

    def __init__(self, spec: ArmSpec, ctx: BenchContext, mmproj: Path, threads: int | None = None) -> None:
        super().__init__(spec, ctx, threads)
        self.mmproj = mmproj
        self.modalities: dict[str, Any] | None = None  # the last read-back's (Effective has no field for it)

    def server_args(self, port: int) -> list[str]:
        return [*super().server_args(port), "--mmproj", str(self.mmproj)]

    def readback(self, client: Client, server: ServerProcess) -> dict[str, Any]:
        eff = super().readback(client, server)
        # what the read-back's schema has no field for: whether the server took the projector
        # (GET /props ``modalities``), kept for check() and recorded by from_log()
        self.modalities = client.get_json("/props", timeout=30).get("modalities")
        eff["readback_via"] += "; GET /props modalities (the projector: checked, recorded as llama_cpp.modalities)"
        return eff

    def from_log(self, server: ServerProcess) -> dict[str, Any]:
        out = super().from_log(server)
        out["llama_cpp"]["modalities"] = self.modalities
        return out

    def check(self, effective: Effective, processes: int) -> list[str]:
        problems = super().check(effective, processes)
        if not (self.modalities or {}).get("vision"):
            problems.append(f"llama-server's /props says it takes no images (modalities {self.modalities}): "
                            "the projector (--mmproj) is not loaded")
        return problems

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "mmproj": str(self.mmproj)}


VisionArm = PreparedArm


def prepare_arms(names: list[str], ctx: BenchContext, *, mmproj: Path | None,
                 why_no_llama: str | None) -> tuple[list[VisionArm], dict[str, str]]:
    """The arms to run, and the arms skipped with the reason. ``mmproj``: the projector GGUF the
    llama.cpp arm reads (its language model is ``ctx.gguf_path``), None with ``why_no_llama``."""
    arms: list[VisionArm] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = ARMS[name]
        if spec.launcher == "llama.cpp":
            if mmproj is None or not ctx.gguf_path:
                skipped[name] = why_no_llama or "no GGUF pair"
                continue
            arms += [VisionLlamaCppArm(spec, ctx, mmproj, n) for n in (ctx.llama_threads or (ctx.usable_cpus,))]
            continue
        try:
            arms.append(WorkerArm(spec, ctx) if spec.launcher == "worker" else StockVllmArm(spec, ctx))
        except EdgectlError as exc:
            skipped[name] = f"cannot be planned here: {exc.message}"
    return arms, skipped
