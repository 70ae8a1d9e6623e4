"""One answer to "does edgectl run from a checkout?" (edgectl/paths.py), used wherever a checkout
must run its own runtime and read its own profiles rather than an installed copy's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from models_helpers import REPO

from edgectl import paths

CODE = ("import edgectl.paths as p; print(p.checkout()); print(p.runtime_dir()); "
        "print(p.profiles_dir()); print(p.units_dir())")


def _run(pythonpath: Path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"}, cwd="/")
    return done.stdout.splitlines()


def test_a_checkout_is_recognised_and_uses_its_own_files():
    if paths.checkout() is None:
        # this run imports an installed edgectl (scripts/test.sh): check the checkout in a child
        assert _run(REPO) == [str(REPO), str(REPO / "runtime"), str(REPO / "profiles"), str(REPO / "units")]
    else:
        assert paths.checkout() == REPO and paths.runtime_dir() == REPO / "runtime"
        assert paths.profiles_dir() == REPO / "profiles" and paths.units_dir() == REPO / "units"


def test_an_installed_copy_is_not_a_checkout(tmp_path: Path):
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "edgectl", site / "edgectl")  # the package alone, as pip installs it
    shutil.copytree(REPO / "profiles", site / "edgectl" / "_profiles")
    shutil.copytree(REPO / "units", site / "edgectl" / "_units")
    assert _run(site) == ["None", "None", str(site / "edgectl" / "_profiles"), str(site / "edgectl" / "_units")]
