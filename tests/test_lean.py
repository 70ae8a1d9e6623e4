"""Keeping optional packages out of the worker (runtime/edgectl_runtime/vllm_plugin/lean.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from edgectl_runtime.vllm_plugin import lean  # noqa: E402


def test_a_kept_out_package_looks_not_installed(tmp_path):
    """``import`` raises ModuleNotFoundError and ``find_spec`` answers None, as for a package that
    is not installed: the answer vLLM's and transformers' optional-import checks act on."""
    (tmp_path / "cv2.py").write_text("LOADED = True\n")
    code = (
        "import sys, importlib.util\n"
        f"sys.path.insert(0, {str(tmp_path)!r}); sys.path.insert(0, {str(REPO / 'runtime')!r})\n"
        "from edgectl_runtime.vllm_plugin import lean\n"
        "print(lean.skip_optional_imports())\n"
        "print(importlib.util.find_spec('cv2'))\n"
        "try:\n    import cv2\nexcept ModuleNotFoundError:\n    print('absent')\n"
        "print(lean.optional_imports_state()['cv2'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(list(lean.OPTIONAL_IMPORTS)), "None", "absent", "kept out"]


def test_a_package_already_loaded_is_left_alone():
    modules = {"cv2": object()}
    assert "cv2" not in lean.skip_optional_imports(modules)
    assert lean.optional_imports_state(modules)["cv2"] == "loaded"
    assert lean.optional_imports_state({})["accelerate"] == "not imported"
    assert importlib.util.find_spec("json") is not None
