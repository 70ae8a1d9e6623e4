"""The planner: from probe facts, model facts and device profiles to a Plan.

``plan(facts, model, profiles, request)`` is a pure function: no I/O, no clock, no
environment. Every decision carries its reason and the source of the number behind it
(a measured profile, the model's config, the user's flag, the probe, or a stated
fallback). A request that cannot be served raises :class:`EdgectlError` (exit 2) with
need vs budget and the request that would fit.

Memory ledger (what the service's processes hold, steady state, as PSS):
    runtime    fixed cost of each process that imports Python + torch + vLLM (+ the HTTP
               server), measured per device class, times the processes of the topology
    weights    the resident weights in the chosen format (int4 layers: packed uint8 N×K/2
               plus bf16 scales and zeros; embeddings, norms and an unquantized head: bf16)
    kv_cache   exactly the planned KV bytes (vLLM zero-fills it: committed up front,
               ``v1/worker/utils.py:596``)
    rope       the cos/sin table: rows × rotary_dim × 2 bytes (capped to the context)
    workspace  activations of the largest batch (``max_num_batched_tokens``) kept by the
               allocator after the warm-up pass
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from collections.abc import Callable
from typing import Any, NamedTuple

from edgectl.contract import int4_layout
from edgectl.errors import EdgectlError
from edgectl.profiles import WEIGHT_FORMATS, Figure, Profile, select_profile

SCHEMA = "edgectl.plan/1"
MiB = 1 << 20
GiB = 1 << 30

BLOCK_SIZE_TOKENS = 128  # vLLM's CPU default KV block (platforms/cpu.py: block_size = 128)
DEFAULT_CONTEXT_CAP = 4096  # unless asked: long contexts cost KV and prefill time on a small CPU box
MIN_CONTEXT = 512  # below this a chat model is of little use; refuse rather than plan it
# Prefill runs in chunks of at most this many tokens. Measured here (SmolLM2, w4a16, 2 cores):
# 512-token chunks prefilled a 512-token prompt as fast as 2048-token chunks (548-569 vs 559-576
# tok/s), held 30 MB less, and keep each engine step (what the watchdog and other requests wait
# for) a quarter as long.
MAX_BATCHED_TOKENS = 512
DTYPE_BYTES = 2  # bf16 activations, KV cache, scales and the RoPE table

# Without a measured figure (fallback profile): one process importing Python, torch and
# vLLM held ~0.5 GB here (shared/facts/measured-here.md: "~0.5 GB per process that imports
# them"); the single-process server adds the HTTP stack on top.
FALLBACK_PROCESS_BYTES = 640 * MiB
FALLBACK_LOAD_PEAK_RATIO = 1.3
# A conservative activation estimate per batched token when the profile has none: hidden
# states and residuals (8 × hidden) and the MLP's gate/up/act buffers (4 × intermediate), fp32.
FALLBACK_WORKSPACE_FACTOR = 4

FORMAT_PRIOR = ("w4a16", "w4a16-vllm", "w4a8-amx", "bf16")  # order among formats nobody measured here

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_NAME = "default"


@dataclass(frozen=True)
class Request:
    """What the user asked for; ``None`` means "let the planner decide"."""

    model: str
    max_model_len: int | None = None
    max_num_seqs: int = 1
    weight_format: str | None = None
    group_size: int | None = None  # preferred int4 group; None: the model's hint, else 128
    # Why a model prefers a group size (the catalog knows how its weights were made).
    group_size_hint: tuple[int, str] | None = None
    threads: int | None = None
    name: str = DEFAULT_NAME
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # Levers, so a benchmark can switch each one (None = the planner's choice).
    topology: str | None = None
    rope_cap: bool | None = None
    layerwise_repack: bool | None = None
    reserve_frontend_core: bool | None = None
    compilation: str | None = None
    quantize_lm_head: bool | None = None
    kv_cache_bytes: int | None = None  # exact KV bytes (the bench's stock arm copies the plan's)
    watchdog_s: int | None = None  # WatchdogSec; default: from the predicted longest engine step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Reason:
    decision: str
    value: Any
    source: str  # profile | model-config | flag | probe | fallback
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"decision": self.decision, "value": self.value, "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class Memory:
    weights_bytes: int
    kv_cache_bytes: int
    rope_bytes: int
    runtime_bytes: int
    workspace_bytes: int
    total_bytes: int
    high_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class Plan:
    model: dict[str, Any]
    device_class: str
    profile: dict[str, Any]
    weight_format: str
    group_size: int
    quantize_lm_head: bool
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    block_size: int
    rope_rows: int
    threads: int
    cpus: list[int]
    topology: str
    compilation: str
    levers: dict[str, Any]
    memory: Memory
    predicted: dict[str, float | None]
    serve: dict[str, Any]
    timeouts: dict[str, int]
    env: dict[str, str]
    reasons: list[Reason]
    request: dict[str, Any]
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "model": dict(self.model),
            "device_class": self.device_class,
            "profile": dict(self.profile),
            "weight_format": self.weight_format,
            "group_size": self.group_size,
            "quantize_lm_head": self.quantize_lm_head,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_size": self.block_size,
            "rope_rows": self.rope_rows,
            "threads": self.threads,
            "cpus": list(self.cpus),
            "topology": self.topology,
            "compilation": self.compilation,
            "levers": dict(self.levers),
            "memory": asdict(self.memory),
            "predicted": dict(self.predicted),
            "serve": dict(self.serve),
            "timeouts": dict(self.timeouts),
            "env": dict(self.env),
            "reasons": [r.to_dict() for r in self.reasons],
            "request": dict(self.request),
        }

    def render_text(self) -> str:
        m = self.memory
        lines = [
            f"plan for {self.model['name']} on {self.device_class} (profile {self.profile['name']}, {self.profile['kind']})",
            f"  weights     {self.weight_format}" + (f", int4 groups of {self.group_size}" if self.weight_format != "bf16" else ""),
            f"  context     {self.max_model_len} tokens × {self.max_num_seqs} sequence(s); RoPE rows {self.rope_rows}",
            f"  threads     {self.threads} on CPUs {_cpu_list(self.cpus)}; topology {self.topology}; {self.compilation} mode",
            "  memory (steady, predicted):",
            f"    runtime    {_mib(m.runtime_bytes)}",
            f"    weights    {_mib(m.weights_bytes)}",
            f"    KV cache   {_mib(m.kv_cache_bytes)} ({self.kv_bytes_per_token} B/token)",
            f"    RoPE       {_mib(m.rope_bytes)}",
            f"    workspace  {_mib(m.workspace_bytes)}",
            f"    total      {_mib(m.total_bytes)}   MemoryHigh {_mib(m.high_bytes)}   MemoryMax {_mib(m.limit_bytes)}",
        ]
        pred = self.predicted
        if pred.get("decode_tok_s"):
            lines.append(f"  predicted   decode {pred['decode_tok_s']:.1f} tok/s"
                         + (f", prefill {pred['prefill_tok_s']:.0f} tok/s" if pred.get("prefill_tok_s") else ""))
        lines.append("  reasons:")
        for r in self.reasons:
            lines.append(f"    - {r.decision} = {r.value} [{r.source}] {r.detail}")
        return "\n".join(lines)


# -- pieces of the ledger ---------------------------------------------------------------


def kv_bytes_per_token(model: Any) -> int:
    """KV bytes one token occupies in a full-attention layer stack (K and V, every KV head)."""
    per_layer = 2 * model.num_kv_heads * model.head_dim * DTYPE_BYTES
    return per_layer * model.num_layers


def kv_cache_bytes_for(model: Any, max_model_len: int, max_num_seqs: int, block_size: int = BLOCK_SIZE_TOKENS,
                       max_num_batched_tokens: int | None = None) -> int:
    """Bytes that hold ``max_num_seqs`` sequences of ``max_model_len`` tokens, in whole blocks.

    vLLM's block pool keeps one block aside (the null block, ``v1/core/block_pool.py``), so a
    pool of exactly ``ceil(len / block) × seqs`` blocks is refused at start-up: plan one more.
    A sliding-window layer holds, per sequence, what vLLM's admission check reserves
    (``SlidingWindowSpec.max_admission_blocks_per_request``, ``v1/kv_cache_interface.py``):
    ``ceil(min(window − 1 + tokens in flight, max_model_len) / block) + 1`` blocks — the window
    plus one engine step's batch (the CPU backend runs one batch at a time: async scheduling
    is off, ``platforms/cpu.py:331``), plus one because the window need not start on a block
    boundary. Below the window that is one block *more* than a full-attention layer.
    """
    per_layer_token = 2 * model.num_kv_heads * model.head_dim * DTYPE_BYTES
    full_blocks = math.ceil(max_model_len / block_size)
    in_flight = max_num_batched_tokens if max_num_batched_tokens is not None else min(max_model_len, MAX_BATCHED_TOKENS)
    total = 0
    layer_types = list(model.layer_types or ["full_attention"] * model.num_layers)
    for kind in layer_types:
        blocks = full_blocks
        if kind == "sliding_attention" and model.sliding_window:
            held = min(model.sliding_window - 1 + in_flight, max_model_len)
            blocks = math.ceil(held / block_size) + 1
        total += (blocks * max_num_seqs + 1) * block_size * per_layer_token
    return total


def rope_rows_uncapped(model: Any) -> int | None:
    """Rows vLLM 0.32 builds for the cos/sin table without edgectl's cap.

    ``rotary_embedding/base.py:94-103`` uses ``max_position_embeddings``; YaRN uses
    ``original_max_position_embeddings × factor`` (``yarn_scaling_rope.py:76-85``).
    """
    scaling = model.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind == "yarn" and scaling.get("original_max_position_embeddings") and scaling.get("factor"):
        return int(scaling["original_max_position_embeddings"] * scaling["factor"])
    return int(model.max_position_embeddings or 0) or None  # None: config.json gives no maximum


def rope_bytes_for(model: Any, rows: int) -> int:
    return rows * model.head_dim * DTYPE_BYTES  # cos and sin halves: rotary_dim values per row


def weights_bytes_for(model: Any, weight_format: str, group_size: int, quantize_lm_head: bool) -> tuple[int, int, int]:
    """(resident weight bytes, quantized linear layers, linear layers left in bf16)."""
    pb = model.param_bytes
    rest = pb.embedding + pb.lm_head + pb.other
    if weight_format == "bf16":
        return pb.total, 0, len(model.linear_layers)
    total = rest
    quantized = kept = 0
    for layer in model.linear_layers:
        n, k = layer.out_features, layer.in_features
        ok, _ = int4_layout.quantizable(n, k, group_size)
        if ok:
            g = int4_layout.choose_group_size(k, group_size)
            total += int4_layout.packed_bytes(n, k, g)
            quantized += 1
        else:
            total += n * k * DTYPE_BYTES
            kept += 1
    if quantize_lm_head:
        # The (tied) embedding/LM head becomes int4 too; it is one [vocab, hidden] matrix.
        n, k = model.vocab_size, model.hidden_size
        g = int4_layout.choose_group_size(k, group_size)
        head = pb.lm_head or pb.embedding
        if g is not None and n % 16 == 0:
            total += int4_layout.packed_bytes(n, k, g) - head
    return total, quantized, kept


# -- the planner --------------------------------------------------------------------------


def _host_runs(fmt: str, facts: Any) -> tuple[bool, str]:
    """Whether this host can execute a format's kernel at all (before any profile says so)."""
    isa = facts.cpu.isa
    arch = facts.cpu.arch
    if fmt == "bf16":
        return True, "vLLM's CPU backend runs bf16 everywhere it runs"
    if fmt == "w4a16":
        if arch in ("x86_64", "aarch64"):
            return True, "PyTorch's _weight_int4pack_mm_for_cpu has AVX2, AVX-512, NEON and scalar kernels"
        return False, f"PyTorch's CPU int4 kernel is not available for {arch}"
    if fmt == "w4a16-vllm":
        avx512 = all(getattr(isa, f, False) for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
        if arch == "x86_64" and avx512:
            return True, "vLLM loads its AVX-512 library here, which has cpu_gemm_wna16"
        return False, ("vLLM's cpu_gemm_wna16 is compiled only into its AVX-512 libraries; this host "
                       "loads _C_AVX2 (vllm-project/vllm#55613)" if arch == "x86_64" else
                       f"vLLM's int4 CPU kernels are not built for {arch}")
    if fmt == "w4a8-amx":
        amx = getattr(isa, "amx_tile", False) and getattr(isa, "amx_int8", False)
        granted = str(getattr(facts.cpu, "amx_permission", "")) == "granted"
        if arch == "x86_64" and amx and granted:
            # The host could run it, but edgectl's runtime cannot yet: the cpu_int4 plugin has
            # no W4A8 path (vLLM's int4_scaled_mm_cpu is not wired in). Never plan what the
            # worker would fail to serve.
            return False, ("AMX is usable here, but edgectl's runtime has no W4A8 path yet "
                           "(vLLM's int4_scaled_mm_cpu is not wired into the cpu_int4 plugin)")
        if amx and not granted:
            # "not-checked" (a captured tree, or facts from another host): unverified is not
            # usable; the worker would fail at its first AMX instruction if the kernel refused.
            return False, (f"AMX is listed but the tile-data permission was {facts.cpu.amx_permission}"
                           + (": run `edgectl probe` on the host itself to verify it"
                              if str(facts.cpu.amx_permission) == "not-checked" else ""))
        return False, "needs AMX (int4_scaled_mm_cpu), which this host does not have usable"
    return False, f"unknown format {fmt}"


def _choose_format(facts: Any, model: Any, profile: Profile, request: Request,
                   reasons: list[Reason]) -> list[tuple[str, Reason]]:
    """The formats this host can run, best first, each with the reason it would be chosen.

    The planner takes the first one that fits the memory budget (``plan``).
    """
    checkpoint = _checkpoint_format(model)
    runnable: dict[str, str] = {}
    refused: dict[str, str] = {}
    for fmt in WEIGHT_FORMATS:
        ok, why = _host_runs(fmt, facts)
        figures = profile.formats.get(fmt)
        if ok and figures is not None and not figures.runs:
            ok, why = False, f"profile {profile.name}: {figures.reason}"
        if ok and fmt in ("w4a16-vllm", "w4a8-amx") and (figures is None or figures.decode_tok_s is None):
            # these kernels are chosen only where a measurement showed them running
            ok, why = False, f"not measured on {profile.name}: chosen only where a profile shows it runs"
        if ok and checkpoint in ("gptq", "awq") and fmt == "bf16":
            ok, why = False, f"the checkpoint is {checkpoint} 4-bit: edgectl serves it as 4-bit, not bf16"
        if ok and checkpoint == "cpu_int4" and fmt != "w4a16":
            ok, why = False, "the checkpoint is a cpu_int4 portable checkpoint (PyTorch's int4 kernel)"
        (runnable if ok else refused)[fmt] = why

    if request.weight_format:
        fmt = request.weight_format
        if fmt not in WEIGHT_FORMATS:
            raise EdgectlError(f"unknown weight format {fmt!r}: use one of {', '.join(WEIGHT_FORMATS)}")
        if fmt not in runnable:
            options = ", ".join(sorted(runnable)) or "none"
            raise EdgectlError(f"--format {fmt} cannot run here: {refused[fmt]} (runnable here: {options})")
        return [(fmt, Reason("weight_format", fmt, "flag", f"asked with --format; {runnable[fmt]}"))]

    def measured(fmt: str) -> Figure | None:
        figures = profile.formats.get(fmt)
        return figures.decode_tok_s if figures else None

    ranked = sorted(
        runnable,
        key=lambda f: (measured(f) is not None, measured(f).median if measured(f) else 0.0, -FORMAT_PRIOR.index(f)),
        reverse=True,
    )
    if not ranked:
        raise EdgectlError("no weight format can run on this host: " + "; ".join(f"{k}: {v}" for k, v in refused.items()))
    candidates: list[tuple[str, Reason]] = []
    for fmt in ranked:
        fig = measured(fmt)
        if fig is not None:
            others = [f"{f} {measured(f).median:g}" for f in ranked if f != fmt and measured(f) is not None]
            detail = f"measured decode on {profile.name}: {fig.describe('tok/s')}"
            if fmt == ranked[0]:
                detail = "fastest " + detail
            if others:
                detail += "; others: " + ", ".join(others) + " tok/s"
            src = profile.reason_source
            candidates.append((fmt, Reason("weight_format", fmt, src, detail)))
        else:
            candidates.append((fmt, Reason("weight_format", fmt, "fallback",
                                           f"not measured on {profile.name}; 4-bit reads the fewest bytes per token "
                                           f"({runnable[fmt]})" if fmt != "bf16" else
                                           f"not measured on {profile.name}; {runnable[fmt]}")))
    skipped = [f"{f}: {why}" for f, why in refused.items()]
    if skipped:
        reasons.append(Reason("formats_not_runnable", sorted(refused), "probe", "; ".join(skipped)))
    return candidates


def _checkpoint_format(model: Any) -> str:
    q = model.quantization_config or {}
    method = str(q.get("quant_method", "")).lower() if isinstance(q, dict) else ""
    if method in ("gptq", "awq", "cpu_int4"):
        return method
    return "bf16" if not method else method


def _choose_cpus(facts: Any, request: Request, profile: Profile, topology: str,
                 reasons: list[Reason]) -> tuple[list[int], int, bool]:
    topo = facts.topology
    usable = list(topo.usable_cpus or [])
    if not usable:
        n = topo.logical_cpus or 1
        usable = list(range(n))
        reasons.append(Reason("cpus", _cpu_list(usable), "fallback", "usable CPUs unknown; assuming all online CPUs"))
    nodes = [n for n in (topo.numa_nodes or []) if set(n.cpus) & set(usable)]
    cpus = usable
    scope = topo.logical_cpus or len(usable)  # the CPUs the chosen ones are taken from
    if len(nodes) > 1:
        best = max(nodes, key=lambda n: (len(set(n.cpus) & set(usable)), -n.id))
        cpus = sorted(set(best.cpus) & set(usable))
        scope = len(best.cpus)
        reasons.append(Reason("cpus", _cpu_list(cpus), "probe",
                              f"{len(nodes)} NUMA nodes: node-local cores of node {best.id} (weights and KV stay in its memory)"))
    else:
        reasons.append(Reason("cpus", _cpu_list(cpus), "probe", "the CPUs this process may use (affinity ∩ cgroup cpuset)"))

    threads = len(cpus)
    # SMT siblings share a core's execution units; vLLM binds one thread per physical core.
    # The probe gives core counts, not which CPUs are siblings, so the cap is the number of
    # cores behind the scope (the node, or the host): a cpuset of CPUs on distinct cores
    # (`docker --cpuset-cpus 2-3` on a 4-core × 2-thread host) keeps a thread per CPU.
    if topo.physical_cores and topo.logical_cpus and topo.physical_cores < topo.logical_cpus:
        per_core = topo.logical_cpus // topo.physical_cores
        cores = max(1, scope // per_core)
        if per_core > 1 and threads > cores:
            threads = cores
            reasons.append(Reason("threads_smt", threads, "probe",
                                  f"{per_core} hardware threads per core: one OpenMP thread per physical core"))
    if topo.cpu_quota_cores:
        quota_threads = max(1, math.floor(topo.cpu_quota_cores))
        if quota_threads < threads:
            threads = quota_threads
            reasons.append(Reason("threads_quota", threads, "probe",
                                  f"cgroup CPU quota is {topo.cpu_quota_cores:g} cores: more threads would be throttled"))

    reserve = request.reserve_frontend_core
    if reserve is not None:
        reasons.append(Reason("reserve_frontend_core", reserve, "flag", "asked"))
    elif profile.reserve_frontend_core is not None:
        reserve = profile.reserve_frontend_core
        reasons.append(Reason("reserve_frontend_core", reserve, profile.reason_source,
                              profile.reserve_evidence or f"measured on {profile.name}"))
    else:
        reserve = False
        reasons.append(Reason("reserve_frontend_core", False, "fallback",
                              f"not measured on {profile.name}; in the {topology} topology the HTTP front end only "
                              "queues requests and streams tokens"))
    if reserve and threads > 1:
        # OpenMP binds to the first `threads` CPUs; the process keeps all of them, so the
        # front end's threads run on the one left over.
        threads -= 1
    elif reserve:
        reasons.append(Reason("reserve_frontend_core", False, "probe", "only one core: nothing to reserve"))
        reserve = False

    if request.threads is not None:
        if request.threads < 1 or request.threads > len(cpus):
            raise EdgectlError(f"--threads {request.threads} is outside 1..{len(cpus)} (the usable CPUs: {_cpu_list(cpus)})")
        threads = request.threads
        reasons.append(Reason("threads", threads, "flag", "asked with --threads"))
    else:
        reasons.append(Reason("threads", threads, "probe", f"OpenMP threads on CPUs {_cpu_list(cpus[:threads])}"))
    return cpus, threads, reserve


def plan(facts: Any, model: Any, profiles: list[Profile], request: Request) -> Plan:
    """Decide everything the worker will run with, and what it will cost."""
    reasons: list[Reason] = []
    profile, considered = select_profile(profiles, facts)
    reasons.append(Reason("profile", profile.name, profile.reason_source,
                          f"{profile.kind} profile for {profile.device_class}"
                          + ("; nobody has measured this class: figures are conservative guesses" if profile.kind == "fallback" else "")
                          + (f" ({profile.sources[next(iter(profile.sources))].reference})" if profile.kind == "external" and profile.sources else "")))

    if request.max_num_seqs < 1:
        raise EdgectlError(f"--max-num-seqs must be at least 1 (got {request.max_num_seqs})")
    if request.group_size is not None:
        group_size, gsrc, gdetail = request.group_size, "flag", "asked with --group-size"
    elif request.group_size_hint is not None:
        group_size, gdetail = request.group_size_hint
        gsrc = "model-config"
    else:
        group_size, gsrc = int4_layout.DEFAULT_GROUP_SIZE, "fallback"
        gdetail = "the common default for 4-bit weights; smaller groups cost more scale bytes"
    if group_size not in int4_layout.ALLOWED_GROUP_SIZES:
        raise EdgectlError(f"--group-size {group_size} is not one of "
                           f"{', '.join(map(str, int4_layout.ALLOWED_GROUP_SIZES))}")

    candidates = _choose_format(facts, model, profile, request, reasons)
    format_reason_at = len(reasons)  # the chosen format's reason goes here once its size is known

    topology = request.topology or "single-process"
    if topology not in ("single-process", "stock"):
        raise EdgectlError(f"unknown topology {topology!r}: use single-process or stock")
    reasons.append(Reason("topology", topology, "flag" if request.topology else "profile",
                          "API server, engine core and model worker in one process: each process that imports "
                          "torch and vLLM costs ~0.5 GB" if topology == "single-process" else "vLLM's own process layout"))
    processes = profile.processes.get(topology, 1 if topology == "single-process" else 4)

    compilation = request.compilation or profile.compilation
    if compilation not in ("eager", "default"):
        raise EdgectlError(f"--compilation {compilation!r}: use eager or default")
    reasons.append(Reason("compilation", compilation, "flag" if request.compilation else
                          profile.reason_source,
                          ("eager: no torch.compile start-up cost (minutes on 2 cores, measured-here.md)"
                           if compilation == "eager" else "vLLM's default CPU compilation (DYNAMO_TRACE_ONCE + inductor)")
                          + ("" if compilation == profile.compilation else
                             f"; the profile's figures were measured in {profile.compilation} mode, so the memory "
                             "and speed predictions are for that mode")))

    quantize_lm_head = bool(request.quantize_lm_head) if request.quantize_lm_head is not None else False
    rope_cap = True if request.rope_cap is None else request.rope_cap
    layerwise = True if request.layerwise_repack is None else request.layerwise_repack

    cpus, threads, reserve = _choose_cpus(facts, request, profile, topology, reasons)

    psrc = profile.reason_source

    # -- memory: fixed parts
    if profile.process_bytes is not None:
        per_process = int(profile.process_bytes.median)
        rsrc, rdetail = psrc, f"{profile.process_bytes.describe('bytes')} per process"
    else:
        per_process = FALLBACK_PROCESS_BYTES
        rsrc, rdetail = "fallback", f"{FALLBACK_PROCESS_BYTES // MiB} MiB per process (not measured here)"
    runtime_bytes = per_process * processes

    if profile.load_peak_ratio is not None:
        peak_ratio = profile.load_peak_ratio.median
        peak_src = psrc
    else:
        peak_ratio = FALLBACK_LOAD_PEAK_RATIO
        peak_src = "fallback"

    def weights(fmt: str) -> tuple[int, str]:
        weights_bytes, n_quant, n_kept = weights_bytes_for(model, fmt, group_size, quantize_lm_head)
        wdetail = f"{model.param_bytes.total / MiB:.0f} MiB of parameters as {fmt}"
        if fmt != "bf16":
            wdetail += f": {n_quant} linear layers int4 (groups ≤ {group_size}, per layer by K), {n_kept} kept bf16"
            ratio = profile.formats.get(fmt)
            if ratio and ratio.weights_bytes_ratio:
                weights_bytes = int(weights_bytes * ratio.weights_bytes_ratio.median)
                wdetail += f"; × {ratio.weights_bytes_ratio.median:.3f} measured resident/planned"
        return weights_bytes, wdetail

    def make_ledger(weights_bytes: int):
        def ledger(max_len: int) -> Memory:
            batched = min(max_len, MAX_BATCHED_TOKENS)
            kv = (request.kv_cache_bytes if request.kv_cache_bytes
                  else kv_cache_bytes_for(model, max_len, request.max_num_seqs, max_num_batched_tokens=batched))
            rows = max_len if rope_cap else (rope_rows_uncapped(model) or max_len)
            rope = rope_bytes_for(model, rows)
            if profile.workspace_bytes_per_token is not None:
                per_tok = profile.workspace_bytes_per_token.median
            else:
                intermediate = model.intermediate_size or 4 * model.hidden_size
                per_tok = FALLBACK_WORKSPACE_FACTOR * (8 * model.hidden_size + 4 * intermediate)
            workspace = int(per_tok * batched)
            total = runtime_bytes + weights_bytes + kv + rope + workspace
            high = _round_mib(total * peak_ratio * 1.05)
            limit = _round_mib(total * peak_ratio * 1.25)
            return Memory(weights_bytes, kv, rope, runtime_bytes, workspace, total, high, limit)
        return ledger

    # -- context
    budget = facts.memory.budget_bytes
    if budget is None:
        raise EdgectlError("the probe could not tell how much memory this host has (see `edgectl probe`): "
                           "cannot plan without a memory budget")
    if not model.max_position_embeddings and request.max_model_len is None:
        raise EdgectlError(f"{model.path}/config.json gives no max_position_embeddings: cannot size the context; "
                           "pass --max-model-len")
    # without it in config.json, the user's --max-model-len is the only maximum there is
    model_max = int(model.max_position_embeddings or request.max_model_len)
    if request.max_model_len is not None:
        if request.max_model_len < 16:
            raise EdgectlError(f"--max-model-len {request.max_model_len} is too small (at least 16 tokens)")
        if request.max_model_len > model_max:
            raise EdgectlError(f"--max-model-len {request.max_model_len} exceeds what {model.name} supports "
                               f"({model_max}, max_position_embeddings): use --max-model-len {model_max} or less")
    cap = min(model_max, DEFAULT_CONTEXT_CAP)
    target = request.max_model_len if request.max_model_len is not None else cap

    # -- weight format and context together: the best-ranked format that fits the target
    # context; else (no --max-model-len) the one that fits the longest context. A faster
    # format that does not fit must not turn a request that fits into a refusal.
    sized: list[_Sized] = []
    for fmt, why in candidates:
        w_bytes, wdetail = weights(fmt)
        ledger = make_ledger(w_bytes)
        if ledger(target).limit_bytes <= budget:
            sized.append(_Sized(fmt, why, w_bytes, wdetail, ledger, target))
            break
        sized.append(_Sized(fmt, why, w_bytes, wdetail, ledger, _largest_fitting(ledger, budget, target)))
    fitting = [c for c in sized if c.fits_len is not None and (request.max_model_len is None or c.fits_len == target)]
    if not fitting:
        # Refuse with the numbers of the format that comes closest (its hint is the one that holds).
        at = target if request.max_model_len is not None else MIN_CONTEXT
        closest = min(sized, key=lambda c: (-(c.fits_len or 0), c.ledger(at).limit_bytes))
        raise _wont_fit(closest.ledger(at), budget, request, closest.fits_len,
                        closest.fmt if len(sized) > 1 else None)
    best = max(fitting, key=lambda c: (c.fits_len, -sized.index(c)))
    weight_format, why, weights_bytes, wdetail, ledger, max_len = best
    if best is not sized[0]:
        first = sized[0]
        fits = f"fits only {first.fits_len} tokens" if first.fits_len else "does not fit at any context"
        why = Reason("weight_format", weight_format, why.source,
                     f"{first.fmt} ranks first but {fits} in the budget {_mib(budget)} "
                     f"(needs {_mib(first.ledger(target).limit_bytes)} at {target} tokens); {why.detail}")
    reasons.insert(format_reason_at, why)
    if weight_format != "bf16":
        reasons.append(Reason("group_size", group_size, gsrc, gdetail))
    reasons.append(Reason("weights_bytes", weights_bytes, "model-config", wdetail))
    reasons.append(Reason("runtime_bytes", runtime_bytes, rsrc, f"{processes} process(es) × {rdetail}"))
    mem = ledger(max_len)
    if request.max_model_len is not None:
        reasons.append(Reason("max_model_len", max_len, "flag", f"asked; fits: limit {_mib(mem.limit_bytes)} ≤ budget {_mib(budget)}"))
    else:
        detail = (f"largest that fits the budget {_mib(budget)} with {request.max_num_seqs} sequence(s), capped at "
                  f"{'the model maximum' if cap == model_max else f'the default {DEFAULT_CONTEXT_CAP} (ask for more with --max-model-len, up to {model_max})'}")
        reasons.append(Reason("max_model_len", max_len, "probe" if max_len < cap else "model-config", detail))

    kv_detail = (f"{request.max_num_seqs} × {max_len} tokens in {BLOCK_SIZE_TOKENS}-token blocks, "
                 f"{kv_bytes_per_token(model) // model.num_layers} B per token per layer"
                 + (f", sliding-window layers hold their window ({model.sliding_window}) plus one batch"
                    if "sliding_attention" in (model.layer_types or []) else ""))
    if request.kv_cache_bytes:
        kv_detail = "asked (exact bytes)"
    reasons.append(Reason("kv_cache_bytes", mem.kv_cache_bytes, "flag" if request.kv_cache_bytes else "model-config", kv_detail))
    rope_rows = max_len if rope_cap else (rope_rows_uncapped(model) or max_len)
    reasons.append(Reason("rope_rows", rope_rows, "model-config",
                          f"capped to max_model_len (vLLM would build {rope_rows_uncapped(model) or max_len} rows)" if rope_cap
                          else "uncapped: the model's max_position_embeddings, as stock vLLM does"))
    reasons.append(Reason("memory_limit", mem.limit_bytes, peak_src,
                          f"MemoryMax = total × load peak {peak_ratio:.2f} × 1.25; MemoryHigh = × 1.05"))

    # -- predictions (decode is bandwidth-bound: scale by bytes read per token)
    predicted: dict[str, float | None] = {"decode_tok_s": None, "prefill_tok_s": None, "ready_s": None}
    figures = profile.formats.get(weight_format)
    if figures and figures.decode_tok_s:
        predicted["decode_tok_s"] = round(_scale(figures.decode_tok_s, weights_bytes), 2)
    if figures and figures.prefill_tok_s:
        predicted["prefill_tok_s"] = round(_scale(figures.prefill_tok_s, weights_bytes), 2)
    if profile.ready_s:
        predicted["ready_s"] = round(profile.ready_s.median, 1)

    batched = min(max_len, MAX_BATCHED_TOKENS)
    step_s = batched / predicted["prefill_tok_s"] if predicted["prefill_tok_s"] else 120.0
    watchdog_s = int(min(600, max(30, math.ceil(step_s * 3 + 10))))
    if request.watchdog_s is not None:
        if request.watchdog_s < 5:
            raise EdgectlError(f"--watchdog-sec {request.watchdog_s} is too short (at least 5 s)")
        watchdog_s = request.watchdog_s
    start_s = int(min(1800, max(180, math.ceil((predicted["ready_s"] or 300) * 3 + 60))))
    timeouts = {"start_s": start_s, "watchdog_s": watchdog_s, "stop_s": 30}
    reasons.append(Reason("timeouts", timeouts,
                          "flag" if request.watchdog_s is not None else "profile" if predicted["prefill_tok_s"] else "fallback",
                          ("watchdog asked with --watchdog-sec; " if request.watchdog_s is not None else
                           f"watchdog > 3 × the longest engine step ({batched} tokens at the predicted prefill rate"
                           + ("" if predicted["prefill_tok_s"] else ", 120 s when not measured") + "); ")
                          + "start > 3 × the measured time to ready (300 s when not measured)"))

    omp_cpus = cpus[:threads]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": _cpu_list(omp_cpus, sep=","),
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if topology == "single-process":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if topology == "stock":
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "1" if reserve else "0"

    levers = {"rope_cap": rope_cap, "kv_exact": True, "layerwise_repack": layerwise, "topology": topology,
              "reserve_frontend_core": reserve}

    return Plan(
        model={"name": model.name, "path": model.path, "architecture": model.architecture,
               "checkpoint_format": _checkpoint_format(model)},
        device_class=str(facts.device_class),
        profile={"name": profile.name, "file": profile.file, "kind": profile.kind},
        weight_format=weight_format,
        group_size=group_size,
        quantize_lm_head=quantize_lm_head,
        max_model_len=max_len,
        max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=batched,
        kv_cache_bytes=mem.kv_cache_bytes,
        kv_bytes_per_token=kv_bytes_per_token(model),
        block_size=BLOCK_SIZE_TOKENS,
        rope_rows=rope_rows,
        threads=threads,
        cpus=cpus,
        topology=topology,
        compilation=compilation,
        levers=levers,
        memory=mem,
        predicted=predicted,
        serve={"name": request.name, "host": request.host, "port": request.port},
        timeouts=timeouts,
        env=env,
        reasons=reasons,
        request=request.to_dict(),
    )


class _Sized(NamedTuple):
    """One candidate weight format, sized: its weights, its ledger and the longest context that fits."""

    fmt: str
    reason: Reason
    weights_bytes: int
    weights_detail: str
    ledger: Callable[[int], Memory]
    fits_len: int | None


def _scale(fig: Figure, weights_bytes: int) -> float:
    """A throughput measured on one model, scaled to this one by resident weight bytes."""
    ref = fig.source.model_weights_bytes
    if ref:
        return fig.median * ref / max(weights_bytes, 1)
    return fig.median


def _largest_fitting(ledger, budget: int, cap: int) -> int | None:
    """The largest context ≤ cap (a multiple of 256, or cap itself) whose limit fits the budget."""
    if ledger(cap).limit_bytes <= budget:
        return cap
    lo, hi = MIN_CONTEXT, cap
    if lo > hi or ledger(lo).limit_bytes > budget:
        return None
    while hi - lo > 256:
        mid = (lo + hi) // 2 // 256 * 256
        if mid <= lo:
            break
        if ledger(mid).limit_bytes <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _wont_fit(mem: Memory, budget: int, request: Request, fits_len: int | None,
              fmt: str | None = None) -> EdgectlError:
    """The refusal: need vs budget, and the request that would fit.

    ``fmt`` names the weight format the numbers are for when several were tried.
    """
    as_fmt = f" as {fmt} (the format that comes closest)" if fmt is not None else ""
    need = (f"needs {_mib(mem.limit_bytes)}{as_fmt} (steady {_mib(mem.total_bytes)} incl. KV "
            f"{_mib(mem.kv_cache_bytes)}), budget is {_mib(budget)}")
    if fits_len is not None:
        hint = f"fits with --max-model-len {fits_len}"
    elif request.max_num_seqs > 1:
        hint = "does not fit even at the shortest context: try --max-num-seqs 1"
    else:
        hint = ("does not fit at any context: free memory, raise the cgroup limit, or pick a smaller model "
                "(`edgectl models list`)")
    what = (f"{request.model}" + (f" at --max-model-len {request.max_model_len}" if request.max_model_len else "")
            + (f" with --max-num-seqs {request.max_num_seqs}" if request.max_num_seqs > 1 else ""))
    return EdgectlError(f"{what} does not fit: {need}; {hint}")


def _round_mib(n: float) -> int:
    return int(math.ceil(n / MiB) * MiB)


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n < 10 * GiB else f"{n / GiB:.1f} GiB"


def _cpu_list(cpus: list[int], sep: str = ",") -> str:
    """CPU ids as ranges: [0,1,2,5] -> "0-2,5" (the kernel's cpulist format)."""
    from edgectl.probe.formats import format_cpu_list

    return format_cpu_list(cpus, sep)
