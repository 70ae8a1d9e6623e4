"""Where the bench looks for committed artifacts (a profile's source runs, for the memory check's
calibration, repeat or held-out label): the checkout it runs from, or the checkout an installed copy
was built from (scripts/setup.sh's build.json), else the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgectl.bench import core
from edgectl.bench import provenance as prov


def test_the_bench_finds_this_repositorys_results():
    # edgectl imported from this checkout, or from the copy scripts/setup.sh installed from it (the README's
    # test command runs the installed copy): either way the artifacts committed here
    assert core._repo_root().resolve() == Path(__file__).resolve().parents[1]


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

