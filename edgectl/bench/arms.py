"""The bench's arms: named configurations, each a set of plan overrides and a launcher.

Three launchers:

- ``worker``: edgectl's own worker (``python -m edgectl_runtime.service.worker --plan FILE``) on a
  plan made by the same planner ``edgectl plan`` uses, with the arm's overrides. Read-back:
  ``GET /edgectl/effective`` (what the engine holds, read inside the process that holds the
  model); integrity: ``edgectl.contract.effective.mismatches`` plus the process count the bench sees.
- ``vllm``: unmodified vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``)
  with ``server_args(plan, stock=True)``; edgectl's plugin excluded with ``VLLM_PLUGINS``.
  Read-back, since the server has no edgectl route: ``/v1/models`` (context),
  ``/metrics`` ``vllm:cache_config_info`` (KV blocks the engine allocated), and
  ``edgectl_runtime.service.readback.ReadbackExtension`` through ``--worker-extension-cls`` +
  ``VLLM_SERVER_DEV_MODE=1`` + ``POST /collective_rpc`` (layer formats, RoPE rows, threads in
  the worker). The extension only adds RPC methods; it changes nothing vLLM runs.
- ``llama.cpp``: ``llama-server`` on the GGUF the catalog keeps (``llama.cpp``), or on that GGUF
  written in llama.cpp's fastest formats for the box (``llama.cpp-q4_0``, ``llama.cpp-q4_k_m``:
  ``bench/requantize.py``); read-back ``GET /props`` (context, slots) and its log (threads, and
  the weights its CPU backend repacked: ``bench/llama_log.py``). Each llama.cpp arm runs once
  per thread count of the sweep (``--llama-threads``; default 1, 2 and every usable CPU), as its
  own arm named ``<arm>-t<threads>``: the report quotes the best median as llama.cpp at its best.

An arm whose overrides name a ``gguf_type`` serves that format's file: llama-server reads it, and
an edgectl worker arm (``planned-q4_0``) serves the very same file, so one comparison has
identical weights.

Every arm of a run gets the planned arm's context and concurrency, so ratios compare levers,
not contexts.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgectl import launch
from edgectl.bench import llama_log
from edgectl.bench.requantize import Variant
from edgectl.bench.server import ServerProcess
from edgectl.client import Client, HttpFailed
from edgectl.contract import worker
from edgectl.contract.effective import SCHEMA as EFFECTIVE_SCHEMA
from edgectl.contract.effective import Effective, is_int4, mismatches
from edgectl.contract.plan import Compilation, Plan, Topology
from edgectl.contract.vllm_args import READBACK_EXTENSION, server_args
from edgectl.errors import EdgectlError

CONTROL = "stock"
# The variables by which a plan sets vLLM's threading (edgectl/planner/service.py).
THREADING = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU", "OMP_WAIT_POLICY",
             "GOMP_SPINCOUNT")


@dataclass(frozen=True)
class ArmSpec:
    name: str
    launcher: str  # worker | vllm | vllm-defaults | llama.cpp
    overrides: Mapping[str, Any]
    description: str


# The steady PSS is read after this long without requests: the worker's idle trim waits 1 s of
# quiet (runtime/edgectl_runtime/service/idle_trim.py), then the next of its 0.5 s beats; with margin.
QUIET_S = 3.0

ARMS: dict[str, ArmSpec] = {a.name: a for a in [
    ArmSpec("stock", "vllm", {}, "unmodified vLLM OpenAI server, bf16, the plan's context, concurrency and KV bytes, "
                                 "vLLM's default compilation and threading (the control)"),
    ArmSpec("stock-threads", "vllm", {"reserve_frontend_core": False},
            "unmodified vLLM as `stock`, but with the plan's OpenMP threads on the plan's CPUs (vLLM keeps no "
            "core for its front end)"),
    ArmSpec("stock-defaults", "vllm-defaults", {}, "unmodified vLLM given only the model and --max-model-len"),
    ArmSpec("planned", "worker", {}, "edgectl's plan"),
    ArmSpec("rope-cap-off", "worker", {"rope_cap": False}, "the plan with the RoPE table uncapped"),
    ArmSpec("layerwise-off", "worker", {"layerwise_repack": False}, "the plan with the whole-model repack at load"),
    ArmSpec("topology-stock", "worker", {"topology": "stock"}, "the plan in vLLM's multi-process topology"),
    ArmSpec("reserve-core-on", "worker", {"reserve_frontend_core": True}, "the plan with one core kept for the front end"),
    ArmSpec("reserve-core-off", "worker", {"reserve_frontend_core": False}, "the plan with every core for OpenMP"),
    ArmSpec("wait-passive", "worker", {"thread_wait": "passive"},
            "the plan with its OpenMP threads sleeping at once between parallel regions (OMP_WAIT_POLICY=PASSIVE)"),
    ArmSpec("wait-spin", "worker", {"thread_wait": "spin"},
            "the plan with its OpenMP threads spinning before they sleep (libgomp's default)"),
    ArmSpec("wait-spin-short", "worker", {"thread_wait": "spin-short"},
            "the plan with its OpenMP threads spinning briefly, then sleeping (GOMP_SPINCOUNT=10000)"),
    ArmSpec("threads-1", "worker", {"threads": 1}, "the plan on one OpenMP thread"),
    ArmSpec("lm-head-int4", "worker", {"quantize_lm_head": True},
            "the plan with the output head in int4 (an int4-family plan's; beside edgectl's w4a8 / w8a8 layers "
            "the quantized head is their 8-bit blocks, the plan's own: skipped there)"),
    ArmSpec("bf16", "worker", {"weight_format": "bf16"}, "the plan with bf16 weights (the fidelity reference)"),
    ArmSpec("w4a16", "worker", {"weight_format": "w4a16"}, "the plan with int4 weights on PyTorch's kernel"),
    # Larger int4 groups (edgectl/contract/int4_layout.py: a layer whose K the group does not divide
    # takes the largest allowed one below it that does). Only w4a16 has a group to vary: edgectl's
    # w4a8 blocks are 32 columns by their layout (ops/csrc/kernels.h), so no w4a8 arm here.
    ArmSpec("w4a16-g64", "worker", {"weight_format": "w4a16", "group_size": 64},
            "the plan with int4 weights on PyTorch's kernel in groups of 64"),
    ArmSpec("w4a16-g128", "worker", {"weight_format": "w4a16", "group_size": 128},
            "the plan with int4 weights on PyTorch's kernel in groups of 128 where K allows it (else the "
            "largest allowed group below that divides K)"),
    ArmSpec("w4a8", "worker", {"weight_format": "w4a8"},
            "the plan with int4 weights and int8 activations on edgectl's own kernels (and their int8 head)"),
    ArmSpec("compiled", "worker", {"compilation": "default"}, "the plan with vLLM's default torch.compile mode"),
    ArmSpec("w4a8-compiled", "worker", {"weight_format": "w4a8", "compilation": "default"},
            "the plan with w4a8 (edgectl's kernels, int8 head) in vLLM's default torch.compile mode"),
    ArmSpec("eager", "worker", {"compilation": "eager"}, "the plan in eager mode (the control of a compiled plan)"),
    ArmSpec("w4a16-eager", "worker", {"weight_format": "w4a16", "compilation": "eager"},
            "the plan with int4 weights on PyTorch's kernel in eager mode (beside `eager`: the two formats as a "
            "profile recorded in eager mode compares them)"),
    # the memory levers (docs/memory.md), each switched back to unmodified vLLM's behaviour
    ArmSpec("embedding-pack-vllm", "worker", {"embedding_pack": "vllm"},
            "the plan with a prepacked copy of every dense embedding table (a tied one twice), as vLLM does"),
    ArmSpec("optional-imports-load", "worker", {"optional_imports": "load"},
            "the plan with opentelemetry, cv2 and accelerate imported"),
    ArmSpec("optimize-off", "worker", {"python_optimize": 0}, "the plan with the worker under python without -OO"),
    ArmSpec("tokenizer-vllm", "worker", {"tokenizer": "vllm"},
            "the plan with the tokenizer as vLLM holds it (loaded again at the first chat render, its vocabulary "
            "and merges kept as Python objects)"),
    ArmSpec("idle-trim-off", "worker", {"idle_trim": False},
            "the plan without the idle trim (freed heap memory stays resident in glibc's arenas)"),
    ArmSpec("memory-levers-off", "worker", {"embedding_pack": "vllm", "optional_imports": "load", "python_optimize": 0,
                                            "tokenizer": "vllm", "idle_trim": False},
            "the plan with none of the memory levers"),
    ArmSpec("huge-pages", "worker", {"huge_pages": True},
            "the plan with PyTorch's allocations of 2 MiB or more on transparent huge pages (THP_MEM_ALLOC_ENABLE=1; "
            "the tree's AnonHugePages read back)"),
    ArmSpec("vllm-attention", "worker", {"decode_attention": False},
            "the plan with every attention call on vLLM's CPU op (edgectl's decode-attention kernel off; "
            "read back from the worker)"),
    ArmSpec("edgectl-attention", "worker", {"decode_attention": True},
            "the plan with decode steps on edgectl's attention kernel over the bf16 KV (on AMX hosts vLLM then writes "
            "its KV in the \"vec\" layout, its prefill on vLLM's vec kernel; read back from the worker)"),
    ArmSpec("lean-attention", "worker", {"lean_attention": True},
            "the plan with a decoder layer's calls into vLLM's attention ops made the lean way (the same ops and "
            "arguments, less Python; read back from the worker)"),
    ArmSpec("vllm-attention-calls", "worker", {"lean_attention": False},
            "the plan with every attention call through vLLM's own methods (the control where the plan has the "
            "lean path; read back from the worker)"),
    ArmSpec("cpp-wrapper", "worker", {"cpp_wrapper": True, "compilation": "default"},
            "the plan compiled, with inductor's graph wrapper in C++ instead of Python (TORCHINDUCTOR_CPP_WRAPPER=1, "
            "vLLM's layer names as strings; read back from the worker)"),
    ArmSpec("python-wrapper", "worker", {"cpp_wrapper": False},
            "the plan with inductor's graph wrapper in Python (the control where the plan has it in C++; read back "
            "from the worker)"),
    ArmSpec("kv-fp8", "worker", {"kv_cache_dtype": "fp8_e4m3"},
            "the plan with fp8_e4m3 KV (half the KV bytes at the same context; AVX-512 or AMX only)"),
    ArmSpec("kv-int8", "worker", {"kv_cache_dtype": "int8"},
            "the plan with edgectl's int8 KV (a scale per token and KV head; half the KV bytes at the same context, "
            "written and read by edgectl's kernels, its decode attention on; read back from the worker)"),
    ArmSpec("llama.cpp", "llama.cpp", {}, "llama-server on the GGUF the model was converted from"),
    # llama.cpp's fastest formats on x86 (its CPU backend repacks them: bench/requantize.py)
    ArmSpec("llama.cpp-q4_0", "llama.cpp", {"gguf_type": "Q4_0"},
            "llama-server on the model's GGUF requantized to Q4_0 by the same build's llama-quantize"),
    ArmSpec("llama.cpp-q4_k_m", "llama.cpp", {"gguf_type": "Q4_K_M"},
            "llama-server on the model's GGUF requantized to Q4_K_M by the same build's llama-quantize"),
    ArmSpec("planned-q4_0", "worker", {"gguf_type": "Q4_0"},
            "edgectl's plan on the very Q4_0 file the llama.cpp-q4_0 arm serves (identical weights)"),
]}
DEFAULT_ARMS = ("stock", "planned", "llama.cpp")
# An arm override that is no planner request: the llama.cpp file type the arm serves.
GGUF_TYPE = "gguf_type"


def gguf_types(names: list[str]) -> list[str]:
    """The llama.cpp file types the arms ``names`` serve besides the model's own GGUF, in order."""
    return list(dict.fromkeys(ARMS[n].overrides[GGUF_TYPE] for n in names if GGUF_TYPE in ARMS[n].overrides))


def thread_sweep(usable_cpus: int) -> list[int]:
    """llama-server's thread counts tried by default: 1, 2 and every usable CPU (deduplicated)."""
    return sorted({n for n in (1, 2, usable_cpus) if n <= usable_cpus})


def parse_thread_counts(text: str | None, usable_cpus: int) -> list[int]:
    """``--llama-threads 1,2`` as the thread counts to run each llama.cpp arm at (None: the sweep)."""
    if not text:
        return thread_sweep(usable_cpus)
    counts: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        n = usable_cpus if part == "all" else int(part) if part.isdigit() else 0
        if not 1 <= n <= usable_cpus:
            raise EdgectlError(f"--llama-threads: {part!r} is not a thread count from 1 to the {usable_cpus} usable "
                               f"CPU(s) (or all)")
        if n not in counts:
            counts.append(n)
    if not counts:
        raise EdgectlError("--llama-threads: give thread counts, e.g. 1,2 (or all)")
    return counts


def llama_arm_name(arm: str, threads: int) -> str:
    """A llama.cpp arm at one thread count of the sweep: ``llama.cpp-q4_0-t2``."""
    return f"{arm}-t{threads}"


def parse_names(text: str | None, known: Mapping[str, ArmSpec], defaults: Sequence[str], kind: str = "") -> list[str]:
    """``--arms a,b`` (or ``all``) as names of ``known`` (the text, speech or vision bench's table), in
    the order given; ``defaults`` when not given. ``kind`` names the table in an error ("speech")."""
    if not text:
        return list(defaults)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise EdgectlError(f"--arms: unknown {kind + ' ' if kind else ''}arm(s) {', '.join(unknown)}; known: "
                           f"{', '.join(known)} (or all)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EdgectlError(f"--arms: {', '.join(dupes)} given twice")
    if not names:
        raise EdgectlError(f"--arms: no arm given; known: {', '.join(known)} (or all)")
    return names


def parse_arm_names(text: str | None) -> list[str]:
    """``--arms a,b,c`` (or ``all``) as a list of known arm names, in the order given."""
    return parse_names(text, ARMS, DEFAULT_ARMS)


class Crashed(Exception):
    """The server died or never became ready. ``invalid``: it refused because a setting differs."""

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid


# -- what every launcher needs from the run ----------------------------------------------------

# (arm, port, pass directory) -> the server's command line. By default each arm makes its own
# (``PreparedArm.default_command``); another can stand in for a launcher, given to run_bench.
Launcher = Callable[["PreparedArm", int, Path], list[str]]


@dataclass
class BenchContext:
    model_name: str  # the served model name
    model_path: str
    vocab_size: int
    kv_bytes_per_token: int
    planned: Plan  # the planned arm's plan: every arm runs its context and concurrency
    planner: Callable[[dict[str, Any]], Plan]  # Request overrides -> plan
    runtime_python: str
    child_env: dict[str, str]  # the environment servers start from (overriding variables removed)
    logs_dir: Path  # one sub-directory per pass: the server's log (and the worker's plan file)
    usable_cpus: int
    stock_plugins: str  # VLLM_PLUGINS for the unmodified arms: every general plugin but edgectl's
    llama_server: str | None = None
    llama_unavailable: str | None = None
    gguf_path: str | None = None
    start_timeout_s: float = 1800.0
    # A launcher's command line made otherwise than the default (run_bench's ``launchers``).
    launchers: dict[str, Launcher] = field(default_factory=dict)
    concurrency: int = 1  # streams decoded at once in each pass (1: the single-stream figures only)
    soak_s: float = 0  # seconds of mixed requests after each pass's measurements (bench/soak.py); 0: none
    # A GGUF served as it is: the bf16 directory of the same weights for stock vLLM (core._stock_model_for).
    stock_model_path: str | None = None
    quiet_s: float = QUIET_S  # seconds without requests before the steady PSS
    # llama-server's thread counts: each llama.cpp arm runs once per count (default: thread_sweep)
    llama_threads: tuple[int, ...] = ()
    gguf_type: str | None = None  # the model's own GGUF's llama.cpp file type (requantize.file_type)
    # The model's GGUF in other llama.cpp formats, by type (requantize.variants); absent: not made,
    # with the reason in variants_unavailable.
    variants: dict[str, Variant] = field(default_factory=dict)
    variants_unavailable: str | None = None


class PreparedArm:
    """An arm ready to launch: its plan (if any), what to check, how to read back."""

    launcher = "?"
    fidelity = "vllm"  # how fidelity is collected: vllm (prompt_logprobs) | llama | None
    # Started twice per pass, on an empty compile cache and then on the one it left (runner.py).
    cold_and_warm = False

    def __init__(self, spec: ArmSpec, ctx: BenchContext) -> None:
        self.spec = spec
        self.name = spec.name
        self.ctx = ctx
        self.plan: Plan | None = None

    # the launch
    def default_command(self, port: int, pass_dir: Path) -> list[str]:
        raise NotImplementedError

    def prepare_files(self, port: int, pass_dir: Path) -> None:
        """Write what the server reads (the worker's plan file) into ``pass_dir``."""

    def command(self, port: int, pass_dir: Path) -> list[str]:
        self.prepare_files(port, pass_dir)
        custom = self.ctx.launchers.get(self.launcher)
        return custom(self, port, pass_dir) if custom else self.default_command(port, pass_dir)

    def env(self) -> dict[str, str]:
        return dict(self.ctx.child_env)

    # readiness, read-back, integrity
    def wait_ready(self, client: Client, server: ServerProcess, deadline: float) -> None:
        while True:
            _check_alive(server)
            if client.status("/health") == 200:
                return
            _check_deadline(server, deadline)
            time.sleep(0.25)

    def readback(self, client: Client, server: ServerProcess) -> dict[str, Any]:
        raise NotImplementedError

    def from_log(self, server: ServerProcess) -> dict[str, Any]:
        """What the server's log says beyond the read-back, for the pass record (default: nothing)."""
        return {}

    def check(self, effective: Effective, processes: int) -> list[str]:
        raise NotImplementedError

    def weights_bytes(self, effective: Effective) -> int | None:
        """Bytes read per decoded token, approximately: the resident weights as read back (the
        parameters, plus weights vLLM moved outside them), else the plan's."""
        resident = effective.resident
        if resident is not None and resident.parameters_bytes is not None:
            return resident.parameters_bytes + (resident.outside_parameters_bytes or 0)
        return self.plan.memory.weights_bytes if self.plan else None

    def describe(self) -> dict[str, Any]:
        return {"launcher": self.launcher, "description": self.spec.description,
                "overrides": dict(self.spec.overrides), "plan": self.plan.to_dict() if self.plan else None}


def _check_alive(server: ServerProcess) -> None:
    code = server.returncode()
    if code is not None:
        raise Crashed(f"the server exited with code {code} before it was ready: {crash_reason(server)}")


_EXCEPTION_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit)\b.*:")


def crash_reason(server: ServerProcess) -> str:
    """The last exception line of the server's log (interpreter-shutdown noise skipped), else its tail."""
    tail = server.log_tail(60)
    for line in reversed(tail):
        text = line.strip()
        if _EXCEPTION_LINE.match(text) and not text.startswith("Exception ignored"):
            return text
    return " | ".join(tail[-6:])


def _check_deadline(server: ServerProcess, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise Crashed(f"not ready after {server.elapsed_s():.0f} s (--start-timeout): " + " | ".join(server.log_tail(4)))


def _write_plan(plan: Plan, port: int, pass_dir: Path) -> Path:
    """The plan as the worker reads it, bound to this pass's port on the loopback."""
    pass_dir.mkdir(parents=True, exist_ok=True)
    path = pass_dir / "plan.json"
    path.write_text(json.dumps(_with_port(plan, port).to_dict(), indent=1))
    return path


def _with_port(plan: Plan, port: int) -> Plan:
    return plan.with_serve(host="127.0.0.1", port=port)


def _same_shape(ctx: BenchContext, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The arm's overrides plus the planned arm's context and concurrency."""
    return {"max_model_len": ctx.planned.max_model_len, "max_num_seqs": ctx.planned.max_num_seqs, **overrides}


# -- edgectl's worker ----------------------------------------------------------------------------


class WorkerArm(PreparedArm):
    launcher = "worker"

    def __init__(self, spec: ArmSpec, ctx: BenchContext) -> None:
        super().__init__(spec, ctx)
        overrides = {k: v for k, v in spec.overrides.items() if k != GGUF_TYPE}
        if GGUF_TYPE in spec.overrides:
            # the llama.cpp arm's very file, in a directory with the model's configuration and tokenizer
            variant = ctx.variants[spec.overrides[GGUF_TYPE]]
            overrides["model"] = str(variant.model_dir) if variant.model_dir else ctx.planned.model.path
            overrides["group_size_hint"] = ctx.planned.request.group_size_hint
        self.plan = ctx.planned if spec.name == "planned" else ctx.planner(_same_shape(ctx, overrides))
        if self.plan.model.name != ctx.model_name:  # served under the run's model name, as every arm is
            self.plan = replace(self.plan, model=replace(self.plan.model, name=ctx.model_name))
        # edgectl's worker in compiled mode loads what an earlier start compiled: a cold and a warm start.
        self.cold_and_warm = self.plan.compilation is Compilation.DEFAULT

    def prepare_files(self, port: int, pass_dir: Path) -> None:
        assert self.plan is not None
        _write_plan(self.plan, port, pass_dir)

    def describe(self) -> dict[str, Any]:
        # the llama.cpp format of the GGUF the plan reads (the report compares it with llama.cpp on that file)
        reads_gguf = self.plan is not None and self.plan.model.checkpoint_format == "gguf"
        return {**super().describe(), "gguf_type": self.spec.overrides.get(GGUF_TYPE) or (
            self.ctx.gguf_type if reads_gguf else None)}

    def default_command(self, port: int, pass_dir: Path) -> list[str]:
        assert self.plan is not None
        return launch.worker_command(self.ctx.runtime_python, str(pass_dir / "plan.json"), self.plan.levers.python_optimize)

    def wait_ready(self, client: Client, server: ServerProcess, deadline: float) -> None:
        # The worker answers /edgectl/effective once its app is up; "serving" after its warm-up.
        while True:
            code = server.returncode()
            if code is not None:
                tail = server.log_tail(8)
                if code == worker.EXIT_MISMATCH:  # the worker refused: a setting did not take effect
                    differs = [ln for ln in tail if "differs from the plan" in ln or "refusing" in ln]
                    raise Crashed("the worker refused to serve: " + " | ".join(differs or tail), invalid=True)
                raise Crashed(f"the worker exited with code {code} before it was ready: {crash_reason(server)}")
            try:
                if Effective.from_dict(client.get_json(worker.EFFECTIVE_ROUTE, timeout=5)).phase == worker.SERVING:
                    return
            except HttpFailed:
                pass
            _check_deadline(server, deadline)
            time.sleep(0.25)

    def readback(self, client: Client, server: ServerProcess) -> dict[str, Any]:
        eff = client.get_json(worker.EFFECTIVE_ROUTE, timeout=30)
        eff["readback_via"] = f"GET {worker.EFFECTIVE_ROUTE} (edgectl worker)"
        return eff

    def check(self, effective: Effective, processes: int) -> list[str]:
        assert self.plan is not None
        problems = mismatches(self.plan, effective)
        if self.plan.topology is Topology.SINGLE_PROCESS and processes != 1:
            problems.append(f"the bench counts {processes} processes in the server's tree, "
                            "the plan's single-process topology has 1")
        if effective.phase not in (None, worker.SERVING):
            problems.append(f"the worker is in phase {effective.phase!r}, not serving")
        problems += decode_attention_idle(self.plan, effective)
        return problems


def decode_attention_idle(plan: Plan, effective: Effective) -> list[str]:
    """After the warm-up's answer: a lever of edgectl's decode attention that took none of the decode
    calls is on in name only (a layout its kernel does not read, a shape it does not take); the arm
    would measure vLLM's attention under edgectl's name."""
    calls = (effective.decode_attention or {}).get("calls") or {}
    if plan.levers.decode_attention and calls.get("edgectl") == 0 and calls.get("vllm", 0) > 0:
        return [f"the plan has edgectl's decode attention on, and its kernel took none of the warm-up's "
                f"{calls['vllm']} attention calls (vLLM's KV layouts {list(effective.attention_isa or [])})"]
    return []


# -- unmodified vLLM -----------------------------------------------------------------------------


class VllmArm(PreparedArm):
    """The control: vLLM's own server on the bf16 model, the plan's context/concurrency/KV bytes."""

    launcher = "vllm"

    def __init__(self, spec: ArmSpec, ctx: BenchContext) -> None:
        super().__init__(spec, ctx)
        self.plan = ctx.planner(_same_shape(ctx, {
            "weight_format": "bf16", "topology": "stock", "compilation": "default", "rope_cap": False,
            "kv_cache_bytes": ctx.planned.kv_cache_bytes, "kv_cache_dtype": str(ctx.planned.kv_cache_dtype),
            # what unmodified vLLM does (edgectl's plugin is not loaded; the plan says so)
            "embedding_pack": "vllm", "optional_imports": "load", "python_optimize": 0, "tokenizer": "vllm",
            "idle_trim": False, **spec.overrides}))
        if self.plan.model.checkpoint_format == "gguf":
            # Stock vLLM has no GGUF loader (and runs without edgectl's): the same weights, dequantized.
            if not ctx.stock_model_path:
                raise EdgectlError("stock vLLM cannot read a GGUF, and this model has no bf16 copy "
                                   "(only catalog models get one)")
            self.plan = replace(self.plan, model=replace(self.plan.model, path=ctx.stock_model_path,
                                                         checkpoint_format="bf16"))

    def server_args(self, port: int) -> list[str]:
        return server_args(_with_port(self.plan, port), stock=True) + ["--worker-extension-cls", READBACK_EXTENSION]

    def default_command(self, port: int, pass_dir: Path) -> list[str]:
        return [self.ctx.runtime_python, "-m", "vllm.entrypoints.openai.api_server", *self.server_args(port)]

    def env(self) -> dict[str, str]:
        # VLLM_PLUGINS lists every general plugin but edgectl's: stock vLLM runs without it.
        # VLLM_SERVER_DEV_MODE=1 only adds the dev routes (/collective_rpc) the read-back uses.
        env = {**self.ctx.child_env, "VLLM_PLUGINS": self.ctx.stock_plugins, "VLLM_SERVER_DEV_MODE": "1"}
        if "reserve_frontend_core" in self.spec.overrides:
            # vLLM's own threading otherwise: on a 2-core host it keeps a core for the front end and
            # runs one OpenMP thread (vllm/platforms/cpu.py, VLLM_CPU_NUM_OF_RESERVED_CPU).
            env.update({k: v for k, v in self.plan.env.items() if k in THREADING})
        return env

    def readback(self, client: Client, server: ServerProcess) -> dict[str, Any]:
        eff: dict[str, Any] = {"schema": EFFECTIVE_SCHEMA, "readback_via": (
            "/v1/models (context), /metrics vllm:cache_config_info (KV blocks), "
            f"POST /collective_rpc edgectl_describe ({READBACK_EXTENSION}: formats, RoPE rows, threads)")}
        models = client.get_json("/v1/models", timeout=30).get("data") or [{}]
        eff["max_model_len"] = models[0].get("max_model_len")
        info = cache_config_info(client.get_text("/metrics", timeout=30))
        eff["cache_config_info"] = {k: info.get(k) for k in (
            "num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "kv_cache_size_tokens",
            "enable_prefix_caching", "gpu_memory_utilization")}
        blocks, block = _int(info.get("num_gpu_blocks")), _int(info.get("block_size"))
        eff["kv_cache_bytes"] = blocks * block * self.ctx.kv_bytes_per_token if blocks and block else None
        eff["unverified"] = ["max_num_seqs (no read-back route in stock vLLM)"]
        try:
            res = client.post_json("/collective_rpc", {"method": "edgectl_describe"}, timeout=120).get("results") or []
            described = res[0] if res else None
        except HttpFailed as exc:
            described = None
            eff["unverified"].append(f"layer formats, RoPE rows, threads: {exc}")
        if isinstance(described, dict):
            layers = described.get("layers") or []
            formats = {("lm_head" if e.get("kind") == "lm_head" else e["name"]): e["format"]
                       for e in layers if e.get("kind") in ("linear", "lm_head")}
            eff.update({
                "rope_rows": {r["name"]: r["rows"] for r in described.get("rope") or []},
                "linear_formats": formats,
                "linear_format_counts": described.get("formats"),
                "lm_head_format": formats.get("lm_head"),
                "quantization_readback": described.get("quantization"),
                "resident": described.get("resident"),
                "threads": (described.get("kernel") or {}).get("torch_threads"),
                "kernel": described.get("kernel"),
                "kernel_isa": (described.get("kernel") or {}).get("edgectl_isa"),
            })
        return eff

    def check(self, effective: Effective, processes: int) -> list[str]:
        out: list[str] = []
        plan = self.plan

        def differ(what: str, want: Any, got: Any) -> None:
            if got != want:
                out.append(f"{what} is {got!r}, the arm asks for {want!r}")

        differ("max_model_len", plan.max_model_len, effective.max_model_len)
        differ("KV cache bytes", plan.kv_cache_bytes, effective.kv_cache_bytes)
        if "reserve_frontend_core" in self.spec.overrides:
            differ("threads", plan.threads, effective.threads)
        out += self._check_model(effective)
        return out

    def _check_model(self, effective: Effective) -> list[str]:
        out = []
        formats = effective.linear_formats
        if not formats:
            out.append("linear layer formats could not be read back")
        else:
            int4 = [n for n, f in formats.items() if is_int4(f)]
            if int4:
                out.append(f"{len(int4)} layers are 4-bit in an unmodified bf16 arm (e.g. {int4[0]})")
        rope = effective.rope_rows
        if not rope:
            out.append("RoPE table rows could not be read back")
        else:
            capped = {k: v for k, v in rope.items() if v != self.plan.rope_rows}
            if capped:
                name, rows = next(iter(capped.items()))
                out.append(f"RoPE table {name} has {rows} rows; unmodified vLLM builds {self.plan.rope_rows} "
                           "(is edgectl's plugin loaded?)")
        return out


class VllmDefaultsArm(VllmArm):
    """What a user gets from vLLM given only the model and the context (KV: vLLM's own default)."""

    launcher = "vllm-defaults"

    def server_args(self, port: int) -> list[str]:
        return ["--model", self.plan.model.path, "--max-model-len", str(self.plan.max_model_len),
                # naming and binding only, so the harness can reach it; plus the read-back extension
                "--served-model-name", self.plan.model.name, "--host", "127.0.0.1", "--port", str(port),
                "--worker-extension-cls", READBACK_EXTENSION]

    def check(self, effective: Effective, processes: int) -> list[str]:
        out = []
        if effective.max_model_len != self.plan.max_model_len:
            out.append(f"max_model_len is {effective.max_model_len!r}, the arm asks for {self.plan.max_model_len}")
        return out + self._check_model(effective)


def cache_config_info(metrics_text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` in a Prometheus text page (engine 0)."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            body = line[line.index("{") + 1:line.rindex("}")]
            return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body))
    return {}


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# -- llama.cpp -------------------------------------------------------------------------------------


class LlamaCppArm(PreparedArm):
    """llama-server on one GGUF (the model's own, or a requantized one) at one thread count."""

    launcher = "llama.cpp"
    fidelity = "llama"

    def __init__(self, spec: ArmSpec, ctx: BenchContext, threads: int | None = None) -> None:
        super().__init__(spec, ctx)
        self.threads = threads or ctx.usable_cpus
        self.name = llama_arm_name(spec.name, self.threads)
        wanted = spec.overrides.get(GGUF_TYPE)
        self.variant = ctx.variants.get(wanted) if wanted else None
        self.gguf = str(self.variant.gguf) if self.variant else ctx.gguf_path
        self.gguf_type = wanted or ctx.gguf_type
        self.expected = {"max_model_len": ctx.planned.max_model_len, "max_num_seqs": ctx.planned.max_num_seqs,
                         "threads": self.threads, "model": self.gguf}

    def default_command(self, port: int, pass_dir: Path) -> list[str]:
        assert self.ctx.llama_server and self.gguf
        return [self.ctx.llama_server, *self.server_args(port)]

    def server_args(self, port: int) -> list[str]:
        e = self.expected
        return ["-m", str(e["model"]), "-c", str(e["max_model_len"] * e["max_num_seqs"]), "-np", str(e["max_num_seqs"]),
                "-t", str(self.threads), "-tb", str(self.threads), "--host", "127.0.0.1", "--port", str(port),
                "--alias", self.ctx.model_name, "--no-webui",
                # the model loader's buffer lines (what was repacked), nothing per token (bench/llama_log.py)
                "-lv", str(llama_log.VERBOSITY)]

    def readback(self, client: Client, server: ServerProcess) -> dict[str, Any]:
        props = client.get_json("/props", timeout=30)
        gen = props.get("default_generation_settings") or {}
        slots = props.get("total_slots")
        n_ctx = gen.get("n_ctx")
        return {"schema": EFFECTIVE_SCHEMA, "readback_via": "GET /props (context, slots), log (threads)",
                "max_model_len": n_ctx, "max_num_seqs": slots, "threads": llama_log.threads(server.log_tail(400)),
                "model_path": props.get("model_path"), "build_info": props.get("build_info")}

    def from_log(self, server: ServerProcess) -> dict[str, Any]:
        # the format and threads this pass ran, and what llama.cpp's CPU backend repacked at load
        return {"llama_cpp": {"gguf_type": self.gguf_type, "threads": self.threads,
                              "repack": llama_log.repack(server.log_tail(100_000))}}

    def check(self, effective: Effective, processes: int) -> list[str]:
        out = []
        got = {"max_model_len": effective.max_model_len, "max_num_seqs": effective.max_num_seqs,
               "threads": effective.threads}
        for key, value in got.items():
            if value != self.expected[key]:
                out.append(f"{key} is {value!r}, the arm asks for {self.expected[key]!r}")
        path = effective.model_path
        if path and Path(path).resolve() != Path(str(self.expected["model"])).resolve():
            out.append(f"llama-server loaded {path}, not {self.expected['model']}")
        return out

    def weights_bytes(self, effective: Effective) -> int | None:
        try:
            return Path(str(self.gguf)).stat().st_size
        except OSError:
            return None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "server": self.ctx.llama_server, "gguf": self.gguf,
                "gguf_type": self.gguf_type, "threads": self.threads, "family": self.spec.name,
                "requantized": self.variant.provenance if self.variant else None, "expected": dict(self.expected)}


LAUNCHERS = {"worker": WorkerArm, "vllm": VllmArm, "vllm-defaults": VllmDefaultsArm, "llama.cpp": LlamaCppArm}


def prepare_arms(names: list[str], ctx: BenchContext) -> tuple[list[PreparedArm], dict[str, str]]:
    """The arms to run, and the arms skipped with the reason (llama.cpp when it is unavailable).

    A llama.cpp arm becomes one arm per thread count of ``ctx.llama_threads``."""
    arms: list[PreparedArm] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = ARMS[name]
        why = _unavailable(spec, ctx)
        if why:
            skipped[name] = why
            continue
        try:
            if spec.launcher == "llama.cpp":
                arms += [LlamaCppArm(spec, ctx, n) for n in (ctx.llama_threads or (ctx.usable_cpus,))]
            else:
                arms.append(LAUNCHERS[spec.launcher](spec, ctx))
        except EdgectlError as exc:
            # an arm the planner refuses here (e.g. a format this host cannot run) is skipped, and says why
            skipped[name] = f"cannot be planned here: {exc.message}"
    return arms, skipped


def _unavailable(spec: ArmSpec, ctx: BenchContext) -> str | None:
    """Why the arm cannot run here (llama-server, its GGUF or a requantized file missing), else None."""
    wanted = spec.overrides.get(GGUF_TYPE)
    if wanted and wanted not in ctx.variants:
        return f"no {wanted} file: {ctx.variants_unavailable or 'not made'}"
    if spec.name == "lm-head-int4" and ctx.planned.lm_head_format == "int8":
        # quantize_lm_head beside edgectl's layers means its 8-bit head (Plan.lm_head_format): the plan itself
        return (f"the plan ({ctx.planned.weight_format}) already holds its output head in edgectl's 8-bit blocks, "
                "and a 4-bit head beside edgectl's layers is not a plan setting: this arm would run the plan again")
    if spec.launcher == "llama.cpp" and "llama.cpp" not in ctx.launchers:
        if not ctx.llama_server:
            return ctx.llama_unavailable or "llama-server not found"
        if not ctx.gguf_path or not Path(ctx.gguf_path).is_file():
            return (f"the GGUF {ctx.gguf_path} is missing: `edgectl models pull {ctx.model_name}` keeps it"
                    if ctx.gguf_path else "the model has no GGUF: neither a catalog GGUF nor a directory "
                    "pulled from one")
    return None
