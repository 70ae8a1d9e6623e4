"""The grid: arms × passes, interleaved (A B C A B C …), every pass a fresh server process.

A pass ends in one of three states:

- ``ok``: the server came up, its read-back settings are the arm's, every measurement ran;
- ``invalid``: the server ran, but a setting differs from its arm (or the worker refused to
  serve because one did, or a measurement came back not as specified, e.g. a prompt served
  from the cache): its numbers are not recorded, so they cannot be quoted;
- ``crashed``: the server died, never became ready, or stopped answering.

The memory figures are the PSS of the server's whole process tree (``procmem.tree_mem``):
``pss_peak_bytes`` sampled every 0.2 s from launch until ready, ``pss_steady_bytes`` after
the pass's requests (warm-up, decode, prefill, concurrent decode, fidelity, soak) have run and
the server has then been left without requests for ``BenchContext.quiet_s`` (``arms.QUIET_S``).

Every pass starts with empty compile caches of its own (``VLLM_CACHE_ROOT``,
``TORCHINDUCTOR_CACHE_DIR`` under the pass's directory, removed after it), so no pass starts
from what an earlier pass or run compiled. An arm in vLLM's compiled mode served by edgectl's
worker (``PreparedArm.cold_and_warm``) starts twice per pass: a *cold* start on the empty cache
(it compiles and saves the graph; ready, decode and prefill are kept under ``cold``) and a
*warm* start on the cache the cold one left (the pass's main figures). ``ready_cold_s`` and
``ready_warm_s`` are both reported, so neither hides the other. The worker's read-back says
where each start's graph came from; a cold start that did not compile or a warm start that
did not load from the cache makes the pass invalid.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgectl.bench import fidelity as fid
from edgectl.bench import measure, soak
from edgectl.bench.arms import BenchContext, Crashed, PreparedArm, WorkerArm
from edgectl.bench.prompts import ids_digest, long_context_tokens, prefill_token_ids
from edgectl.bench.server import ServerProcess, free_port
from edgectl.client import Client, HttpFailed
from edgectl.contract import fidelity as scoring
from edgectl.contract.effective import Effective
from edgectl.contract.fidelity import PromptSet
from edgectl.contract.procmem import TreeMem

OK, INVALID, CRASHED = "ok", "invalid", "crashed"
Progress = Callable[[str], None]


def interleaved(names: list[str], passes: int) -> list[tuple[str, int]]:
    """(arm, pass index) in run order: every arm's pass i before any arm's pass i + 1."""
    return [(name, i) for i in range(passes) for name in names]


def run_grid(arms: list[PreparedArm], passes: int, ctx: BenchContext, prompts: PromptSet, seed: int,
             progress: Progress, on_pass: Callable[[dict[str, Any]], None] | None = None,
             with_fidelity: bool = True) -> tuple[dict[str, list[dict[str, Any]]], dict[tuple[str, int], Any]]:
    """Run every pass; the records per arm, and the raw fidelity data per (arm, pass)."""
    by_name = {a.name: a for a in arms}
    order = interleaved([a.name for a in arms], passes)
    records: dict[str, list[dict[str, Any]]] = {a.name: [] for a in arms}
    raw: dict[tuple[str, int], Any] = {}
    for position, (name, i) in enumerate(order):
        arm = by_name[name]
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: starting")
        rec, fidelity_raw = run_pass(arm, i, position, ctx, prompts, seed, with_fidelity=with_fidelity)
        records[name].append(rec)
        if fidelity_raw is not None:
            raw[(name, i)] = fidelity_raw
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: {pass_line(rec)}")
        if on_pass:
            on_pass(rec)
    return records, raw


# What a cold start keeps in a compiled arm's pass record (under "cold").
COLD_FIELDS = ("ready_s", "decode_tok_s", "prefill_tok_s", "pss_peak_bytes", "pss_steady_bytes", "started_at",
               "ended_at", "log", "exit_code")


def compile_caches(pass_dir: Path) -> dict[str, str]:
    """The pass's own compile caches (empty at its first start), as the servers' environment."""
    root = pass_dir / "compile-cache"
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor")}


def graph_source(rec: dict[str, Any]) -> str | None:
    """Where a start's compiled graph came from, as the worker read it back: cache | compiled | None."""
    return ((rec.get("effective") or {}).get("compile") or {}).get("source")


def run_pass(arm: PreparedArm, pass_index: int, order: int, ctx: BenchContext, prompts: PromptSet, seed: int,
             *, with_fidelity: bool = True) -> tuple[dict[str, Any], Any]:
    pass_dir = ctx.logs_dir / f"{order:03d}-{arm.name}-p{pass_index + 1}"
    caches = compile_caches(pass_dir)
    try:
        if not arm.cold_and_warm:
            return _one_start(arm, pass_index, order, ctx, prompts, seed, pass_dir, caches,
                              with_fidelity=with_fidelity, soak_s=ctx.soak_s)
        cold, _ = _one_start(arm, pass_index, order, ctx, prompts, seed, pass_dir / "cold", caches,
                             with_fidelity=False)
        if cold["status"] != OK:
            cold["problems"] = [f"cold start: {p}" for p in cold.get("problems") or []]
            cold["error"] = cold["error"] and f"cold start: {cold['error']}"
            return cold, None
        rec, raw = _one_start(arm, pass_index, order, ctx, prompts, seed, pass_dir, caches,
                              with_fidelity=with_fidelity, soak_s=ctx.soak_s)
        rec["cold"] = {**{k: cold.get(k) for k in COLD_FIELDS}, "graph": graph_source(cold)}
        rec["started_at"] = cold["started_at"]
        if rec["status"] != OK:
            return rec, None
        rec.update(ready_cold_s=cold["ready_s"], ready_warm_s=rec["ready_s"],
                   decode_cold_tok_s=cold.get("decode_tok_s"), prefill_cold_tok_s=cold.get("prefill_tok_s"))
        problems = []
        if graph_source(cold) != "compiled":
            problems.append(f"the cold start's graph came from {graph_source(cold)!r}, not a compile: "
                            "its cache was not empty, or the read-back is missing")
        if graph_source(rec) != "cache":
            failure = ((rec.get("effective") or {}).get("compile") or {}).get("load_failure")
            problems.append(f"the warm start's graph came from {graph_source(rec)!r}, not the cache the cold "
                            f"start left" + (f" (load failure: {failure})" if failure else ""))
        if problems:
            rec.update(status=INVALID, problems=problems)
            for key in (*_MEASURED, "ready_cold_s", "ready_warm_s", "decode_cold_tok_s", "prefill_cold_tok_s"):
                rec.pop(key, None)
        return rec, raw if rec["status"] == OK else None
    finally:
        shutil.rmtree(Path(caches["VLLM_CACHE_ROOT"]).parent, ignore_errors=True)


# Numbers a pass that did not complete as specified does not keep: nothing to quote.
_MEASURED = ("decode_tok_s", "prefill_tok_s", "decode_long_tok_s", "pss_steady_bytes", "load_peak_ratio",
             "aggregate_decode_tok_s", "soak_pss_drift")
# perf_counter() readings: meaningless outside the process that took them
_CLOCK_READINGS = ("t_sent", "t_first", "t_last")


def stream_prompts(prompts: PromptSet, n: int) -> list[str]:
    """One prompt per concurrent stream: the shipped set's prompts in turn (a different one each,
    as long as the set lasts), so no two streams start from the same prefix."""
    return [prompts.prompts[i % len(prompts.prompts)] for i in range(n)]


def _one_start(arm: PreparedArm, pass_index: int, order: int, ctx: BenchContext, prompts: PromptSet, seed: int,
               pass_dir: Path, caches: dict[str, str], *, with_fidelity: bool,
               soak_s: float = 0) -> tuple[dict[str, Any], Any]:
    """One server start and its measurements: the record of a pass (or of a compiled arm's cold start)."""
    rec: dict[str, Any] = {
        "arm": arm.name, "pass": pass_index, "order": order, "status": None, "problems": [], "error": None,
        "started_at": utc_now(), "loadavg_start": _loadavg(),
    }
    server = _launch(arm, pass_dir, caches, rec)
    if server is None:
        return rec, None
    client = Client("127.0.0.1", rec["port"])
    fidelity_raw = None
    try:
        ready_mem = _until_ready(arm, client, server, ctx, rec)
        rec["effective"] = arm.readback(client, server)  # the artifact keeps the read-back as it came
        rec.update(arm.from_log(server))  # e.g. what llama.cpp repacked at load (its log, by then complete)
        effective, problems = Effective.read(rec["effective"])
        if effective is not None:
            problems = arm.check(effective, len(ready_mem.processes))
        if problems or effective is None:
            rec.update(status=INVALID, problems=problems)
            return rec, None
        _measure_speeds(client, ctx, prompts, seed, order, rec)
        if with_fidelity:
            fidelity_raw = _collect_fidelity(arm, client, ctx, prompts, rec)
        if soak_s > 0:
            _soak(client, server, ctx, prompts, soak_s, seed * 1000 + order, rec)
        _read_steady(arm, client, server, ctx, effective, rec)
        rec["status"] = OK
    except Crashed as exc:
        rec.update(status=INVALID if exc.invalid else CRASHED, error=str(exc))
        if exc.invalid:
            rec["problems"] = [str(exc)]
    except measure.MeasurementFailed as exc:
        rec.update(status=INVALID, error=str(exc), problems=[str(exc)])
    except HttpFailed as exc:
        state = "the server had exited" if not server.alive() else "the server still ran"
        rec.update(status=CRASHED, error=f"{exc} ({state})")
    finally:
        _stop(server, rec)
    return rec, fidelity_raw


def _launch(arm: PreparedArm, pass_dir: Path, caches: dict[str, str], rec: dict[str, Any]) -> ServerProcess | None:
    """The arm's server started on a free port (its command, port and log in ``rec``); None, the
    record marked crashed, when it cannot be started."""
    port = free_port()
    argv = arm.command(port, pass_dir)
    rec.update(command=argv, port=port, log=str(pass_dir / "server.log"))
    try:
        server = ServerProcess(argv, {**arm.env(), **caches}, pass_dir / "server.log")
    except OSError as exc:
        rec.update(status=CRASHED, error=f"cannot start {argv[0]}: {exc.strerror or exc}", ended_at=utc_now())
        return None
    rec["pid"] = server.pid
    return server


def _until_ready(arm: PreparedArm, client: Client, server: ServerProcess, ctx: BenchContext,
                 rec: dict[str, Any]) -> TreeMem:
    """Wait for the server and its warm-up answer; the time to ready and the peak PSS until then
    (the peak sampler stopped) in ``rec``; the memory at ready."""
    deadline = time.monotonic() + ctx.start_timeout_s
    arm.wait_ready(client, server, deadline)
    text = measure.warm_up(client, ctx.model_name, timeout_s=max(60.0, deadline - time.monotonic()))
    rec["ready_s"] = server.elapsed_s()
    rec["warm_up_text"] = text
    rec["pss_peak_bytes"] = server.stop_sampling()
    rec["pss_peak_samples"] = server.samples
    ready_mem = server.memory()
    rec["pss_ready_bytes"] = ready_mem.pss_bytes
    return ready_mem


def _measure_speeds(client: Client, ctx: BenchContext, prompts: PromptSet, seed: int, order: int,
                    rec: dict[str, Any]) -> None:
    """Decode, prefill on the pass's own prompt, decode at a long context (its own prompt; where the
    context has room), and (concurrency > 1) decode of several streams."""
    ids = prefill_token_ids(seed, order, ctx.vocab_size)
    rec["prefill_prompt"] = {"seed": seed, "order": order, "tokens": len(ids), "digest": ids_digest(ids),
                             "first_ids": ids[:8]}
    d = measure.decode(client, ctx.model_name, prompts.decode_prompt)
    rec["decode_tok_s"] = d.pop("decode_tok_s")
    rec["decode"] = {k: v for k, v in d.items() if k not in _CLOCK_READINGS}
    p = measure.prefill(client, ctx.model_name, ids)
    rec["prefill_tok_s"] = p.pop("prefill_tok_s")
    rec["prefill"] = p
    n = long_context_tokens(ctx.planned.max_model_len)
    if n:
        long_ids = prefill_token_ids(seed, order, ctx.vocab_size, n, purpose="long-context")
        d = measure.decode(client, ctx.model_name, long_ids)
        rec["decode_long_tok_s"] = d.pop("decode_tok_s")
        rec["decode_long"] = {"context_tokens": n, "digest": ids_digest(long_ids),
                              **{k: v for k, v in d.items() if k not in _CLOCK_READINGS}}
    if ctx.concurrency > 1:
        c = measure.concurrent_decode(client, ctx.model_name, stream_prompts(prompts, ctx.concurrency))
        rec["aggregate_decode_tok_s"] = c.pop("aggregate_decode_tok_s")
        rec["concurrent_decode"] = c


def _collect_fidelity(arm: PreparedArm, client: Client, ctx: BenchContext, prompts: PromptSet,
                      rec: dict[str, Any]) -> Any:
    """The outputs fidelity is compared on, the way the arm's server gives them (None: it does not);
    their summary in ``rec``."""
    fidelity_raw = None
    if arm.fidelity == "vllm":
        fidelity_raw = fid.collect_vllm(client, ctx.model_name, prompts)
    elif arm.fidelity == "llama":
        fidelity_raw = fid.collect_llama(client, prompts)
    if fidelity_raw is not None:
        rec["fidelity"] = fid.summary(fidelity_raw)
    return fidelity_raw


def _soak(client: Client, server: ServerProcess, ctx: BenchContext, prompts: PromptSet, soak_s: float,
          seed: int, rec: dict[str, Any]) -> None:
    """``soak_s`` seconds of mixed requests (bench/soak.py) and the PSS drift over them; a failed
    request fails the pass."""
    s = soak.soak(client, ctx.model_name, soak_s, lambda: server.memory().pss_bytes, list(prompts.prompts),
                  ctx.vocab_size, seed)
    rec["soak"] = s
    if s["errors"]:
        raise measure.MeasurementFailed(f"the soak had {s['errors']} failed request(s), e.g. {s['first_errors'][0]}")
    rec["soak_pss_drift"] = s["pss_drift"]


def _read_steady(arm: PreparedArm, client: Client, server: ServerProcess, ctx: BenchContext,
                 effective: Effective, rec: dict[str, Any]) -> None:
    """The steady memory after the measurements (the server still alive), into ``rec``."""
    # The steady state is a server at rest: read after QUIET_S without requests, in every arm
    # alike (an edgectl worker gives freed memory back after 1 s of quiet: levers.idle_trim).
    time.sleep(ctx.quiet_s)
    steady = server.memory()
    if isinstance(arm, WorkerArm):  # what the trim did during the pass (read back; not an API request)
        rec["idle_trim"] = arm.readback(client, server).get("idle_trim")
    if not server.alive():
        raise Crashed(f"the server exited with code {server.returncode()} during the measurements")
    if isinstance(arm, WorkerArm) and arm.plan is not None and arm.plan.levers.huge_pages and not steady.anon_huge_bytes:
        raise Crashed("the plan puts PyTorch's allocations on transparent huge pages, and the tree holds none "
                      "(AnonHugePages 0: is /sys/kernel/mm/transparent_hugepage/enabled 'never'?)", invalid=True)
    rec.update(
        pss_steady_bytes=steady.pss_bytes, pss_anon_steady_bytes=steady.pss_anon_bytes,
        anon_huge_steady_bytes=steady.anon_huge_bytes,
        pss_file_steady_bytes=steady.pss_file_bytes, processes=len(steady.processes),
        process_tree=[{"pid": m.pid, "name": m.name, "pss_bytes": m.pss_bytes} for m in steady.processes],
        load_peak_ratio=(rec["pss_peak_bytes"] / steady.pss_bytes) if steady.pss_bytes else None,
        weights_bytes_per_token=arm.weights_bytes(effective),
    )


def _stop(server: ServerProcess, rec: dict[str, Any]) -> None:
    """Stop the server, however the pass ended; a pass that did not complete keeps no measured number."""
    if "pss_peak_bytes" not in rec:  # the peak sampler still runs: the pass ended before ready
        rec["pss_peak_bytes"] = server.stop_sampling() or None
    rec["exit_code"] = server.stop()
    rec["ended_at"] = utc_now()
    rec["loadavg_end"] = _loadavg()
    if rec["status"] != OK:
        rec["log_tail"] = server.log_tail(12)
        for key in _MEASURED:
            rec.pop(key, None)


def pass_line(rec: dict[str, Any]) -> str:
    if rec["status"] != OK:
        why = "; ".join(rec.get("problems") or []) or rec.get("error") or ""
        return f"{rec['status'].upper()}: {why}"
    ready = f"ready {rec['ready_s']:.1f} s"
    if rec.get("ready_cold_s") is not None:
        ready = (f"ready cold {rec['ready_cold_s']:.1f} s (compiled; decode {_f(rec.get('decode_cold_tok_s'))} tok/s), "
                 f"warm {rec['ready_s']:.1f} s (graph from the cache)")
    parts = [ready, f"decode {_f(rec.get('decode_tok_s'))} tok/s"]
    if rec.get("aggregate_decode_tok_s") is not None:
        parts.append(f"{(rec.get('concurrent_decode') or {}).get('streams')} streams {_f(rec['aggregate_decode_tok_s'])} tok/s")
    parts.append(f"prefill {_f(rec.get('prefill_tok_s'))} tok/s")
    if rec.get("decode_long_tok_s") is not None:
        parts.append(f"decode after {(rec.get('decode_long') or {}).get('context_tokens')} tokens "
                     f"{_f(rec['decode_long_tok_s'])} tok/s")
    parts += [
             f"PSS {_gb(rec.get('pss_steady_bytes'))} (peak {_gb(rec.get('pss_peak_bytes'))})",
             f"{rec.get('processes')} process(es)"]
    ppl = (rec.get("fidelity") or {}).get("perplexity")
    if ppl is not None:
        parts.append(f"ppl {ppl:.2f}")
    return "ok: " + ", ".join(parts)


def attach_fidelity(records: dict[str, list[dict[str, Any]]], raw: dict[tuple[str, int], Any],
                    reference_arm: str | None) -> dict[str, Any]:
    """Compare every pass's outputs with the reference arm's first valid pass (in place)."""
    info: dict[str, Any] = {"reference_arm": reference_arm, "reference_pass": None,
                            "k": scoring.TOP_K, "method": scoring.METHOD}
    if reference_arm is None:
        info["note"] = "no bf16 reference arm (bf16 or stock) ran: agreement and KL are not computed"
        return info
    ref = next(((i, raw[(reference_arm, i)]) for i, r in enumerate(records.get(reference_arm, []))
                if r["status"] == OK and (reference_arm, i) in raw), None)
    if ref is None:
        info["note"] = f"the reference arm {reference_arm} has no valid pass: agreement and KL are not computed"
        return info
    info["reference_pass"] = ref[0] + 1
    for name, recs in records.items():
        for i, rec in enumerate(recs):
            if rec["status"] == OK and (name, i) in raw:
                rec["fidelity"].update(scoring.compare(ref[1], raw[(name, i)]))
                rec["fidelity"]["reference"] = f"{reference_arm} pass {ref[0] + 1}"
    return info


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def _f(v: float | None) -> str:
    return "?" if v is None else f"{v:.1f}"


def _gb(v: int | None) -> str:
    return "?" if v is None else f"{v / 1e9:.2f} GB"
