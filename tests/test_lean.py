"""Keeping optional packages out of the worker (runtime/edgectl_runtime/lean.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from edgectl_runtime import lean  # noqa: E402


def test_a_kept_out_package_looks_not_installed(tmp_path):
    """``import`` raises ModuleNotFoundError and ``find_spec`` answers None, as for a package that
    is not installed: the answer vLLM's and transformers' optional-import checks act on."""
    (tmp_path / "cv2.py").write_text("LOADED = True\n")
    code = (
        "import sys, importlib.util\n"
        f"sys.path.insert(0, {str(tmp_path)!r}); sys.path.insert(0, {str(REPO / 'runtime')!r})\n"
        "from edgectl_runtime import lean\n"
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


def test_the_worker_is_restarted_only_when_an_allocator_or_optimize_level_is_not_in_effect():
    # this test process runs on glibc with optimize 0 (pytest itself is started that way)
    assert lean.startup_environment("glibc", sys.flags.optimize, {}) is None
    env = lean.startup_environment("jemalloc", sys.flags.optimize, {"LD_PRELOAD": "/opt/x/libgomp.so.1", "A": "1"})
    assert env["LD_PRELOAD"] == f"{lean.ALLOCATORS['jemalloc']}:/opt/x/libgomp.so.1" and env["A"] == "1"
    # switching back to glibc drops a replacement allocator from LD_PRELOAD, keeps the rest
    other = lean.startup_environment("glibc", sys.flags.optimize + 1,
                                     {"LD_PRELOAD": f"{lean.ALLOCATORS['tcmalloc']}:/opt/x/libgomp.so.1"})
    assert other["LD_PRELOAD"] == "/opt/x/libgomp.so.1"
    assert other["PYTHONOPTIMIZE"] == str(sys.flags.optimize + 1)


def test_the_allocator_is_read_back_from_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f10 r-xp 00000000 fe:00 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert lean.allocator_in_effect("glibc", str(maps)) and not lean.allocator_in_effect("jemalloc", str(maps))
    maps.write_text(maps.read_text() + "7f20-7f30 r-xp 00000000 fe:00 2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert lean.allocator_in_effect("jemalloc", str(maps)) and not lean.allocator_in_effect("glibc", str(maps))
