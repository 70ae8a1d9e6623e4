"""Where the tests find the installed edgectl and its runtime (scripts/setup.sh makes them).

The fast tier needs neither, nor root: it runs from a checkout. A test that needs the runtime
(torch and vLLM in the runtime interpreter) is marked ``runtime`` or ``engine``; one that needs the
real model asks for the ``pulled_smollm2`` fixture. Where they are absent it is skipped, saying
why (conftest.py). ``EDGECTL_PREFIX`` (as for scripts/setup.sh) and ``EDGECTL_RUNTIME_PYTHON``
point elsewhere.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

PREFIX = Path(os.environ.get("EDGECTL_PREFIX") or "/opt/edgectl")
EDGECTL = PREFIX / "venv" / "bin" / "edgectl"
RUNTIME_PYTHON = os.environ.get("EDGECTL_RUNTIME_PYTHON") or str(PREFIX / "venv" / "bin" / "python")

_HAS_RUNTIME = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('torch') and u.find_spec('vllm') else 1)"


@functools.cache
def runtime_missing() -> str | None:
    """Why the runtime cannot run here, or None if it can."""
    if not Path(RUNTIME_PYTHON).is_file():
        return f"no runtime interpreter at {RUNTIME_PYTHON} (scripts/setup.sh installs it; or set EDGECTL_RUNTIME_PYTHON)"
    done = subprocess.run([RUNTIME_PYTHON, "-c", _HAS_RUNTIME], capture_output=True, timeout=120)
    if done.returncode != 0:
        return f"{RUNTIME_PYTHON} has no torch and vLLM (edgectl's runtime extra: scripts/setup.sh installs it)"
    return None
