"""On a Kubernetes node: ``edgectl probe --nfd`` (the feature file) and the timer that refreshes it.

The timer is installed like a deployment (edgectl/deploy.py): units rendered by the one unit
writer, written atomically, started, checked; on failure nothing is left behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgectl.atomic import write_text_atomic
from edgectl.contract import environment
from edgectl.errors import EXIT_FAILED, EdgectlError
from edgectl.fleet.labels import (
    EXPIRY,
    NAMESPACE,
    REFRESH_INTERVAL,
    NodeLabels,
    labels_for,
    parse_feature_file,
    render_feature_file,
)
from edgectl.units import NFD_SERVICE, NFD_TIMER, render_nfd_units

Progress = Callable[[str], None]


@dataclass(frozen=True)
class FeatureFile:
    text: str
    labels: NodeLabels
    path: str | None  # where it was written; None: printed

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "labels": self.labels.full(), "text": self.text}

    def render_text(self) -> str:
        if self.path is None:
            return self.text
        selector = self.labels.selector()
        cls = self.labels.class_id() if selector else f"none ({self.labels.why_no_class()})"
        return f"wrote {self.path}: {len(self.labels.values)} labels, node class {cls}"


def feature_file(root: str | Path, *, bandwidth: bool, environ: Mapping[str, str], out: Path | None,
                 now: datetime | None = None) -> FeatureFile:
    """Probe, label, and print or write (atomically) the feature file."""
    from edgectl.inputs import load_all_profiles
    from edgectl.probe import probe

    if out is not None:
        if out.name.startswith(".") or out.is_dir():
            raise EdgectlError(f"--out {out}: name a file that does not start with a dot (NFD ignores those), "
                               "e.g. /etc/kubernetes/node-feature-discovery/features.d/edgectl")
        if not out.parent.is_dir():
            raise EdgectlError(f"--out {out}: {out.parent} does not exist (NFD reads "
                               "/etc/kubernetes/node-feature-discovery/features.d/; create it first)")
    facts = probe(root, bandwidth=bandwidth, environ=environ)
    labels = labels_for(facts, load_all_profiles(environ))
    text = render_feature_file(labels, now or datetime.now(timezone.utc))
    if out is not None:
        write_text_atomic(out, text, mode=0o644)
    return FeatureFile(text, labels, None if out is None else str(out))


@dataclass(frozen=True)
class TimerResult:
    action: str  # "installed" | "removed"
    units: list[str]
    out: str
    labels: NodeLabels | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "units": self.units, "out": self.out,
                "labels": self.labels.full() if self.labels else None}

    def render_text(self) -> str:
        if self.action == "removed":
            return (f"edgectl-nfd.timer removed ({', '.join(self.units)}) and {self.out} deleted: "
                    "NFD drops the labels at its next pass")
        hours = int(REFRESH_INTERVAL.total_seconds() // 3600)
        expiry = int(EXPIRY.total_seconds() // 3600)
        cls = self.labels.class_id() if self.labels and self.labels.selector() else "none"
        return (f"edgectl-nfd.timer installed: {self.out} is rewritten every {hours} h (its labels expire "
                f"after {expiry} h); node class {cls}")


def _layout(environ: Mapping[str, str]):
    from edgectl.systemd import Systemd, systemd_running

    if os.geteuid() != 0:
        raise EdgectlError("the label timer is a systemd unit that writes to NFD's directory: run it as root")
    if not systemd_running():
        raise EdgectlError("systemd is not running on this machine: write the labels with "
                           "`edgectl probe --nfd --out FILE` from your own scheduler instead")
    unit_dir = Path(environment.read("EDGECTL_UNIT_DIR", environ))
    return unit_dir, Systemd(unit_dir)


def install_timer(environ: Mapping[str, str], out: Path, progress: Progress = lambda _: None) -> TimerResult:
    """Write edgectl-nfd.service/.timer, run the service once, then start the timer."""
    python = environment.read("EDGECTL_RUNTIME_PYTHON", environ)
    # checks the paths before anything is written
    units = render_nfd_units(python=python, out=str(out), refresh_interval=REFRESH_INTERVAL, expiry=EXPIRY)
    unit_dir, sd = _layout(environ)
    out.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, text in units.items():
        write_text_atomic(unit_dir / name, text)
    sd.daemon_reload()
    progress(f"running {NFD_SERVICE} once")
    run = sd.systemctl("start", NFD_SERVICE, check=False, timeout=300)
    if run.returncode != 0:
        tail = sd.journal(NFD_SERVICE, 15)
        _remove(unit_dir, sd, list(units))
        raise EdgectlError(f"{NFD_SERVICE} did not write {out}; nothing was installed", exit_code=EXIT_FAILED,
                           details=["--- journal (last lines) ---", *tail])
    sd.enable(NFD_TIMER)
    sd.systemctl("start", NFD_TIMER)
    labels, _ = parse_feature_file(out.read_text(), str(out))
    values = {k.split("/", 1)[1]: v for k, v in labels.items() if k.startswith(NAMESPACE + "/")}
    return TimerResult("installed", list(units), str(out), NodeLabels(values))


def remove_timer(environ: Mapping[str, str], out: Path) -> TimerResult:
    unit_dir, sd = _layout(environ)
    units = [NFD_TIMER, NFD_SERVICE]
    if not any((unit_dir / u).exists() for u in units):
        raise EdgectlError(f"no edgectl-nfd.timer in {unit_dir}: nothing to remove")
    _remove(unit_dir, sd, units)
    out.unlink(missing_ok=True)
    return TimerResult("removed", units, str(out))


def _remove(unit_dir: Path, sd: Any, units: list[str]) -> None:
    for name in units:
        sd.systemctl("stop", name, check=False)
        if name.endswith(".timer"):
            sd.disable(name)
        (unit_dir / name).unlink(missing_ok=True)
    sd.daemon_reload()
    for name in units:
        sd.reset_failed(name)
