"""``edgectl bench``: from the options to the artifact (and, if asked, a recorded profile).

Order of work: check the request (nothing is started or written for bad input), probe the host
with its memory bandwidth, plan the model, prepare the arms, run the interleaved grid
(writing the artifact after every pass, so an interrupted run keeps what it measured),
compare fidelity with the reference arm, summarise, plot, record the profile.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgectl.bench import provenance as prov
from edgectl.bench import report
from edgectl.bench.arms import (
    ARMS,
    CONTROL,
    QUIET_S,
    BenchContext,
    Launcher,
    PreparedArm,
    gguf_types,
    parse_arm_names,
    parse_thread_counts,
    prepare_arms,
)
from edgectl.bench.noise import noise_gate
from edgectl.bench.prediction import memory_prediction
from edgectl.bench.prompts import PREFILL_TOKENS, prompt_set
from edgectl.bench.runner import attach_fidelity, interleaved, run_grid, utc_now
from edgectl.contract import environment
from edgectl.contract.fidelity import PromptSet
from edgectl.contract.gguf_names import DIRECT_GGUF
from edgectl.errors import EdgectlError
from edgectl.llamacpp import LlamaServer, find_llama_server, held_isa

if TYPE_CHECKING:
    from edgectl.contract.plan import Plan
    from edgectl.inputs import Planned
    from edgectl.probe.facts import HostFacts

MIN_PASSES_FOR_PROFILE = 3
QUOTABLE_PASSES = 3
MIN_SOAK_S = 10  # a figure worth quoting is a median of ≥ 3 interleaved passes (docs/facts.md)
Progress = Callable[[str], None]


@dataclass
class BenchOptions:
    model: str
    arms: str | None = None
    passes: int = 3
    out: Path = Path("results")
    max_model_len: int | None = None
    record_profile: bool = False
    profiles_dir: Path | None = None
    plot: bool = False
    seed: int = 0
    start_timeout_s: float = 1800.0
    llama_server: str | None = None
    fidelity: bool = True
    concurrency: int = 1  # N > 1: each pass also decodes N streams at once (the plan's max_num_seqs = N)
    soak_s: float = 0  # > 0: each pass ends with that many seconds of mixed requests (bench/soak.py)
    # The arm the others' fidelity is measured against (default: reference_arm_for()).
    reference: str | None = None
    argv: list[str] | None = None
    quiet_s: float = QUIET_S  # seconds without requests before the steady PSS is read
    # llama-server's thread counts, "1,2" (None: 1, 2 and every usable CPU: arms.thread_sweep)
    llama_threads: str | None = None


def reference_arm_for(ran: Collection[str], gguf_served: bool, asked: str | None = None) -> str | None:
    """The fidelity reference: the one asked for; else, for a GGUF served as it is, llama.cpp on
    the same file (GGUF's reference implementation); else edgectl's bf16 arm, else stock vLLM.
    A llama.cpp arm asked for by its name is its run at the most threads (``llama.cpp-t2``)."""
    if asked is None and gguf_served:
        asked = "llama.cpp" if _at_most_threads(ran, "llama.cpp") else None
    if asked is not None:
        return asked if asked in ran else _at_most_threads(ran, asked)
    return "bf16" if "bf16" in ran else (CONTROL if CONTROL in ran else None)


def _at_most_threads(ran: Collection[str], arm: str) -> str | None:
    """The run of llama.cpp arm ``arm`` at the most threads of the sweep, None if it did not run."""
    runs = [(int(n[len(arm) + 2:]), n) for n in ran
            if n.startswith(f"{arm}-t") and n[len(arm) + 2:].isdigit()]
    return max(runs)[1] if runs else None


@dataclass(frozen=True)
class ServerRuntime:
    """What every arm's server runs under: the runtime interpreter, its versions, the environment."""

    python: str  # EDGECTL_RUNTIME_PYTHON
    info: dict[str, Any]  # prov.runtime_info: vllm, torch, isa, general_plugins
    child_env: dict[str, str]  # the environment servers start from
    dropped: list[str]  # the variables left out of it
    stock_plugins: str  # VLLM_PLUGINS for the unmodified arms
    excluded_plugins: list[str]  # the general plugins left out of it (edgectl's)


def run_bench(opts: BenchOptions, environ: Mapping[str, str], progress: Progress, *,
              facts: HostFacts | None = None, launchers: Mapping[str, Launcher] | None = None) -> report.BenchResult:
    """Run the grid ``opts`` asks for; the result holds the artifact (written as it goes).

    ``facts``: a probe already taken (default: probe this host, with its memory bandwidth).
    ``launchers``: how a launcher's command line is made, by launcher name (default: the real
    servers; see ``arms.Launcher``).
    """
    names = parse_arm_names(opts.arms)
    profiles_dir = opts.profiles_dir or Path(environment.read("EDGECTL_PROFILES_DIR", environ))
    _check_request(opts, names, profiles_dir)
    prompts = prompt_set()

    from edgectl.contract.plan import Request
    from edgectl.inputs import make_plan
    from edgectl.models.cache import resolve_model
    from edgectl.probe import probe

    resolve_model(opts.model, environ)  # a catalog model must be pulled; a directory must exist
    started = _dt.datetime.now(_dt.timezone.utc)
    progress("probing the host (with a ≤ 2 s memory-bandwidth copy)")
    facts = facts if facts is not None else probe("/", bandwidth=True, environ=environ)
    planned = make_plan(Request(model=opts.model, max_model_len=opts.max_model_len, max_num_seqs=opts.concurrency),
                        environ, facts=facts)
    plan = planned.plan
    _check_plan_for_bench(plan, opts, names)
    planner = planner_for(opts.model, environ, facts)
    servers = _server_runtime(environ)
    llama = find_llama_server(environ, opts.llama_server, host_flags=facts.cpu.flags, held_to=held_isa(environ))
    gguf = _gguf_for(opts.model, environ)
    llama_threads = parse_thread_counts(opts.llama_threads, _usable_cpus(facts))
    if opts.reference is not None and opts.reference not in names:
        raise EdgectlError(f"--reference {opts.reference}: that arm is not in --arms ({', '.join(names)})")
    stock_model = _stock_model_for(plan, names, opts.model, environ, progress)

    # the file is named for the device class (the host's name is in the provenance)
    path = report.artifact_path(opts.out, started.strftime("%Y-%m-%d"),
                                report.class_label(facts.device_class, environ), plan.model.name)
    ctx = _bench_context(opts, planned, planner, facts, servers, llama=llama, gguf=gguf, stock_model=stock_model,
                         logs_dir=path.with_suffix(".logs"), launchers=launchers)
    ctx.llama_threads = tuple(llama_threads)
    _add_llama_formats(ctx, names, gguf, environ, progress)
    arms, skipped = _arms_that_can_run(names, ctx, progress)
    artifact = _new_artifact(opts, ctx, arms, skipped, facts, servers, llama, prompts.source, started)
    records, raw = _run_grid_saving(artifact, path, arms, ctx, prompts, opts, progress)
    _conclude(artifact, path, records, raw, opts, gguf_served=plan.model.checkpoint_format == "gguf",
              bandwidth_gbps=facts.bandwidth_gbps)
    result = report.BenchResult(artifact, path)
    if opts.plot:
        result.messages.append(report.plot(artifact, path.with_suffix(".png")))
    if opts.record_profile:
        result.messages.append(_record_profile(artifact, path, profiles_dir, facts, planned, environ))
    return result


def planner_for(model: str, environ: Mapping[str, str], facts: HostFacts) -> Callable[[dict[str, Any]], Plan]:
    """The plan of an arm with overrides (Request.from_flat's names), by the planner ``edgectl plan`` uses."""
    from edgectl.contract.plan import Request
    from edgectl.inputs import make_plan

    def plan_with(overrides: dict[str, Any]) -> Plan:
        return make_plan(Request.from_flat(**{"model": model, **overrides}), environ, facts=facts).plan
    return plan_with


def _check_request(opts: BenchOptions, names: Collection[str], profiles_dir: Path) -> None:
    """Refuse bad options before anything is started or written."""
    if opts.passes < 1:
        raise EdgectlError(f"--passes {opts.passes}: at least 1 (3 or more for a result worth quoting)")
    if opts.concurrency < 1:
        raise EdgectlError(f"--concurrency {opts.concurrency}: at least 1 stream")
    if opts.soak_s < 0 or 0 < opts.soak_s < MIN_SOAK_S:
        raise EdgectlError(f"--soak {opts.soak_s:g}: at least {MIN_SOAK_S} seconds (600 for a drift worth quoting), "
                           "or 0 for none")
    if opts.record_profile:
        if "planned" not in names:
            raise EdgectlError("--record-profile needs the `planned` arm (add it to --arms)")
        if opts.passes < MIN_PASSES_FOR_PROFILE:
            raise EdgectlError(f"--record-profile needs at least {MIN_PASSES_FOR_PROFILE} passes (got --passes {opts.passes})")
    _check_writable(opts.out, "--out")
    if opts.record_profile:
        _check_writable(profiles_dir, "--profiles-dir (or EDGECTL_PROFILES_DIR)")


def _check_plan_for_bench(plan: Plan, opts: BenchOptions, names: Collection[str]) -> None:
    """Refuse a plan the bench's prompts, or the profile asked for, cannot be measured with."""
    if plan.vision is not None:  # its arms and prompts are a text model's: it would measure no image
        raise EdgectlError(f"{plan.model.name} is a vision-language model: the text bench measures no image; "
                           "`edgectl bench` runs the vision bench for it (edgectl/bench/vision/core.py)")
    if plan.max_model_len <= PREFILL_TOKENS:
        raise EdgectlError(f"a context of {plan.max_model_len} tokens has no room for the {PREFILL_TOKENS}-token "
                           f"prefill prompt and its answer: use --max-model-len {PREFILL_TOKENS * 2} or more")
    if opts.record_profile and str(plan.compilation) != "eager" and "eager" not in names:
        raise EdgectlError("--record-profile: the plan is in compiled mode and a profile's figures are eager mode's "
                           "(compiled mode's are recorded beside them): add the `eager` arm to --arms")


def _server_runtime(environ: Mapping[str, str]) -> ServerRuntime:
    python = environment.read("EDGECTL_RUNTIME_PYTHON", environ)
    child_env, dropped = prov.child_environment(environ)
    info = prov.runtime_info(python, child_env)
    plugins, excluded = prov.stock_plugins(info)
    return ServerRuntime(python=python, info=info, child_env=child_env, dropped=dropped,
                         stock_plugins=plugins, excluded_plugins=excluded)


def _bench_context(opts: BenchOptions, planned: Planned, planner: Callable[[dict[str, Any]], Plan],
                   facts: HostFacts, servers: ServerRuntime, *, llama: LlamaServer, gguf: Path | None,
                   stock_model: str | None, logs_dir: Path,
                   launchers: Mapping[str, Launcher] | None) -> BenchContext:
    """What every arm is prepared from: the planned model, the servers, the options."""
    plan = planned.plan
    return BenchContext(
        model_name=plan.model.name, model_path=plan.model.path,
        vocab_size=int(planned.model.vocab_size), kv_bytes_per_token=plan.kv_bytes_per_token,
        planned=plan, planner=planner, runtime_python=servers.python, child_env=servers.child_env,
        logs_dir=logs_dir, usable_cpus=_usable_cpus(facts),
        stock_plugins=servers.stock_plugins, llama_server=llama.path,
        llama_unavailable=llama.origin if not llama.path else None,
        gguf_path=str(gguf) if gguf else None, start_timeout_s=opts.start_timeout_s, launchers=dict(launchers or {}),
        concurrency=opts.concurrency, soak_s=opts.soak_s, stock_model_path=stock_model,
        quiet_s=opts.quiet_s,
    )


def _usable_cpus(facts: HostFacts) -> int:
    return len(facts.topology.usable_cpus or []) or 1


def _add_llama_formats(ctx: BenchContext, names: list[str], gguf: Path | None, environ: Mapping[str, str],
                       progress: Progress) -> None:
    """The model's GGUF type, and its files in the formats the arms ask for (bench/requantize.py),
    into ``ctx``; when they cannot be made, why (the arms that need them are then skipped)."""
    from edgectl.bench import requantize
    from edgectl.models.cache import cache_dir

    if gguf is None or not gguf.is_file():
        ctx.variants_unavailable = "the model has no GGUF to requantize"
        return
    try:
        ctx.gguf_type = requantize.file_type(gguf)
    except EdgectlError:
        ctx.gguf_type = None  # a header edgectl cannot read: llama-server says what it makes of it
    wanted = gguf_types(names)
    if not wanted:
        return
    if not ctx.llama_server:
        ctx.variants_unavailable = f"no llama-quantize without a llama.cpp build ({ctx.llama_unavailable})"
        return
    model_dir = Path(ctx.planned.model.path) if Path(ctx.planned.model.path).is_dir() else None
    try:
        ctx.variants = requantize.variants(wanted, gguf, ctx.llama_server, model_dir, cache_dir(environ), progress)
    except EdgectlError as exc:
        ctx.variants_unavailable = exc.message


def _arms_that_can_run(names: list[str], ctx: BenchContext,
                       progress: Progress) -> tuple[list[PreparedArm], dict[str, str]]:
    """The arms prepared, and why each of the others is skipped; none at all is an error."""
    arms, skipped = prepare_arms(names, ctx)
    for name, why in skipped.items():
        progress(f"skipping arm {name}: {why}")
    if not arms:
        raise EdgectlError("no arm can run here: " + "; ".join(f"{n}: {w}" for n, w in skipped.items()))
    return arms, skipped


def _new_artifact(opts: BenchOptions, ctx: BenchContext, arms: list[PreparedArm], skipped: dict[str, str],
                  facts: HostFacts, servers: ServerRuntime, llama: LlamaServer, prompts_source: str,
                  started: _dt.datetime) -> dict[str, Any]:
    """The artifact before the first pass: its provenance, and each arm with no passes yet."""
    names = [a.name for a in arms]
    return {
        "schema": report.SCHEMA,
        "provenance": {
            "model": ctx.model_name, "model_path": ctx.model_path, "max_model_len": ctx.planned.max_model_len,
            "max_num_seqs": ctx.planned.max_num_seqs, "passes": opts.passes, "seed": opts.seed,
            "arms": names, "order": [f"{n}#{i + 1}" for n, i in interleaved(names, opts.passes)],
            "host": socket.gethostname(), "probe": facts.to_dict(), "edgectl": prov.edgectl_version(),
            "vllm": servers.info.get("vllm"), "torch": servers.info.get("torch"),
            "runtime_isa": servers.info.get("isa"), "runtime_python": servers.python,
            "command": prov.command_line(opts.argv), "started_at": started.isoformat(timespec="seconds"),
            "ended_at": None,
            "environment": {"dropped_from_servers": servers.dropped, "added_for_servers": dict(environment.OFFLINE),
                            "stock_VLLM_PLUGINS": servers.stock_plugins,
                            "stock_plugins_excluded": servers.excluded_plugins,
                            "stock_VLLM_SERVER_DEV_MODE": "1"},
            "llama_server": {"path": llama.path, "origin": llama.origin, "gguf": ctx.gguf_path,
                             "gguf_type": ctx.gguf_type, "threads": list(ctx.llama_threads),
                             "requantized": {t: v.provenance for t, v in ctx.variants.items()}},
            "prompts": prompts_source,
        },
        "concurrency": opts.concurrency, "soak_s": opts.soak_s,
        "finished": False, "complete": False, "quotable": False,
        "arms": {a.name: {**a.describe(), "passes": []} for a in arms},
        "skipped": skipped, "incomplete_reasons": [], "ratios": None, "fidelity": {},
        "versus_llama_cpp": None, "bandwidth_ceiling": None, "memory_prediction": None,
        "noise": None,
    }


def _run_grid_saving(artifact: dict[str, Any], path: Path, arms: list[PreparedArm], ctx: BenchContext,
                     prompts: PromptSet, opts: BenchOptions,
                     progress: Progress) -> tuple[dict[str, list[dict[str, Any]]], dict[tuple[str, int], Any]]:
    """The interleaved grid, the artifact written after every pass (and on an interrupt, marked so)."""
    def save(rec: dict[str, Any]) -> None:
        artifact["arms"][rec["arm"]]["passes"].append(rec)
        report.write_json_atomic(path, artifact)

    progress(f"{len(arms)} arm(s) × {opts.passes} pass(es), interleaved; artifact {path}")
    try:
        return run_grid(arms, opts.passes, ctx, prompts, opts.seed, progress, on_pass=save,
                        with_fidelity=opts.fidelity)
    except KeyboardInterrupt:
        artifact["provenance"]["ended_at"] = utc_now()
        artifact["incomplete_reasons"] = ["interrupted"]
        report.write_json_atomic(path, artifact)
        raise


def _conclude(artifact: dict[str, Any], path: Path, records: dict[str, list[dict[str, Any]]],
              raw: dict[tuple[str, int], Any], opts: BenchOptions, *, gguf_served: bool,
              bandwidth_gbps: float | None) -> None:
    """After the grid: fidelity against the reference arm, the summaries, the memory prediction; written."""
    reference = reference_arm_for(records, gguf_served, opts.reference)
    artifact["fidelity"] = attach_fidelity(records, raw, reference)
    finish(artifact, records, opts.passes, bandwidth_gbps)
    if artifact["complete"]:
        artifact["memory_prediction"] = memory_prediction(
            artifact["arms"], path, roots=[opts.out.absolute(), Path.cwd(), _repo_root()])
    artifact["provenance"]["ended_at"] = utc_now()
    report.write_json_atomic(path, artifact)


def _record_profile(artifact: dict[str, Any], path: Path, profiles_dir: Path, facts: HostFacts, planned: Planned,
                    environ: Mapping[str, str]) -> str:
    """--record-profile: the profile written from a complete grid; what happened, as a message."""
    from edgectl.bench.profile_record import record_profile

    if not artifact["complete"]:
        return "--record-profile: not recorded, the grid is incomplete (see above)"
    written = record_profile(artifact, path, profiles_dir, facts, planned.model, environ)
    return f"profile recorded: {written}"


def finish(artifact: dict[str, Any], records: dict[str, list[dict[str, Any]]], passes: int,
           bandwidth_gbps: float | None) -> None:
    """Summaries, completeness, ratios: the rules in report.py's docstring."""
    summaries = {}
    for name, recs in records.items():
        artifact["arms"][name]["passes"] = recs
        summaries[name] = report.summarise_arm(recs)
        artifact["arms"][name].update(summaries[name])  # passes_ok, passes_run, median, min, max
    reasons = report.incomplete_reasons(records, passes)
    artifact["finished"] = True
    artifact["complete"] = not reasons and bool(records)
    artifact["noise"] = noise_gate(artifact["arms"])
    artifact["quotable"] = artifact["complete"] and passes >= QUOTABLE_PASSES and artifact["noise"]["quiet"]
    artifact["incomplete_reasons"] = reasons
    complete = artifact["complete"]
    artifact["ratios"] = report.ratios(records, summaries) if complete and CONTROL in records else None
    if complete:
        artifact["versus_llama_cpp"] = report.versus_llama(artifact["arms"])
        artifact["bandwidth_ceiling"] = report.bandwidth_ceiling(records, summaries, bandwidth_gbps)


def _repo_root(package_parent: Path | None = None) -> Path:
    """Where committed artifacts live (a profile's sources among them): the checkout edgectl runs from, or
    the one an installed copy was built from (scripts/setup.sh records it), else the working directory.
    ``package_parent``: the directory holding the ``edgectl`` package (default: this one's)."""
    here = package_parent or Path(__file__).resolve().parents[2]
    if (here / "results").is_dir():
        return here
    checkout = prov.built_from().get("checkout")
    if checkout and (Path(checkout) / "results").is_dir():
        return Path(checkout)
    return Path.cwd()


def _stock_model_for(plan: Plan, names: Collection[str], model: str, environ: Mapping[str, str],
                     progress: Progress) -> str | None:
    """For a GGUF served as it is, the bf16 directory stock vLLM arms load (it has no GGUF
    loader, and they run without edgectl's plugin): made once by ``models.convert.bf16_copy``."""
    if plan.model.checkpoint_format != "gguf" or not any(ARMS[n].launcher == "vllm" for n in names if n in ARMS):
        return None
    from edgectl.models.catalog import CATALOG
    from edgectl.models.convert import bf16_copy

    entry = CATALOG.get(model)
    if entry is None:
        return None  # the stock arms are skipped, saying why (arms.VllmArm)
    return str(bf16_copy(entry, environ, progress))


def _gguf_for(model: str, environ: Mapping[str, str]) -> Path | None:
    """The GGUF llama.cpp's arms read: a catalog model's kept file, or the one a directory pulled from a
    user's GGUF serves as it is (its manifest's layout ``gguf-direct``: the same weights as the plan's)."""
    from edgectl.models.cache import LAYOUT, gguf_path, read_manifest, resolve_model
    from edgectl.models.catalog import CATALOG

    entry = CATALOG.get(model)
    if entry is not None:
        return gguf_path(entry, environ)
    path = resolve_model(model, environ)
    manifest = read_manifest(path)
    direct = path / DIRECT_GGUF
    return direct if manifest and manifest.get("layout") == LAYOUT and direct.is_file() else None


def _check_writable(directory: Path, what: str) -> None:
    """Fail before any work if ``directory`` cannot be created or written (nothing is created here)."""
    probe = directory.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise EdgectlError(f"{what} {directory}: {probe} is not a directory: pick a writable directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise EdgectlError(f"{what} {directory}: {probe} is not writable: pick a writable directory")
