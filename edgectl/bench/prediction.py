"""The plan's memory figure checked as a prediction: predicted steady PSS vs measured, per arm.

The planner's ledger (planner/ledger.py) adds weights, KV, RoPE, workspace and a fixed runtime
cost per process, the last solved by ``--record-profile`` from one bench run (profile_record.py),
so that run's planned configuration is predicted exactly by construction. Every other run is
data the calibration did not see. For each arm with a plan this records the prediction, the
measured median, the error (measured / predicted − 1), which profile figures the prediction
leaned on (``calibration``: their sources' artifact, command, model), and whether this run is
one of them (``held_out`` is False only for the run the figures were solved from, None when the
profile has no measured figure for it). Where the
calibration's artifact can be read, the settings in which this configuration differs from it
are listed (``differs``: model, context, sequences, format, compilation, KV dtype, topology).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from edgectl.bench import stats

# The settings that shape a configuration's memory, as a plan (to_dict) names them.
CONFIGURATION = ("max_model_len", "max_num_seqs", "weight_format", "compilation", "kv_cache_dtype", "topology")
# Launchers whose plan is what the server holds; vLLM given only the model sizes its own KV.
PREDICTED_LAUNCHERS = ("worker", "vllm")


def configuration(plan: dict[str, Any]) -> dict[str, Any]:
    return {"model": (plan.get("model") or {}).get("name"), **{k: plan.get(k) for k in CONFIGURATION}}


def calibration(profile_file: str | None, compiled: bool) -> dict[str, Any]:
    """The profile figures a plan's fixed memory came from, and their sources."""
    if not profile_file:
        return {"profile": None, "sources": []}
    from edgectl.errors import EdgectlError
    from edgectl.profiles import load_profile

    try:
        profile = load_profile(Path(profile_file))
    except (EdgectlError, OSError) as exc:
        return {"profile": profile_file, "sources": [], "note": f"the profile could not be read: {exc}"}
    figures = {"runtime.process_bytes": profile.process_bytes}
    if compiled and profile.compiled is not None:
        figures["compiled.extra_bytes"] = profile.compiled.extra_bytes
    sources = []
    for name, fig in figures.items():
        if fig is None:
            sources.append({"figure": name, "source": None, "note": "not in the profile (published or default figures)"})
            continue
        s = fig.source
        arm = re.match(r"arm `([^`]+)`", s.notes or "")  # profile_record.py names the arm a source measured
        sources.append({"figure": name, "source": s.key, "artifact": s.artifact, "arm": arm.group(1) if arm else None,
                        "command": s.command, "model": s.model, "edgectl_commit": s.edgectl_commit})
    return {"profile": profile_file, "kind": str(profile.kind), "sources": sources}


def calibration_configuration(artifact: str | None, arm: str | None, roots: list[Path]) -> dict[str, Any] | None:
    """The configuration of an arm (default ``planned``) of a calibration artifact found under ``roots``."""
    if not artifact:
        return None
    for root in roots:
        path = Path(artifact) if Path(artifact).is_absolute() else root / artifact
        data = _read_artifact(str(path.resolve()))
        if data is None:
            continue
        plan = ((data.get("arms") or {}).get(arm or "planned") or {}).get("plan")
        if isinstance(plan, dict):
            return configuration(plan)
    return None


def memory_prediction(arms: dict[str, dict[str, Any]], artifact_path: Path, roots: list[Path]) -> dict[str, Any]:
    """``arms``: the artifact's arms, summarised (launcher, plan, median)."""
    out: dict[str, Any] = {"method": (
        "predicted: the plan's steady memory (plan.memory.total_bytes, planner/ledger.py); measured: the median "
        "steady PSS of the server's whole process tree; error = measured / predicted − 1. held_out: the run is not "
        "one the profile's memory figures were solved from"), "arms": {}}
    this = artifact_path.resolve()
    for name, arm in arms.items():
        plan = arm.get("plan")
        if arm.get("launcher") not in PREDICTED_LAUNCHERS or not isinstance(plan, dict):
            continue
        predicted = int((plan.get("memory") or {}).get("total_bytes") or 0) or None
        measured = (arm.get("median") or {}).get("pss_steady_bytes")
        cal = calibration((plan.get("profile") or {}).get("file"), plan.get("compilation") != "eager")
        seen = [s for s in cal["sources"] if s.get("artifact") and _same_file(s["artifact"], this, roots)]
        conf = configuration(plan)
        entry: dict[str, Any] = {
            "predicted_bytes": predicted, "measured_bytes": measured,
            "error": stats.ratio(measured, predicted) - 1 if measured and predicted else None,
            "configuration": conf, "calibration": cal,
            # None: no measured figure to have been fitted to (published figures, or an unreadable profile)
            "held_out": (not seen) if any(x.get("source") for x in cal["sources"]) else None,
        }
        differs = {}
        for s in cal["sources"]:
            other = calibration_configuration(s.get("artifact"), s.get("arm"), roots)
            if other is not None:
                differs[s["figure"]] = {k: {"calibration": other[k], "here": conf[k]}
                                        for k in conf if other.get(k) != conf[k]}
        if differs:
            entry["differs"] = differs
        out["arms"][name] = entry
    return out


@lru_cache(maxsize=8)
def _read_artifact(path: str) -> dict[str, Any] | None:
    """A calibration artifact, read once however many arms and figures name it (they are MBs)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _same_file(recorded: str, this: Path, roots: list[Path]) -> bool:
    """Is the artifact a source names (absolute, or relative to a root) this run's?"""
    candidates = [Path(recorded)] if Path(recorded).is_absolute() else [r / recorded for r in roots]
    return any(c.resolve() == this for c in candidates)


def main(argv: list[str] | None = None) -> int:
    """``python -m edgectl.bench.prediction ARTIFACT…``: the check for artifacts written before the
    bench made it, from each plan and the profile file it names (as that file is *now*: valid only
    while the profile has not been re-recorded since the run)."""
    import sys

    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m edgectl.bench.prediction ARTIFACT.json…", file=sys.stderr)
        return 2
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"error: {path}: not a bench artifact ({exc})", file=sys.stderr)
            return 2
        check = memory_prediction(data.get("arms") or {}, path, roots=[Path.cwd(), path.parent.parent])
        for name, e in check["arms"].items():
            if not e["measured_bytes"]:
                continue
            c = e["configuration"]
            print(f"{path.name} {name}: {c['model']} {c['max_model_len']} tok × {c['max_num_seqs']} seq, "
                  f"{c['weight_format']}, {c['compilation']}, {c['topology']}: predicted {e['predicted_bytes'] / 2**20:.0f} "
                  f"MiB, measured {e['measured_bytes'] / 2**20:.0f} MiB, {e['error']:+.1%}"
                  + {True: " (held out)", False: " (calibration run)", None: " (calibration unknown)"}[e["held_out"]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
