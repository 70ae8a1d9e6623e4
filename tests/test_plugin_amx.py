"""The plugin asks Linux for AMX tile data before vLLM's AMX attention kernel runs.

Needs a CPU with AMX (skipped elsewhere, saying so): Linux grants AMX per process on request
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``); vLLM 0.32's AMX attention never asks, so a process whose
linear layers are all on edgectl's kernels (no oneDNN, which asks) died of SIGILL at its first
forward pass. Each check runs in a fresh interpreter: the permission, once granted, stays for
the life of the process.
"""

from __future__ import annotations

import subprocess

import pytest
from int4_helpers import RUNTIME_PYTHON, runtime_env

ARCH_GET_XCOMP_PERM = 0x1022  # arch/x86/include/uapi/asm/prctl.h
XFEATURE_XTILEDATA = 18

PERMITTED = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_uint64(0)
rc = libc.syscall(158, {ARCH_GET_XCOMP_PERM}, ctypes.byref(mask))  # 158: SYS_arch_prctl on x86-64
print(int(rc == 0 and bool(mask.value >> {XFEATURE_XTILEDATA} & 1)))
"""


def _run(code: str) -> str:
    done = subprocess.run([RUNTIME_PYTHON, "-c", code], capture_output=True, text=True, timeout=300,
                          env=runtime_env())
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def amx_cpu() -> None:
    pytest.importorskip("torch")
    if _run("import torch; print(int(torch.cpu._is_amx_tile_supported()))") != "1":
        pytest.skip("needs a CPU with AMX tiles that this kernel enables (x86_64-amx class)")


def test_a_fresh_process_has_no_amx_permission(amx_cpu):
    """The premise: importing torch does not ask (so something must)."""
    assert _run("import torch\n" + PERMITTED) == "0"


def test_the_plugin_asks_for_amx(amx_cpu):
    code = "from edgectl_runtime.vllm_plugin import request_amx\nassert request_amx() is True\n" + PERMITTED
    assert _run(code) == "1"
