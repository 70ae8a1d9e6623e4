"""The GGUF the bench's llama.cpp arms read (edgectl/bench/core.py ``_gguf_for``): a catalog model's kept
file, or the file a directory pulled from a user's GGUF serves as it is — so that a user's own GGUF is
measured against llama.cpp on the very same weights."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.bench.core import _gguf_for
from edgectl.models.cache import LAYOUT, MANIFEST_NAME, MANIFEST_SCHEMA, gguf_path
from edgectl.models.catalog import CATALOG


def _pulled(root: Path, layout: str | None) -> Path:
    d = root / "mine"
    d.mkdir()
    (d / "model.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    manifest = {"schema": MANIFEST_SCHEMA, "name": "mine", "files": {"model.gguf": {"sha256": "0" * 64, "bytes": 8}}}
    if layout is not None:
        manifest["layout"] = layout
    (d / MANIFEST_NAME).write_text(json.dumps(manifest))
    return d


def test_a_directory_pulled_from_a_gguf_gives_llama_cpp_its_file(tmp_path: Path):
    d = _pulled(tmp_path, LAYOUT)
    assert _gguf_for(str(d), {}) == d.resolve() / "model.gguf"


def test_a_directory_served_otherwise_or_without_a_manifest_has_none(tmp_path: Path):
    d = _pulled(tmp_path, "hf")
    assert _gguf_for(str(d), {}) is None
    (d / MANIFEST_NAME).unlink()
    assert _gguf_for(str(d), {}) is None


def test_a_catalog_model_reads_its_kept_file(tmp_path: Path):
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path)}
    assert _gguf_for("smollm2-135m", env) == gguf_path(CATALOG["smollm2-135m"], env)
