"""The plan's memory figure checked as a prediction: predicted steady PSS vs measured, per arm.

The planner's ledger (planner/ledger.py) adds weights, KV, RoPE, workspace and a fixed runtime
cost per process, the last solved by ``--record-profile`` from one bench run (profile_record.py),
so that run's planned configuration is predicted exactly by construction, and another run of the
same configuration tests only how well that run repeats. For each arm with a plan this records
the prediction, the measured median, the error (measured / predicted − 1), which profile figures
the prediction leaned on (``calibration``: their sources' artifact, arm, command, model), and
``check``, what kind of check the error is:

- ``calibration``: this run and configuration are the ones a figure was solved from;
- ``repeat``: another run of the configuration of an arm a figure was solved from (the settings
  in CONFIGURATION all equal);
- ``held_out``: a configuration that differs from every such arm in at least one of them
  (``differs`` lists which, per figure);
- ``unknown``: the profile has no measured figure, or a source's artifact cannot be read, so
  whether the configuration was seen cannot be told (never counted as held out).

``held_out`` (true whenever this run is not the calibration run, repeats included) is kept for
readers of older artifacts; quote ``check``.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from edgectl.bench import stats

# The settings the ledger models a configuration's memory from, as a plan (to_dict) names them
# (with the model's name): two runs equal in all of them are the same configuration.
CONFIGURATION = ("max_model_len", "max_num_seqs", "weight_format", "compilation", "kv_cache_dtype", "topology",
                 "device_class")
# A speech plan's fixed memory is the profile's ``speech`` figures (profiles.SpeechFigures), solved from a
# JSON-lines artifact of scripts/speech_memory.sh: one row per server, labelled LABEL-pPASS, with the plan's
# dtype, weight format and transcriptions at once; the rows a figure was solved from are those whose LABEL
# the source's command names (``… bf16-s1-pN …``; the others are held out in the same rounds). The script
# plans with ``edgectl plan``'s defaults but those it names, so a row's compilation is the planner's: eager.
SPEECH_ROW_CONFIGURATION = ("max_num_seqs", "weight_format", "dtype")
# The head a speech row was served with; rows written before the int8 scan existed served the dense one
# (the ledger models the difference: the scan's int8 copy, and no packed copy of the table).
SPEECH_ROW_HEAD, SPEECH_ROW_HEAD_BEFORE = "speech_head", "dense"
SPEECH_ROW_COMPILATION = "eager"
# What kind of check an error is (the module's docstring).
CALIBRATION, REPEAT, HELD_OUT, UNKNOWN = "calibration", "repeat", "held_out", "unknown"
# Launchers whose plan is what the server holds; vLLM given only the model sizes its own KV.
PREDICTED_LAUNCHERS = ("worker", "vllm")


def configuration(plan: dict[str, Any]) -> dict[str, Any]:
    conf = {"model": (plan.get("model") or {}).get("name"), **{k: plan.get(k) for k in CONFIGURATION}}
    if isinstance(plan.get("speech"), dict):
        conf["dtype"] = plan["speech"].get("dtype")  # a dense speech plan's weight_format is bf16 in any dtype
        conf[SPEECH_ROW_HEAD] = plan["speech"].get("head", SPEECH_ROW_HEAD_BEFORE)
    return conf


def calibration(profile_file: str | None, compiled: bool, speech: bool = False) -> dict[str, Any]:
    """The profile figures a plan's fixed memory came from, and their sources (a speech plan's: the
    profile's ``speech`` figures)."""
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
    if speech:
        figures = {"speech.process_bytes": profile.speech.process_bytes if profile.speech else None}
        if profile.speech and profile.speech.per_transcription_bytes:
            figures["speech.per_transcription_bytes"] = profile.speech.per_transcription_bytes
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


def calibration_configurations(source: dict[str, Any], roots: list[Path]) -> list[dict[str, Any]] | None:
    """The configurations a figure was solved from: an arm of a bench artifact, or the named rows of a
    speech memory artifact (JSON lines); None when the artifact cannot be read."""
    artifact = source.get("artifact")
    if not artifact or not str(artifact).endswith(".jsonl"):
        one = calibration_configuration(artifact, source.get("arm"), roots)
        return None if one is None else [one]
    labels = set(re.findall(r"(\S+)-pN", source.get("command") or ""))
    for root in roots:
        path = Path(artifact) if Path(artifact).is_absolute() else root / artifact
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            continue
        fitted = [r for r in rows if isinstance(r, dict) and re.sub(r"-p\d+$", "", str(r.get("label"))) in labels]
        confs = [{"model": source.get("model"), "compilation": SPEECH_ROW_COMPILATION,
                  **{k: r.get(k) for k in SPEECH_ROW_CONFIGURATION},
                  SPEECH_ROW_HEAD: r.get(SPEECH_ROW_HEAD, SPEECH_ROW_HEAD_BEFORE)} for r in fitted]
        return [dict(t) for t in {tuple(sorted(c.items())) for c in confs}] or None
    return None


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
        "steady PSS of the server's whole process tree; error = measured / predicted − 1. check: calibration (the "
        "run and configuration a memory figure was solved from), repeat (another run of a configuration one was "
        "solved from), held_out (a configuration that differs from those in a setting listed in differs), unknown "
        "(no measured figure, or its artifact could not be read). held_out: the run is not one the figures were "
        "solved from (repeats included; kept for older readers)"), "arms": {}}
    this = artifact_path.resolve()
    for name, arm in arms.items():
        plan = arm.get("plan")
        if arm.get("launcher") not in PREDICTED_LAUNCHERS or not isinstance(plan, dict):
            continue
        predicted = int((plan.get("memory") or {}).get("total_bytes") or 0) or None
        measured = (arm.get("median") or {}).get("pss_steady_bytes")
        cal = calibration((plan.get("profile") or {}).get("file"), plan.get("compilation") != "eager",
                          speech=isinstance(plan.get("speech"), dict))
        conf = configuration(plan)
        kind, differs = check(conf, cal["sources"], this, roots)
        entry: dict[str, Any] = {
            "predicted_bytes": predicted, "measured_bytes": measured,
            "error": stats.ratio(measured, predicted) - 1 if measured and predicted else None,
            "configuration": conf, "calibration": cal, "check": kind,
            # the field before ``check``: not the run a figure was solved from (whatever its configuration);
            # None: no measured figure to have been fitted to (published figures, or an unreadable profile)
            "held_out": not _is_source(cal["sources"], this, roots) if _measured(cal["sources"]) else None,
        }
        if differs:
            entry["differs"] = differs
        out["arms"][name] = entry
    return out


def check(conf: dict[str, Any], sources: list[dict[str, Any]], this: Path,
          roots: list[Path]) -> tuple[str, dict[str, dict[str, Any]]]:
    """What kind of check predicting ``conf`` (an arm of the run at ``this``) from figures solved
    from ``sources`` is, and, per figure whose artifact can be read, the settings in which ``conf``
    differs from the arm it was solved from. Another arm of the calibration run, in a configuration
    no figure was solved from, is held out like any other run's."""
    measured = _measured(sources)
    differs: dict[str, dict[str, Any]] = {}
    same_configuration_here = False
    for s in measured:
        others = calibration_configurations(s, roots)
        if not others:
            continue
        # the settings each configuration solved from records (a speech row: fewer than a bench arm's)
        each = [{k: {"calibration": o.get(k), "here": conf.get(k)} for k in o if o.get(k) != conf.get(k)}
                for o in others]
        differs[s["figure"]] = min(each, key=len)  # the nearest configuration
        if not differs[s["figure"]] and _same_file(s["artifact"], this, roots):
            same_configuration_here = True
    if same_configuration_here:
        return CALIBRATION, {}
    if any(not d for d in differs.values()):
        return REPEAT, differs  # equal to an arm a figure was solved from in every setting
    if measured and len(differs) == len(measured):
        return HELD_OUT, differs
    return UNKNOWN, differs


def check_label(entry: dict[str, Any]) -> str:
    """How an entry's error reads in a report: its check, and for a held-out one what differs."""
    kind = entry.get("check")
    if kind is None:  # written before ``check``: only whether this was the calibration run is known
        return {True: "not the calibration run; repeat or held out not recorded", False: "calibration run",
                None: "calibration unknown"}[entry.get("held_out")]
    if kind == HELD_OUT:
        settings = sorted({k for per_figure in (entry.get("differs") or {}).values() for k in per_figure})
        return f"held out, differs in {', '.join(settings)}"
    return {CALIBRATION: "calibration run", REPEAT: "repeat of the calibration's configuration",
            UNKNOWN: "calibration unknown"}[kind]


def _is_source(sources: list[dict[str, Any]], this: Path, roots: list[Path]) -> bool:
    """Was a figure solved from the run at ``this``?"""
    return any(s.get("artifact") and _same_file(s["artifact"], this, roots) for s in _measured(sources))


def _measured(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sources of figures measured by a run (not published or default figures)."""
    return [s for s in sources if s.get("source")]


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
                  + f" ({check_label(e)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
