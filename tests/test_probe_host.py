"""The probe on this machine against the machine's own tools: nproc, lscpu, free, uname."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from probe_helpers import probe_json

from edgectl.probe import AmxPermission, DeviceClass, probe
from edgectl.probe import cpuid as cpuid_mod

pytestmark = pytest.mark.host


def _run(*cmd: str, env: dict[str, str] | None = None) -> str:
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not installed")
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=30).stdout


def _lscpu_rows(columns: str) -> list[list[str]]:
    # lscpu -p prints one comma-separated row per online CPU (offline ones only with --all)
    return [ln.split(",") for ln in _run("lscpu", f"-p={columns}").splitlines() if not ln.startswith("#")]


def _lscpu_flags() -> set[str]:
    for line in _run("lscpu").splitlines():
        if line.startswith("Flags:"):
            return set(line.split(":", 1)[1].split())
    pytest.skip("lscpu prints no Flags line on this architecture")


@pytest.fixture(scope="module")
def facts():
    return probe("/")


def test_usable_cpus_match_nproc(facts):
    # nproc counts the CPUs this process may run on (its affinity), unless OMP_* says otherwise
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
    assert len(facts.topology.usable_cpus) == int(_run("nproc", env=env))
    assert set(facts.topology.usable_cpus) == os.sched_getaffinity(0)


def test_cpu_counts_match_lscpu(facts):
    rows = _lscpu_rows("CPU,CORE,SOCKET")
    assert facts.topology.logical_cpus == len(rows)
    assert facts.topology.physical_cores == len({(r[2], r[1]) for r in rows})
    assert facts.topology.sockets == len({r[2] for r in rows})


def test_numa_nodes_match_lscpu(facts):
    rows = _lscpu_rows("CPU,NODE")
    by_node: dict[int, set[int]] = {}
    for cpu, node in rows:
        by_node.setdefault(int(node or 0), set()).add(int(cpu))
    assert {n.id: set(n.cpus) for n in facts.topology.numa_nodes} == by_node


def test_flags_match_lscpu(facts):
    flags = _lscpu_flags()
    assert set(facts.cpu.flags) == flags
    isa = facts.cpu.isa
    for feature in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile"):
        if not any(d.feature == feature for d in facts.cpu.isa_disagreements):
            assert getattr(isa, feature) == (feature in flags), feature


def test_device_class_follows_lscpu_flags(facts):
    flags = _lscpu_flags()
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    if facts.cpu.isa_disagreements:
        pytest.skip("cpuid and the kernel disagree here: the class follows the stricter view")
    if {"amx_tile", "amx_bf16"} <= flags and facts.cpu.amx_permission is AmxPermission.GRANTED:
        expected = DeviceClass.X86_64_AMX
    elif avx512 and "avx512_bf16" in flags:
        expected = DeviceClass.X86_64_AVX512_BF16
    elif avx512:
        expected = DeviceClass.X86_64_AVX512
    elif {"avx2", "fma"} <= flags:
        expected = DeviceClass.X86_64_AVX2
    else:
        pytest.skip("not an x86 class")
    assert facts.device_class is expected


def test_cpuid_helper_agrees_with_the_kernel_here():
    """The machine code in _cpuid_helper.py decodes the same AVX/AVX-512 bits the kernel lists
    (on a host where they agree, which lscpu shows)."""
    if os.uname().machine != "x86_64":
        pytest.skip("cpuid is x86 only")
    view = cpuid_mod.read_live(request_amx=False)
    flags = _lscpu_flags()
    for feature in ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"):
        assert (feature in view.advertised) == (feature in flags), feature
    assert view.xcr0 is not None and view.xcr0 & 0b11 == 0b11  # x87 and SSE are always on


def test_amx_permission_follows_the_flags(facts):
    if "amx_tile" not in facts.cpu.flags:
        assert facts.cpu.amx_permission is AmxPermission.UNSUPPORTED
    else:
        assert facts.cpu.amx_permission in (AmxPermission.GRANTED, AmxPermission.DENIED,
                                            AmxPermission.UNSUPPORTED)


def test_memory_matches_free(facts):
    # free -b: "Mem:  total used free shared buff/cache available", from /proc/meminfo
    mem = next(ln.split() for ln in _run("free", "-b").splitlines() if ln.startswith("Mem:"))
    total, available = int(mem[1]), int(mem[6])
    assert facts.memory.total_bytes == total
    # available moves while other work runs: within 5 % of the total
    assert abs(facts.memory.available_bytes - available) < total * 0.05
    swap = next(ln.split() for ln in _run("free", "-b").splitlines() if ln.startswith("Swap:"))
    assert facts.memory.swap_total_bytes == int(swap[1])
    assert 0 < facts.memory.budget_bytes < facts.memory.available_bytes


def test_software_matches_the_system(facts):
    assert facts.software.kernel == _run("uname", "-r").strip()
    pid1 = _run("ps", "-p", "1", "-o", "comm=").strip()
    assert facts.software.systemd_pid1 == (pid1 == "systemd")
    assert facts.software.python == ".".join(map(str, sys.version_info[:3]))


def test_torch_version_is_what_torch_says(facts):
    """Read from metadata by the probe; here torch is really imported (in a subprocess) to check."""
    if facts.software.torch is None:
        pytest.skip("torch is not installed in this interpreter")
    out = _run(sys.executable, "-c", "import torch; print(torch.__version__)")
    assert facts.software.torch == out.strip()


def test_bandwidth_is_measured_only_when_asked():
    d = probe_json("/")
    assert d["bandwidth_gbps"] is None
    d = probe_json("/", "--bandwidth")
    assert d["bandwidth_gbps"] is not None and d["bandwidth_gbps"] > 0
    assert any("read + write" in n for n in d["notes"])
