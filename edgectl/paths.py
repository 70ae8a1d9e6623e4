"""Where edgectl's shipped data lives, and whether edgectl runs from a checkout.

``profiles/`` and ``units/`` sit at the top of the repository; an installed edgectl
carries them as the ``edgectl._profiles`` and ``edgectl._units`` packages.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def checkout() -> Path | None:
    """The repository edgectl runs from, or None for an installed copy.

    A checkout has ``pyproject.toml`` and the runtime's sources beside the package. Code that
    starts the runtime from a checkout uses the checkout's runtime, never an older installed one.
    """
    root = _PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "runtime" / "edgectl_runtime").is_dir():
        return root
    return None


def runtime_dir() -> Path | None:
    """The checkout's runtime sources (``runtime/``), or None for an installed copy."""
    root = checkout()
    return root / "runtime" if root else None


def _shipped_dir(repo_name: str, installed_name: str) -> Path:
    root = checkout()
    if root is not None and (root / repo_name).is_dir():
        return root / repo_name
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
