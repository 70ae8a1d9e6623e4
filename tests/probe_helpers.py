"""Helpers for the probe tests: the fixture trees, copies to mutate, and the CLI run as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HOSTS = Path(__file__).resolve().parent / "fixtures" / "hosts"
FIXTURE_NAMES = sorted(p.name for p in HOSTS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


def host(name: str) -> Path:
    path = HOSTS / name
    assert path.is_dir(), f"no fixture tree {path}"
    return path


def copy_host(name: str, dest: Path) -> Path:
    """A private copy of a fixture tree, for tests that garble or remove files."""
    target = dest / name
    shutil.copytree(host(name), target)
    return target


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "runtime"), env.get("PYTHONPATH", "")])
    return env


def run_cli(args: list[str], env: Mapping[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgectl", *args], env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout, check=False)


def probe_json(root: Path | str, *extra: str) -> dict[str, Any]:
    proc = run_cli(["probe", "--json", "--root", str(root), *extra])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def unknown_facts(facts_dict: Mapping[str, Any]) -> dict[str, str]:
    return {u["fact"]: u["reason"] for u in facts_dict["unknown"]}
