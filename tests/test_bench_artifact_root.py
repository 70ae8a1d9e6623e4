"""Where the bench looks for committed artifacts (a profile's source runs, for the memory check's
calibration, repeat or held-out label): the checkout it runs from, or the checkout an installed copy
was built from (scripts/setup.sh's build.json), else the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgectl.bench import core
from edgectl.bench import provenance as prov


def test_a_checkout_finds_its_own_results():
    repo = Path(core.__file__).resolve().parents[2]
    assert (repo / "results").is_dir()  # the tests run from a checkout
    assert core._repo_root() == repo


def test_an_installed_copy_finds_the_checkout_it_was_built_from(tmp_path, monkeypatch: pytest.MonkeyPatch):
    site, clone = tmp_path / "site-packages", tmp_path / "clone"
    site.mkdir()
    (clone / "results").mkdir(parents=True)
    monkeypatch.setattr(prov, "built_from", lambda: {"checkout": str(clone), "commit": "abc"})
    assert core._repo_root(site) == clone
    # the checkout gone (or never recorded): the working directory, as before
    (clone / "results").rmdir()
    monkeypatch.chdir(tmp_path)
    assert core._repo_root(site) == tmp_path
    monkeypatch.setattr(prov, "built_from", lambda: {})
    assert core._repo_root(site) == tmp_path

