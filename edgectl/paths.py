"""Where edgectl's shipped data and its state live.

``profiles/`` and ``units/`` sit at the top of the repository; an installed edgectl
carries them as the ``edgectl._profiles`` and ``edgectl._units`` packages.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _shipped_dir(repo_name: str, installed_name: str) -> Path:
    checkout = _PACKAGE_DIR.parent / repo_name
    if checkout.is_dir() and (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return checkout
    # Installed: the directory was packaged as edgectl/<installed_name> (a data-only package).
    return _PACKAGE_DIR / installed_name


def profiles_dir() -> Path:
    """The shipped device profiles (YAML)."""
    return _shipped_dir("profiles", "_profiles")


def units_dir() -> Path:
    """The shipped systemd unit templates."""
    return _shipped_dir("units", "_units")


def data_dir() -> Path:
    """Small data files shipped with the package (prompt sets, catalog)."""
    return _PACKAGE_DIR / "data"
