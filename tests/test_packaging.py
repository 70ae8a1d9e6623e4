"""Every package of the checkout is installed: pyproject.toml names each one (setuptools finds none by itself)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_with_an_init_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    dirs = {name: ROOT / path for name, path in config.get("package-dir", {}).items()}
    found = set()
    for top in ("edgectl", "edgectl_runtime"):
        base = dirs.get(top, ROOT / top)
        for init in base.rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(base)
            found.add(".".join((top, *rel.parts)) if rel.parts else top)
    assert found - listed == set(), "add these to pyproject.toml [tool.setuptools] packages"
