"""The steps every planning command shares: probe, find the model, load profiles, plan.

``plan``, ``deploy``, ``serve`` and ``bench`` all go through :func:`make_plan`, so the
same request gives the same plan whichever command made it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl import envvars, paths
from edgectl.errors import EdgectlError
from edgectl.plan import Plan, Request, plan
from edgectl.profiles import Profile, load_profiles


@dataclass(frozen=True)
class Planned:
    facts: Any  # HostFacts
    model: Any  # ModelFacts
    plan: Plan
    pulled: bool  # False: planned from the catalog's shipped config, before any download

    def to_dict(self) -> dict[str, Any]:
        return self.plan.to_dict()

    def render_text(self) -> str:
        text = self.plan.render_text()
        if not self.pulled:
            text += (f"\n  (planned from the catalog's configuration; `edgectl models pull {self.model.name}` "
                     "downloads the weights, and deploy pulls them itself)")
        return text


def profile_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Shipped profiles first; locally recorded ones (``bench --record-profile``) override them."""
    return [paths.profiles_dir(), Path(envvars.read("EDGECTL_PROFILES_DIR", environ))]


def load_all_profiles(environ: Mapping[str, str]) -> list[Profile]:
    return load_profiles(profile_dirs(environ))


def model_facts(spec: str, environ: Mapping[str, str]) -> tuple[Any, bool]:
    """Facts about a catalog model or a model directory; (facts, pulled)."""
    from edgectl.models.cache import model_dir, resolve_model
    from edgectl.models.catalog import CATALOG
    from edgectl.models.inspect import inspect_model

    try:
        path = resolve_model(spec, environ)
    except EdgectlError:
        entry = CATALOG.get(spec)
        shipped = paths.data_dir() / "catalog" / spec
        if entry is None or not (shipped / "config.json").is_file():
            raise
        # Not pulled yet: plan from the shipped configuration; the path is where it will be.
        facts = inspect_model(shipped, name=spec, require_tokenizer=False)
        from dataclasses import replace

        return replace(facts, path=str(model_dir(entry, environ))), False
    name = spec if spec in CATALOG else None
    return inspect_model(path, name=name), True


def make_plan(request: Request, environ: Mapping[str, str], *, root: str = "/", facts: Any = None) -> Planned:
    from edgectl.probe import probe

    from dataclasses import replace

    from edgectl.models.catalog import CATALOG

    host = facts if facts is not None else probe(root, environ=environ)
    model, pulled = model_facts(request.model, environ)
    entry = CATALOG.get(request.model)
    if entry is not None and entry.int4_group_size and request.group_size_hint is None:
        request = replace(request, group_size_hint=entry.int4_group_size)
    profiles = load_all_profiles(environ)
    return Planned(host, model, plan(host, model, profiles, request), pulled)
