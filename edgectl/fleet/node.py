"""On a Kubernetes node: ``edgectl probe --nfd``, the feature file NFD's local source reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgectl.atomic import write_text_atomic
from edgectl.errors import EdgectlError
from edgectl.fleet.labels import NodeLabels, labels_for, render_feature_file

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
    from edgectl.planning import load_all_profiles
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
