"""Every environment variable edgectl reads, declared once.

Nothing reads ``os.environ`` directly: callers pass a mapping (normally ``os.environ``)
to :func:`read`, so tests hand in their own dict and nothing is mutated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvVar:
    name: str
    meaning: str
    default: str | None


def _default_model_cache() -> str:
    if os.geteuid() == 0:
        return "/var/lib/edgectl/models"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "edgectl" / "models")


REGISTRY: dict[str, EnvVar] = {
    v.name: v
    for v in [
        EnvVar("EDGECTL_UNIT_DIR", "directory the systemd units are written to "
               "(tests inside a systemd sandbox use /run/systemd/system)", "/etc/systemd/system"),
        EnvVar("EDGECTL_CONFIG_DIR", "directory holding one sub-directory of configuration per deployment",
               "/etc/edgectl"),
        EnvVar("EDGECTL_MODEL_CACHE", "where catalog models are converted to and kept "
               "(default /var/lib/edgectl/models as root, else the user cache directory)", None),
        EnvVar("EDGECTL_PROFILES_DIR", "locally recorded device profiles, read after the shipped ones "
               "and preferred over them", "/etc/edgectl/profiles"),
        EnvVar("EDGECTL_RUNTIME_PYTHON", "the Python interpreter that has the runtime extra (torch, vLLM) "
               "installed; units and conversions run it (default: the interpreter running edgectl)", None),
    ]
}


def runtime_python(environ: Mapping[str, str]) -> str:
    """The runtime interpreter (EDGECTL_RUNTIME_PYTHON), resolved to an executable's path."""
    import shutil

    from edgectl.errors import EdgectlError

    python = read("EDGECTL_RUNTIME_PYTHON", environ)
    found = shutil.which(python)
    if found is None:
        raise EdgectlError(
            f"the runtime interpreter {python!r} (EDGECTL_RUNTIME_PYTHON) is not an executable: point "
            "EDGECTL_RUNTIME_PYTHON at the python of the environment with edgectl[runtime] installed "
            "(scripts/setup.sh makes /opt/edgectl/venv/bin/python)"
        )
    return found


def read(name: str, environ: Mapping[str, str]) -> str:
    """The value of a registered variable in ``environ``, or its default."""
    var = REGISTRY[name]  # KeyError here is a programming error: register the variable first
    value = environ.get(name)
    if value:
        return value
    if var.default is not None:
        return var.default
    if name == "EDGECTL_MODEL_CACHE":
        return _default_model_cache()
    if name == "EDGECTL_RUNTIME_PYTHON":
        import sys

        return sys.executable
    raise KeyError(name)
