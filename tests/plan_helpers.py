"""Helpers for the planner and profile tests: the fixture hosts' facts, the model shapes' facts,
the frozen and the shipped profiles, profiles written for one test, and the CLI run as a user runs it.

The hand-computed planner tests plan with the FROZEN profiles (tests/profiles_frozen/: copies of
what shipped when the tables were worked out), so adding or re-recording a shipped profile does not
move them. The shipped ones (profiles/) are what `edgectl plan` uses; tests of them ask for
``shipped_profiles()`` explicitly.

Nothing here computes an expected value: the tests do that by hand, in their comments.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from models_helpers import SHAPES
from probe_helpers import HOSTS, REPO, run_cli

from edgectl.contract.plan import Plan, Request
from edgectl.models.facts import ModelFacts
from edgectl.models.inspect import inspect_model
from edgectl.planner import plan
from edgectl.probe import HostFacts, probe
from edgectl.profiles import Profile, load_profile, load_profiles

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
SHIPPED_PROFILES = REPO / "profiles"
FROZEN_PROFILES = Path(__file__).resolve().parent / "profiles_frozen"

# The model shapes the tables use (tests/model_shapes/<dir>).
SMOLLM2 = "smollm2-135m"
QWEN25_05B = "qwen2.5-0.5b-instruct"
QWEN3_17B = "qwen3-1.7b"
LLAMA31_8B = "llama-3.1-8b-instruct"
MISTRAL_7B = "mistral-7b-v0.1"
QWEN3_8B = "qwen3-8b"
SHAPE_NAMES = (SMOLLM2, QWEN25_05B, QWEN3_17B, LLAMA31_8B, MISTRAL_7B, QWEN3_8B)


@lru_cache(maxsize=None)
def host_facts(name: str) -> HostFacts:
    """The probe of a fixture tree (tests/fixtures/hosts/NAME), as `edgectl probe --root` gives it."""
    return probe(HOSTS / name, environ={})


@lru_cache(maxsize=None)
def shape(name: str) -> ModelFacts:
    """The facts of a config-only model shape (tests/model_shapes/NAME)."""
    return inspect_model(SHAPES / name)


@lru_cache(maxsize=None)
def shipped_profiles() -> tuple[Profile, ...]:
    """The profiles edgectl ships (profiles/*.yaml): what `edgectl plan` selects from."""
    return tuple(load_profiles([SHIPPED_PROFILES]))


@lru_cache(maxsize=None)
def frozen_profiles() -> tuple[Profile, ...]:
    """The frozen copies the hand-computed tables rest on (tests/profiles_frozen/*.yaml)."""
    return tuple(load_profiles([FROZEN_PROFILES]))


def make_plan(facts: HostFacts, model: ModelFacts, profiles: tuple[Profile, ...] | list[Profile] | None = None,
              *, spec: str | None = None, **request: Any) -> Plan:
    """plan() with the FROZEN profiles unless others are given (``shipped_profiles()`` for what
    the CLI would use); ``request`` are Request fields or BenchLevers fields, ``spec`` what the user typed for the model
    (default: its name)."""
    req = Request.from_flat(model=spec or model.name, **request)
    return plan(facts, model, list(frozen_profiles() if profiles is None else profiles), req)


def write_profile(directory: Path, text: str, name: str = "test.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def profile_from_yaml(directory: Path, text: str, name: str = "test.yaml") -> Profile:
    return load_profile(write_profile(directory, text, name))


# A source block for profiles written in tests: measured with edgectl (so it needs passes).
MEASURED_SOURCE = """\
sources:
  bench:
    cpu_model: "Test CPU"
    cores: 2
    ram_bytes: 25769803776
    date: "2026-12-01"
    command: "edgectl bench --record-profile"
    vllm: "0.32.0"
    torch: "2.13.0+cpu"
    edgectl_commit: "0165d14"
"""


def profile_yaml(*, name: str = "test-avx512", device_class: str = "x86_64-avx512",
                      match: str = "  arch: x86_64\n  isa_all: [avx512f]\n", formats: str = "",
                      extra: str = "") -> str:
    """A measured profile (schema edgectl.profile/1) with the given match rules and formats block."""
    return (f"schema: edgectl.profile/1\nname: {name}\ndevice_class: {device_class}\nkind: measured\n"
            f"match:\n{match}{MEASURED_SOURCE}" + (f"formats:\n{formats}" if formats else "") + extra)



def with_topology(facts: HostFacts, **changes: Any) -> HostFacts:
    return replace(facts, topology=replace(facts.topology, **changes))


def with_memory(facts: HostFacts, **changes: Any) -> HostFacts:
    return replace(facts, memory=replace(facts.memory, **changes))


def with_cpu(facts: HostFacts, **changes: Any) -> HostFacts:
    return replace(facts, cpu=replace(facts.cpu, **changes))


def reasons_by_decision(p: Plan | Mapping[str, Any]) -> dict[str, list[Any]]:
    """decision → the reasons given for it (a plan object or its JSON)."""
    out: dict[str, list[Any]] = {}
    items = p["reasons"] if isinstance(p, Mapping) else [r.to_dict() for r in p.reasons]
    for r in items:
        out.setdefault(r["decision"], []).append(r)
    return out


def ceil_mib(n: float) -> int:
    """Bytes rounded up to whole MiB (how the planner states MemoryHigh and MemoryMax)."""
    return math.ceil(n / MIB) * MIB


def write_facts(facts: HostFacts, directory: Path, name: str = "facts.json") -> Path:
    """A probe taken elsewhere, as `edgectl probe --json > facts.json` writes it."""
    path = directory / name
    path.write_text(json.dumps(facts.to_dict()))
    return path


def plan_cli(args: list[str], tmp_path: Path, env: Mapping[str, str] | None = None):
    """`edgectl plan ARGS` in a subprocess, with no locally recorded profiles and a private model cache
    unless ``env`` says otherwise."""
    base = {"EDGECTL_PROFILES_DIR": str(tmp_path / "no-local-profiles"),
            "EDGECTL_MODEL_CACHE": str(tmp_path / "model-cache")}
    return run_cli(["plan", *args], env={**base, **(env or {})})
