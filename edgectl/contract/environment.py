"""Every environment variable edgectl reads, sets or refuses, declared once.

Four roles:

- ``OWN``: edgectl's own variables (``EDGECTL_*``), read by the control plane or the runtime
  through :func:`read`, each with its default. The runtime's levers default to what *unmodified
  vLLM* does: edgectl's plugin is an entry point, so it loads into every vLLM process in the
  venv, including a benchmark's "stock" arm.
- ``SET``: a third party's variable that edgectl sets for a process it starts (the worker, through
  the plan's ``env`` or the unit; a benchmarked server; the model converter).
- ``REFUSED``: a third party's variable that would change a planned setting behind the plan's
  back; the worker refuses to start while it is set (:func:`refused`).
- ``READ``: a third party's variable edgectl reads but does not own (systemd's notify protocol).

Nothing reads ``os.environ`` directly: callers pass a mapping (normally ``os.environ``), so a
test hands in a dict and nothing is mutated. Reading a variable that is not declared here is a
``KeyError``: declare it first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from edgectl.contract.int4_layout import ALLOWED_GROUP_SIZES, DEFAULT_GROUP_SIZE
from edgectl.contract.vision import TOWER_TILES

if TYPE_CHECKING:
    from edgectl.contract.plan import Plan


class Role(StrEnum):
    OWN = "own"
    SET = "set"
    REFUSED = "refused"
    READ = "read"


@dataclass(frozen=True)
class Var:
    name: str
    role: Role
    meaning: str
    default: str | None = None  # OWN: the value when unset (or computed by `default_from`)
    choices: tuple[str, ...] | None = None  # OWN: the only values accepted
    default_from: Callable[[Mapping[str, str]], str] | None = None
    # REFUSED: what the plan sets instead, for the refusal's message
    planned: Callable[[Plan], str] | None = None


def _model_cache(environ: Mapping[str, str]) -> str:
    if os.geteuid() == 0:
        return "/var/lib/edgectl/models"
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "edgectl" / "models")


_BOOL = ("0", "1")

_VARS = [
    # -- edgectl's own: the control plane ---------------------------------------------------------
    Var("EDGECTL_UNIT_DIR", Role.OWN, "directory the systemd units are written to (tests inside a "
        "systemd sandbox use /run/systemd/system)", "/etc/systemd/system"),
    Var("EDGECTL_CONFIG_DIR", Role.OWN, "directory holding one sub-directory of configuration per deployment",
        "/etc/edgectl"),
    Var("EDGECTL_MODEL_CACHE", Role.OWN, "where catalog models are converted to and kept (default "
        "/var/lib/edgectl/models as root, else the user cache directory)", default_from=_model_cache),
    Var("EDGECTL_PROFILES_DIR", Role.OWN, "locally recorded device profiles, read after the shipped ones "
        "and preferred over them", "/etc/edgectl/profiles"),
    Var("EDGECTL_RUNTIME_PYTHON", Role.OWN, "the Python interpreter that has the runtime extra (torch, vLLM) "
        "installed; units and conversions run it (default: the interpreter running edgectl)",
        default_from=lambda _environ: sys.executable),
    # -- edgectl's own: the runtime's levers (set by the worker from the plan: runtime_levers) ------
    Var("EDGECTL_ROPE_CAP", Role.OWN, "1: build the RoPE cos/sin table only up to max_model_len rows (plain, "
        "Llama3, single-factor linear and YaRN rotary classes), without the fp32 transient of the full table; "
        "0: vLLM's table of max_position_embeddings rows", "0", _BOOL),
    Var("EDGECTL_DECODE_ATTENTION", Role.OWN, "1: decode steps (one query token per sequence, bf16 KV, no "
        "window, soft cap, ALiBi or sinks) attend with edgectl's kernel (torch.ops.edgectl.decode_attention) instead "
        "of vLLM's CPU attention op; any other call stays on vLLM's (runtime/edgectl_runtime/vllm_plugin/"
        "decode_attention.py); 0: vLLM's for every call", "0", _BOOL),
    Var("EDGECTL_LEAN_ATTENTION", Role.OWN, "1: a decoder layer's KV write and attention call vLLM's same two CPU "
        "ops with the same arguments and less Python (cache views made once, no keyword wrappers; "
        "runtime/edgectl_runtime/vllm_plugin/lean_attention.py); 0: through vLLM's methods", "0", _BOOL),
    Var("EDGECTL_KV_INT8", Role.OWN, "1 (with EDGECTL_DECODE_ATTENTION=1 and vLLM's --kv-cache-dtype fp8_e4m3, "
        "which allocates one byte per value): every decoder layer's KV is edgectl's int8, a scale per token and "
        "KV head, written and read by edgectl (runtime/edgectl_runtime/vllm_plugin/kv_int8.py); 0: vLLM's KV",
        "0", _BOOL),
    Var("EDGECTL_TOWER_TILES", Role.OWN, "N > 0: a vision-language model's tower (Idefics3's, SmolVLM's) encodes an "
        "image's tiles N at a time instead of all in one batch, the same embeddings from tensors N / tiles of the size "
        "(runtime/edgectl_runtime/vllm_plugin/tower_tiles.py; the plan's vision.tower_tiles); 0: all at once, as vLLM "
        "does", "0", tuple(str(n) for n in TOWER_TILES)),
    Var("EDGECTL_LAYERWISE_REPACK", Role.OWN, "1: cpu_int4 quantizes and packs each layer as soon as its last "
        "checkpoint shard arrives, and the embedding / LM head straight from the checkpoint tensor (no dense "
        "copy of the model is ever resident); 0: the naive path, the whole model is loaded in the model dtype "
        "first and packed afterwards (SmolLM2: +90 MB anonymous memory left resident by the freed dense copy)",
        "1", _BOOL),
    Var("EDGECTL_LM_HEAD", Role.OWN, "the LM head of cpu_int4 (a tied embedding is stored once, in the head's "
        "format; the lookup dequantizes only the rows it needs): dense = the model dtype; int4 = the linear "
        "layers' 4-bit family (edgectl's W4 with EDGECTL_INT4_KERNEL=edgectl, PyTorch's int4 kernel otherwise); "
        "int8 = edgectl's W8 (blocks of 32, GGUF Q8_0 arithmetic)", "dense", ("dense", "int4", "int8")),
    Var("EDGECTL_INT4_GROUP_SIZE", Role.OWN, "preferred int4 group size when a model is quantized at load "
        "(--quantization cpu_int4 on a bf16/fp16 checkpoint); per layer the shared rule in "
        "edgectl/contract/int4_layout.py picks a size that divides K", str(DEFAULT_GROUP_SIZE),
        tuple(str(g) for g in ALLOWED_GROUP_SIZES)),
    Var("EDGECTL_INT4_KERNEL", Role.OWN, "the kernel of cpu_int4's linear layers: torch (PyTorch's "
        "_weight_int4pack_mm_for_cpu, every ISA; the plan's w4a16), vllm (vLLM's cpu_gemm_wna16, only where "
        "its C library registers it; the plan's w4a16-vllm) or edgectl (edgectl's own kernels, W4 blocks of 32 "
        "with int8 activations; the plan's w4a8)", "torch", ("torch", "vllm", "edgectl")),
    Var("EDGECTL_LINEAR_BITS", Role.OWN, "the bits of cpu_int4's linear layers quantized at load: 4 (the "
        "int4 formats) or 8 (edgectl's W8, blocks of 32 with one scale, GGUF Q8_0 arithmetic, int8 activations; "
        "only with EDGECTL_INT4_KERNEL=edgectl; the plan's w8a8)", "4", ("4", "8")),
    Var("EDGECTL_INT4_PARTS", Role.OWN, "which parts of a model cpu_int4 quantizes: all (every linear layer; "
        "a Whisper's encoder and decoder alike) or language-model (a multimodal model's encoders and connectors, "
        "where vLLM's map of the model puts them, stay in the model dtype; the plan of a vision-language model)",
        "all", ("all", "language-model")),
    Var("EDGECTL_COMPILE_CACHE", Role.OWN, "1: in vLLM's compiled mode, load the graph a previous start saved "
        "(edgectl works around vLLM 0.32 discarding it, runtime/edgectl_runtime/vllm_plugin/compile_cache.py); 0: unmodified "
        "vLLM, which compiles again at every start", "0", _BOOL),
    Var("EDGECTL_KERNEL_ISA", Role.OWN, "the ISA level of edgectl's own kernels (runtime/edgectl_runtime/kernels/ops): "
        "auto = the best level the CPU and the OS support (cpuid + XCR0); scalar, avx2, avxvnni or avx512vnni force one "
        "(tests; the AVX2 path on an AVX-512 box), refused if this CPU cannot run it; auto stays at or below "
        "what ATEN_CPU_CAPABILITY allows PyTorch", "auto",
        ("auto", "scalar", "avx2", "avxvnni", "avx512vnni")),
    Var("EDGECTL_EMBEDDING_PACK", Role.OWN, "which dense embedding tables keep vLLM's prepacked GEMM copy "
        "(edgectl_runtime/vllm_plugin/embedding.py): vllm (every one, as unmodified vLLM: a tied table is packed twice), "
        "lm-head (only the layer that computes logits; the plan's levers.embedding_pack), none (no layer: a "
        "Whisper whose logits come from the int8 scan)", "vllm", ("vllm", "lm-head", "none")),
    Var("EDGECTL_SPEECH_HEAD", Role.OWN, "how a Whisper's logits are computed (edgectl_runtime/vllm_plugin/"
        "whisper_exact_top.py): dense (the tied table in the model's dtype, the best 8 again in float32) or w8-scan "
        "(an int8 copy of the table scanned on edgectl's kernels, the best 8 again in float32 from the table; the "
        "plan's speech.head)", "dense", ("dense", "w8-scan")),
    # -- test only: a fault injection, refused in a deployed unit and never rendered into one --------
    Var("EDGECTL_TEST_STALL", Role.OWN, "TEST ONLY: a file name; when that file exists as the engine is about "
        "to run a step, the worker deletes it and its engine thread stops coming back (the HTTP server stays "
        "up), so the watchdog's promise can be tested. The worker refuses to start with it in a unit edgectl "
        "deployed (edgectl-NAME.service) and the unit writer refuses a plan that sets it", ""),
    # -- third parties' variables edgectl sets ------------------------------------------------------
    Var("VLLM_CPU_OMP_THREADS_BIND", Role.SET, "plan env: the CPUs vLLM binds its OpenMP threads to, one "
        "per thread (vllm/v1/worker/cpu_worker.py)"),
    Var("OMP_NUM_THREADS", Role.SET, "plan env: the OpenMP threads of the engine (the plan's threads)"),
    Var("GOMP_SPINCOUNT", Role.SET, "plan env: SHORT_SPINCOUNT when the plan's levers.thread_wait is spin-short "
        "(GNU libgomp's threads spin that many times between parallel regions, then sleep; its default is 300000)"),
    Var("OMP_WAIT_POLICY", Role.SET, "plan env: PASSIVE when the plan's levers.thread_wait is passive (GNU "
        "libgomp's threads then sleep at once between parallel regions instead of spinning first)"),
    Var("THP_MEM_ALLOC_ENABLE", Role.SET, "plan env: 1 when the plan's levers.huge_pages is on: PyTorch's CPU "
        "allocator aligns allocations of 2 MiB or more to 2 MiB and madvises them MADV_HUGEPAGE "
        "(c10/core/impl/alloc_cpu.cpp), so transparent huge pages back them where the kernel's THP mode is "
        "always or madvise"),
    Var("TORCHINDUCTOR_CPP_WRAPPER", Role.SET, "plan env: 1 when the plan's levers.cpp_wrapper is on: in compiled "
        "mode inductor writes the graph's wrapper (the code that calls each kernel and op of a step) in C++ and "
        "compiles it, instead of running it as Python (torch/_inductor/config.py, cpp_wrapper)"),
    Var("VLLM_USE_LAYERNAME", Role.SET, "plan env: 0 when the plan's levers.cpp_wrapper is on: vLLM passes a "
        "layer's name to its attention ops as a str, not as torch's opaque LayerName object, which inductor's "
        "C++ wrapper cannot pass (vllm/utils/torch_utils.py, LayerNameType)"),
    Var("VLLM_ENABLE_V1_MULTIPROCESSING", Role.SET, "plan env, single-process topology: 0 keeps vLLM's "
        "model worker in the engine's process (vllm/platforms/cpu.py:333-341)"),
    Var("VLLM_CPU_NUM_OF_RESERVED_CPU", Role.SET, "plan env, stock topology: CPUs vLLM keeps for its front "
        "end (1 or 0, the plan's reserve_frontend_core)"),
    Var("HF_HUB_OFFLINE", Role.SET, "plan env, unit, bench servers, model conversion: nothing may reach a "
        "model hub (huggingface_hub reads it at import)"),
    Var("TRANSFORMERS_OFFLINE", Role.SET, "plan env, bench servers, model conversion: transformers' own "
        "offline switch"),
    Var("HF_HUB_DISABLE_TELEMETRY", Role.SET, "model conversion: huggingface_hub sends no telemetry"),
    Var("VLLM_NO_USAGE_STATS", Role.SET, "plan env, unit, bench servers: vLLM reports no usage statistics"),
    Var("DO_NOT_TRACK", Role.SET, "plan env, unit, bench servers: the common opt-out of telemetry"),
    Var("HOME", Role.SET, "unit: the service's state directory (StateDirectory=edgectl/NAME)"),
    Var("XDG_CACHE_HOME", Role.SET, "unit: the service's cache directory (CacheDirectory=edgectl/NAME); "
        "also read for the default EDGECTL_MODEL_CACHE of a non-root user"),
    Var("VLLM_CACHE_ROOT", Role.SET, "unit: vLLM's caches (the compiled graph among them), under the service's "
        "cache directory; bench servers: each pass's own, empty at its first start"),
    Var("TORCHINDUCTOR_CACHE_DIR", Role.SET, "unit: torch inductor's compiled kernels (compiled mode); bench "
        "servers: each pass's own, empty at its first start"),
    Var("TRITON_CACHE_DIR", Role.SET, "unit: triton's cache, should anything import it"),
    Var("PYTHONUNBUFFERED", Role.SET, "unit: log lines reach the journal as they are written"),
    Var("PYTHONPATH", Role.SET, "every runtime program started from a checkout (edgectl/launch.py): the checkout's runtime, never an older "
        "installed one"),
    Var("VLLM_PLUGINS", Role.SET, "bench, unmodified-vLLM arms: every general plugin but edgectl's"),
    Var("VLLM_SERVER_DEV_MODE", Role.SET, "bench, unmodified-vLLM arms: adds the dev routes "
        "(/collective_rpc) the read-back uses, nothing else"),
    # -- refused ------------------------------------------------------------------------------------
    Var("VLLM_CPU_KVCACHE_SPACE", Role.REFUSED, "overrides the planned KV cache bytes (vLLM 0.32 "
        "platforms/cpu.py:323-327)", planned=lambda plan: f"{plan.kv_cache_bytes} bytes"),
    # -- read, not owned ----------------------------------------------------------------------------
    Var("ATEN_CPU_CAPABILITY", Role.READ, "PyTorch's ceiling on its kernels' ISA (default, avx2, avx512); "
        "edgectl's own kernels at EDGECTL_KERNEL_ISA=auto stay under it too (runtime/edgectl_runtime/kernels/ops), so "
        "the one variable puts a process on its AVX2 path"),
    Var("NOTIFY_SOCKET", Role.READ, "systemd's notify socket: the worker sends READY/STATUS/WATCHDOG there; "
        "edgectl serve and the bench do not pass it on"),
    Var("WATCHDOG_USEC", Role.READ, "systemd's WatchdogSec in µs: the worker pings at a quarter of it"),
    Var("WATCHDOG_PID", Role.READ, "the process systemd's watchdog is for"),
    Var("INVOCATION_ID", Role.READ, "set by systemd for a service: the worker then logs without timestamps "
        "(the journal has them)"),
]

REGISTRY: dict[str, Var] = {v.name: v for v in _VARS}

# Fault injections for tests: never in a deployment (the worker and the unit writer refuse them).
TEST_ONLY = ("EDGECTL_TEST_STALL",)

# The offline and no-telemetry settings every process edgectl starts gets.
OFFLINE: dict[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                           "DO_NOT_TRACK": "1"}
# systemd's notify protocol: meant for the service's main process, not for a child it starts.
SYSTEMD_NOTIFY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
# Families of variables that tune an engine (vLLM, OpenMP, MKL, llama.cpp, edgectl's levers): a
# benchmarked server does not inherit them from the shell, so they cannot change an arm behind its back.
TUNING_PREFIXES = ("VLLM_", "EDGECTL_", "OMP_", "KMP_", "MKL_", "GOMP_", "LLAMA_", "GGML_")
# The variables that hold a process's code to a lower ISA than its CPU's: PyTorch's kernels and inductor's
# vector ISA, oneDNN's JIT, MKL's GEMMs, the -march inductor compiles with, glibc's string functions,
# edgectl's kernels (the AVX2 tier sets them all: tests/isa_helpers.py AVX2_CAPS has the values and the
# source lines). A benchmarked server inherits them, whatever their prefix: they are the path under test,
# and a compiled graph's cache key holds them (runtime/edgectl_runtime/vllm_plugin/compile_cache.py).
# The spins of the spin-short wait (libgomp's default is 300000): tens of microseconds on a few-GHz core.
SHORT_SPINCOUNT = "10000"
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "TORCHINDUCTOR_CPP_MARCH",
            "GLIBC_TUNABLES", "EDGECTL_KERNEL_ISA")
NOT_INHERITED_BY_SERVERS = (*SYSTEMD_NOTIFY, "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "CUDA_VISIBLE_DEVICES")


def read(name: str, environ: Mapping[str, str]) -> str:
    """The value of one of edgectl's variables in ``environ`` (empty means unset), or its default.

    A value outside the variable's choices raises ValueError naming the variable and the values
    it accepts: a mistyped lever must not silently run the other arm of a benchmark.
    """
    var = REGISTRY[name]  # KeyError: declare the variable first
    if var.role is not Role.OWN:
        raise KeyError(f"{name} is not one of edgectl's variables ({var.role})")
    value = environ.get(name, "").strip()
    if not value:
        return var.default_from(environ) if var.default_from is not None else str(var.default)
    if var.choices is not None and value not in var.choices:
        raise ValueError(f"{name}={value!r} is not valid: use one of {', '.join(var.choices)}")
    return value


def read_bool(name: str, environ: Mapping[str, str]) -> bool:
    return read(name, environ) == "1"


def read_int(name: str, environ: Mapping[str, str]) -> int:
    return int(read(name, environ))


def snapshot(environ: Mapping[str, str]) -> dict[str, str]:
    """The effective value of the runtime's levers (for read-back and bench provenance)."""
    return {name: read(name, environ) for name in _RUNTIME_LEVERS}


def runtime_python(environ: Mapping[str, str]) -> str:
    """The runtime interpreter (EDGECTL_RUNTIME_PYTHON), resolved to an executable's path."""
    import shutil

    from edgectl.errors import EdgectlError

    python = read("EDGECTL_RUNTIME_PYTHON", environ)
    found = shutil.which(python)
    if found is None:
        raise EdgectlError(
            f"the runtime interpreter {python!r} (EDGECTL_RUNTIME_PYTHON) is not an executable: point "
            "EDGECTL_RUNTIME_PYTHON at the python of the environment with edgectl[runtime] installed "
            "(scripts/setup.sh makes /opt/edgectl/venv/bin/python)"
        )
    return found


# -- the plan's side of the runtime's variables -----------------------------------------------------

_RUNTIME_LEVERS = ("EDGECTL_ROPE_CAP", "EDGECTL_LEAN_ATTENTION", "EDGECTL_DECODE_ATTENTION", "EDGECTL_KV_INT8",
                   "EDGECTL_TOWER_TILES",
                   "EDGECTL_LAYERWISE_REPACK",
                   "EDGECTL_LM_HEAD",
                   "EDGECTL_INT4_GROUP_SIZE", "EDGECTL_INT4_KERNEL", "EDGECTL_LINEAR_BITS", "EDGECTL_INT4_PARTS",
                   "EDGECTL_KERNEL_ISA", "EDGECTL_COMPILE_CACHE", "EDGECTL_EMBEDDING_PACK")
# weight format → the cpu_int4 plugin's kernel (EDGECTL_INT4_KERNEL) and its linear layers' bits (EDGECTL_LINEAR_BITS)
_KERNEL = {"w4a16": ("torch", 4), "w4a16-vllm": ("vllm", 4), "w4a8": ("edgectl", 4), "w8a8": ("edgectl", 8)}


def runtime_levers(plan: Plan) -> dict[str, str]:
    """The plan's levers as the runtime's variables.

    The worker puts these into its own environment before vLLM starts; in the stock topology
    vLLM's spawned processes inherit them. One place maps plan → variables, so the bench's lever
    pairs differ in exactly the variable under test.
    """
    env = {
        "EDGECTL_ROPE_CAP": "1" if plan.levers.rope_cap else "0",
        "EDGECTL_LEAN_ATTENTION": "1" if plan.levers.lean_attention else "0",
        "EDGECTL_DECODE_ATTENTION": "1" if plan.levers.decode_attention else "0",
        "EDGECTL_KV_INT8": "1" if str(plan.kv_cache_dtype) == "int8" else "0",
        "EDGECTL_LAYERWISE_REPACK": "1" if plan.levers.layerwise_repack else "0",
        "EDGECTL_LM_HEAD": plan.lm_head_format,
        # edgectl's worker always loads what an earlier start compiled (a no-op in eager mode);
        # the unmodified-vLLM comparison is the bench's stock arm, without edgectl's plugin.
        "EDGECTL_COMPILE_CACHE": "1",
        "EDGECTL_EMBEDDING_PACK": str(plan.levers.embedding_pack),
        "EDGECTL_TOWER_TILES": str(plan.vision.tower_tiles if plan.vision is not None else 0),
    }
    if plan.group_size:  # a dense speech plan has none (0)
        env["EDGECTL_INT4_GROUP_SIZE"] = str(plan.group_size)
    kernel = _KERNEL.get(str(plan.weight_format))
    if kernel:
        env["EDGECTL_INT4_KERNEL"] = kernel[0]
        env["EDGECTL_LINEAR_BITS"] = str(kernel[1])
        # a vision-language model: the language model only, the tower as the reference it is checked against
        env["EDGECTL_INT4_PARTS"] = "language-model" if plan.vision is not None else "all"
    return env


def refused(environ: Mapping[str, str], plan: Plan) -> list[str]:
    """Variables in ``environ`` that would change the plan behind its back, one line each."""
    problems = []
    for var in _VARS:
        value = environ.get(var.name) if var.role is Role.REFUSED else None
        if value:  # vLLM ignores an empty value
            assert var.planned is not None
            problems.append(f"{var.name}={value} is set and {var.meaning}: unset it (the plan sets "
                            f"{var.planned(plan)})")
    return problems
