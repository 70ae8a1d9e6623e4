"""scripts/llama_cpp.sh, the test command's llama.cpp build: a build stamped with the pinned source
archive's sha256, on a CPU with the extensions it was built for, is reused; any other is rebuilt.

Run with a stand-in venv (its python is this interpreter) and a model cache under tmp_path; the
rebuild is stopped at its first step by a PATH without cmake, so nothing is downloaded or built.
The real build runs in the test command (scripts/test.sh) and is what tests/test_pull_agreement.py
and tests/test_bench_llama.py find.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "llama_cpp.sh"


def _pinned() -> tuple[str, str]:
    text = SCRIPT.read_text()
    version = re.search(r"^VERSION=(\S+)$", text, re.M)
    sha256 = re.search(r"^SHA256=([0-9a-f]{64})$", text, re.M)
    assert version and sha256, "scripts/llama_cpp.sh pins VERSION= and SHA256="
    return version.group(1), sha256.group(1)


def _run(tmp_path: Path, stamp: str, cpu_flags: str) -> subprocess.CompletedProcess[str]:
    version, _ = _pinned()
    prefix = tmp_path / "prefix"
    (prefix / "venv" / "bin").mkdir(parents=True, exist_ok=True)
    python = prefix / "venv" / "bin" / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    build = tmp_path / "llama.cpp" / version
    (build / "bin").mkdir(parents=True, exist_ok=True)
    for tool in ("llama-server", "llama-quantize"):
        (build / "bin" / tool).write_text("#!/bin/sh\n")
        (build / "bin" / tool).chmod(0o755)
    (build / "SDIST_SHA256").write_text(stamp + "\n")
    (build / "CPU_FLAGS").write_text(cpu_flags + "\n")
    tools = tmp_path / "tools"  # what the script runs, without cmake
    tools.mkdir(exist_ok=True)
    for tool in ("sh", "cat", "grep", "mktemp", "rm"):
        if not (tools / tool).exists():
            (tools / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    env = {"PATH": str(tools), "EDGECTL_PREFIX": str(prefix), "EDGECTL_MODEL_CACHE": str(tmp_path / "models"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.run([str(tools / "sh"), str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)


def _own_flag() -> str:
    """One ISA extension this CPU has (the build's record may list only what the CPU has)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return line.split(":", 1)[1].split()[0]
    pytest.skip("no flags line in /proc/cpuinfo")


def test_a_build_of_the_pinned_archive_is_reused(tmp_path):
    _, sha256 = _pinned()
    done = _run(tmp_path, sha256, _own_flag())
    assert done.returncode == 0, done.stderr
    assert "already built" in done.stdout


@pytest.mark.parametrize("why", ["another archive", "a CPU extension this one lacks"])
def test_any_other_build_is_rebuilt(tmp_path, why):
    _, sha256 = _pinned()
    stamp, flags = ("0" * 64, _own_flag()) if why == "another archive" else (sha256, "no_such_extension")
    done = _run(tmp_path, stamp, flags)
    assert done.returncode == 2 and "error: cmake is missing" in done.stderr, (done.stdout, done.stderr)
