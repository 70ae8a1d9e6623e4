"""The speech and vision benches' grid: arms × passes, interleaved with the arm order rotated each
pass, and a server arm's pass from launch to stop (what each measures is the bench's own).

Pass states as in the text bench (``bench/runner.py``): ``ok``, ``invalid`` (a setting read back
differs from the arm's, or an answer the measurement cannot use: no number kept), ``crashed``.
A server's pass: started in its own session on a free port with empty compile caches of its own
(``runner.compile_caches``, removed after), measured by the bench's ``measure`` (which stops the
peak PSS sampler at ready), then stopped whatever happened; a pass not ``ok`` keeps its log's
tail and none of the bench's ``measured`` numbers.
"""

from __future__ import annotations

import datetime as _dt
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edgectl.bench import provenance as prov
from edgectl.bench.arms import BenchContext, Crashed, PreparedArm
from edgectl.bench.core import ServerRuntime, _repo_root
from edgectl.bench.measure import MeasurementFailed
from edgectl.bench.prediction import memory_prediction
from edgectl.bench.report import write_json_atomic
from edgectl.bench.runner import (
    CRASHED,
    INVALID,
    OK,
    _launch,
    _loadavg,
    compile_caches,
    utc_now,
)
from edgectl.bench.server import ServerProcess
from edgectl.client import Client, HttpFailed
from edgectl.contract import environment
from edgectl.contract.effective import Effective

if TYPE_CHECKING:
    from edgectl.probe.facts import HostFacts

Progress = Callable[[str], None]
# (client, server, the pass's record) -> None: the bench's measurements of a started server, into the record
Measure = Callable[[Client, ServerProcess, dict[str, Any]], None]


class NamedArm(Protocol):
    name: str


def rotated(names: Sequence[str], passes: int) -> list[tuple[str, int]]:
    """(arm, pass index) in run order: every arm's pass i before any arm's pass i + 1, and pass i
    starting i arms further on (A B C, B C A, C A B, …), so no arm always runs first or after the same one."""
    n = len(names)
    return [(names[(i + k) % n], i) for i in range(passes) for k in range(n)]


def run_rotated(arms: Sequence[NamedArm], passes: int, ctx: BenchContext,
                run_pass: Callable[[Any, int, int, Path], dict[str, Any]], pass_line: Callable[[dict[str, Any]], str],
                progress: Progress, on_pass: Callable[[dict[str, Any]], None] | None = None
                ) -> dict[str, list[dict[str, Any]]]:
    """Every arm's passes in rotated order; ``run_pass(arm, pass index, position, pass directory)``
    runs one and returns its record. The records by arm; ``on_pass`` is given each as it is done."""
    by_name = {a.name: a for a in arms}
    order = rotated([a.name for a in arms], passes)
    records: dict[str, list[dict[str, Any]]] = {a.name: [] for a in arms}
    for position, (name, i) in enumerate(order):
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: starting")
        rec = run_pass(by_name[name], i, position, ctx.logs_dir / f"{position:03d}-{name}-p{i + 1}")
        records[name].append(rec)
        progress(f"[{position + 1:>2}/{len(order)}] {name} pass {i + 1}/{passes}: {pass_line(rec)}")
        if on_pass:
            on_pass(rec)
    return records


def run_writing(artifact: dict[str, Any], path: Path,
                run: Callable[[Callable[[dict[str, Any]], None]], dict[str, list[dict[str, Any]]]]
                ) -> dict[str, list[dict[str, Any]]]:
    """``run(on_pass)``, the artifact written before it and after every pass (and on an interrupt,
    marked so), so an interrupted run keeps what it measured; the records by arm."""
    def save(rec: dict[str, Any]) -> None:
        artifact["arms"][rec["arm"]]["passes"].append(rec)
        write_json_atomic(path, artifact)

    write_json_atomic(path, artifact)
    try:
        return run(save)
    except KeyboardInterrupt:
        artifact["provenance"]["ended_at"] = utc_now()
        artifact["incomplete_reasons"] = ["interrupted"]
        write_json_atomic(path, artifact)
        raise


def provenance(modality: str, ctx: BenchContext, names: list[str], passes: int, facts: HostFacts,
               servers: ServerRuntime, argv: list[str] | None, started: _dt.datetime) -> dict[str, Any]:
    """The provenance the speech and vision artifacts share; each adds what its requests are."""
    return {
        "model": ctx.model_name, "model_path": ctx.model_path, "modality": modality, "passes": passes,
        "arms": names, "order": [f"{n}#{i + 1}" for n, i in rotated(names, passes)],
        "host": socket.gethostname(), "device_class": facts.device_class, "probe": facts.to_dict(),
        "edgectl": prov.edgectl_version(), "vllm": servers.info.get("vllm"), "torch": servers.info.get("torch"),
        "runtime_isa": servers.info.get("isa"), "runtime_python": servers.python, "command": prov.command_line(argv),
        "started_at": started.isoformat(timespec="seconds"), "ended_at": None,
        "environment": {"dropped_from_servers": servers.dropped, "added_for_servers": dict(environment.OFFLINE),
                        "stock_VLLM_PLUGINS": servers.stock_plugins,
                        "stock_plugins_excluded": servers.excluded_plugins},
    }


def conclude(artifact: dict[str, Any], path: Path, out_dir: Path) -> None:
    """After the grid and the summary: the plan's memory checked (per arm whose passes were all ok:
    an arm's median is None otherwise), the end time; the artifact written."""
    artifact["memory_prediction"] = memory_prediction(
        artifact["arms"], path, roots=[out_dir.absolute(), Path.cwd(), _repo_root()])
    artifact["provenance"]["ended_at"] = utc_now()
    write_json_atomic(path, artifact)


def new_record(name: str, pass_index: int, order: int) -> dict[str, Any]:
    return {"arm": name, "pass": pass_index, "order": order, "status": None, "problems": [], "error": None,
            "started_at": utc_now(), "loadavg_start": _loadavg()}


def server_pass(arm: PreparedArm, rec: dict[str, Any], pass_dir: Path, measure: Measure,
                measured: Sequence[str]) -> dict[str, Any]:
    """One fresh server of ``arm`` measured by ``measure``; ``rec`` completed with the outcome."""
    caches = compile_caches(pass_dir)
    server = _launch(arm, pass_dir, caches, rec)
    if server is None:
        return rec
    try:
        measure(Client("127.0.0.1", rec["port"]), server, rec)
        rec["status"] = OK
    except Crashed as exc:
        rec.update(status=INVALID if exc.invalid else CRASHED, error=str(exc))
        if exc.invalid:
            rec["problems"] = [str(exc)]
    except MeasurementFailed as exc:
        rec.update(status=INVALID, error=str(exc), problems=[str(exc)])
    except HttpFailed as exc:
        state = "the server had exited" if not server.alive() else "the server still ran"
        rec.update(status=CRASHED, error=f"{exc} ({state})")
    finally:
        if "pss_peak_bytes" not in rec:  # the pass ended before ready: the sampler still runs
            rec["pss_peak_bytes"] = server.stop_sampling() or None
        rec["exit_code"] = server.stop()
        rec["ended_at"] = utc_now()
        rec["loadavg_end"] = _loadavg()
        shutil.rmtree(Path(caches["VLLM_CACHE_ROOT"]).parent, ignore_errors=True)
        if rec["status"] != OK:
            rec["log_tail"] = server.log_tail(12)
            drop_measured(rec, measured)
    return rec


def ready_and_checked(arm: PreparedArm, client: Client, server: ServerProcess, rec: dict[str, Any]) -> Effective:
    """At the server's first answer: its time to ready, its peak PSS until then (the sampler stopped)
    and its PSS now, its settings read back and checked (a difference makes the pass invalid)."""
    rec["ready_s"] = server.elapsed_s()
    rec["pss_peak_bytes"] = server.stop_sampling()
    rec["pss_peak_samples"] = server.samples
    ready_mem = server.memory()
    rec["pss_ready_bytes"] = ready_mem.pss_bytes
    rec["effective"] = arm.readback(client, server)
    effective, problems = Effective.read(rec["effective"])
    if effective is not None:
        problems = arm.check(effective, len(ready_mem.processes))
    if problems or effective is None:
        raise Crashed("; ".join(problems) or "the read-back could not be read", invalid=True)
    return effective


def drop_measured(rec: dict[str, Any], measured: Sequence[str]) -> None:
    """A pass that did not complete as specified keeps no measured number: nothing to quote."""
    for key in measured:
        rec.pop(key, None)


def failed_line(rec: dict[str, Any]) -> str | None:
    """A pass line's text for a pass not ``ok`` (None for an ok one)."""
    if rec["status"] == OK:
        return None
    why = "; ".join(rec.get("problems") or []) or rec.get("error") or ""
    return f"{rec['status'].upper()}: {why}"
