"""The kernel library's build (runtime/edgectl_runtime/kernels/ops/build.py, run by scripts/setup.sh):
without the system g++ it stops with one error line and exit code 2, and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BUILD = Path(__file__).resolve().parents[1] / "runtime" / "edgectl_runtime" / "kernels" / "ops" / "build.py"


def test_a_missing_compiler_is_one_error_line_and_nothing_written(tmp_path: Path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, str(BUILD), "--out", str(out), "--force"],
                          env={"PATH": str(empty_bin), "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: g++ is not installed"), done.stderr
    assert "apt-get install g++" in lines[0]
    assert list(out.iterdir()) == []
