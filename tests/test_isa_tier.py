"""The ISA a run holds the runtime to, read back at every layer: PyTorch, oneDNN, vLLM's C
library, and inside the engine (vLLM's attention kernel, PyTorch's capability, the level of
edgectl's kernels, the plan).

Run twice by ``sh scripts/test.sh``: on this machine's own ISA, and in the AVX2 tier
(``EDGECTL_TEST_ISA=avx2``, tests/isa_helpers.py). In the tier each layer must read back AVX2:
an environment that did not take (a variable dropped on the way to a subprocess, a
sitecustomize that no longer patches, a vLLM that asks something else) fails here, rather than
letting the tier's other tests pass on AVX-512. Natively each layer must read back what
``edgectl probe`` finds.

In the tier, settings are then checked against the code: a graph compiled by inductor in the
run's environment, and the level of edgectl's kernels the run selects, are disassembled
(tests/isa_disassembly.py) and the tier fails on any instruction above AVX2. That the check can
fail is shown twice: on the kernels' AVX-512 level (tests/test_isa_disassembly.py) and here, on
the same graph compiled for this CPU (``-march=native``), where the host has AVX-512.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import isa_disassembly
import isa_helpers
import pytest
from installed import RUNTIME_PYTHON
from int4_helpers import REPO, read_json_line, runtime_env

from edgectl.deploy import QUESTION
from edgectl.launch import worker_command

pytestmark = pytest.mark.isa_avx2

_READ_ISA = r"""
import json, os, sys
import torch
# oneDNN prints the ISA it dispatches to (ONEDNN_MAX_CPU_ISA applied) with its first primitive
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
    torch._C._nn.mkldnn_linear(torch.randn(8, 64).to_mkldnn(), torch.randn(32, 64).to_mkldnn())
# MKL names the ISA it took (MKL_ENABLE_INSTRUCTIONS applied) in its verbose mode's first line;
# torch's float GEMM is MKL's sgemm in the CPU wheel
with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
    torch.mm(torch.randn(64, 64), torch.randn(64, 64))
from torch._inductor import cpp_builder, cpu_vec_isa  # what inductor would compile its C++ for
import vllm._custom_ops  # noqa: F401  (loads vLLM's C library for this CPU: vllm/platforms/cpu.py)
libs = sorted({os.path.basename(line.rsplit(" ", 1)[-1]).split(".", 1)[0]
               for line in open("/proc/self/maps").read().splitlines()
               if "/vllm/" in line and line.endswith(".so") and os.path.basename(line.rsplit(" ", 1)[-1]).startswith("_C")})
print(json.dumps({
    "capability": torch.backends.cpu.get_cpu_capability(),
    "avx512": bool(torch.cpu._is_avx512_supported()),
    "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
    "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
    "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    "vllm_libraries": libs,
    "inductor_vec_isa": str(cpu_vec_isa.pick_vec_isa()),
    "inductor_arch_flags": cpp_builder._get_cpu_arch_cflags(cpp_builder.get_cpp_compiler()),
}))
"""


@pytest.fixture(scope="module")
def runtime_isa() -> tuple[dict, str]:
    """What a runtime process of this run reads back: torch's answers, vLLM's library, and
    oneDNN's own ``isa:`` line."""
    pytest.importorskip("torch")
    done = subprocess.run([RUNTIME_PYTHON, "-c", _READ_ISA], env=runtime_env(), capture_output=True, text=True,
                          timeout=300, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    onednn = [line.split("isa:", 1)[1].strip() for line in done.stdout.splitlines()
              if line.startswith("onednn_verbose") and ",cpu,isa:" in line]
    assert len(onednn) == 1, done.stdout[-3000:]
    mkl = [line.split(" architecture ", 1)[1] for line in done.stdout.splitlines()
           if line.startswith("MKL_VERBOSE") and " architecture " in line]
    assert len(mkl) == 1, done.stdout[-3000:]
    return {**read_json_line(done.stdout), "mkl": mkl[0]}, onednn[0]


def test_the_tier_is_one_there_is():
    """A mistyped tier must not run as the native one."""
    assert isa_helpers.TIER in (None, *isa_helpers.TIERS), isa_helpers.TIER
    if isa_helpers.TIER == "avx2":
        # what scripts/test.sh sets for the tier; a runtime process inherits it (int4_helpers.runtime_env)
        env = runtime_env()
        for name, value in isa_helpers.AVX2_CAPS.items():
            items = env.get(name, "").split(":") if name == "GLIBC_TUNABLES" else [env.get(name)]
            assert value in items, f"{name}={env.get(name)!r}: the tier sets {value!r} (scripts/test.sh, isa_helpers)"
        assert str(REPO / "tests" / "isa_avx2") in env["PYTHONPATH"].split(os.pathsep), env["PYTHONPATH"]


@pytest.mark.runtime
def test_torch_answers_for_the_runs_isa(runtime_isa):
    """PyTorch's dispatch level and the ISA questions vLLM asks it (``torch.cpu._is_*``)."""
    got, _ = runtime_isa
    isa = isa_helpers.host_isa()
    assert got["capability"] == isa_helpers.expected_torch_capability(isa), (got, isa)
    assert got["avx512"] == isa_helpers.avx512(isa), (got, isa)
    assert got["avx512_bf16"] == bool(isa["avx512_bf16"]), (got, isa)
    assert got["amx_tile"] == bool(isa["amx_tile"]), (got, isa)
    if isa_helpers.TIER == "avx2":
        assert (got["capability"], got["avx512"]) == ("AVX2", False), got


@pytest.mark.runtime
def test_onednn_dispatches_at_the_runs_isa(runtime_isa):
    """oneDNN's own report (ONEDNN_MAX_CPU_ISA applied), and whether it builds bf16 matmuls: only
    with AVX-512 (core) or more."""
    got, onednn = runtime_isa
    isa = isa_helpers.host_isa()
    if isa_helpers.TIER == "avx2":
        assert onednn == "Intel AVX2", onednn
        assert got["onednn_bf16"] is False, got
    elif isa_helpers.avx512(isa):
        assert any(s in onednn for s in ("AVX-512", "AVX512", "AVX10")), onednn
        assert got["onednn_bf16"] is True, got
    else:
        assert "AVX-512" not in onednn and "AVX10" not in onednn, onednn


@pytest.mark.runtime
def test_vllm_loads_the_library_of_the_runs_isa(runtime_isa):
    got, _ = runtime_isa
    if os.uname().machine != "x86_64":
        pytest.skip("the library rule is vLLM's x86-64 one")
    expected = isa_helpers.expected_vllm_library(isa_helpers.host_isa())
    assert got["vllm_libraries"] == [expected], got
    if isa_helpers.TIER == "avx2":
        assert got["vllm_libraries"] == ["_C_AVX2"], got


@pytest.mark.runtime
def test_mkl_dispatches_at_the_runs_isa(runtime_isa):
    """MKL's own report of the code it runs (``MKL_ENABLE_INSTRUCTIONS`` applied). On a CPU that is not
    Intel's MKL names no instruction set ("Intel(R) Architecture processors", seen on AMD Zen 5): there it
    must not claim AVX-512 in either tier, which is all its report can show."""
    got, _ = runtime_isa
    if isa_helpers.probe_facts()["cpu"]["vendor"] != "GenuineIntel":
        assert "Intel(R) Architecture processors" in got["mkl"] and "AVX-512" not in got["mkl"], got["mkl"]
    elif isa_helpers.TIER == "avx2":
        assert "(Intel(R) AVX2)" in got["mkl"] and "AVX-512" not in got["mkl"], got["mkl"]
    elif isa_helpers.avx512(isa_helpers.host_isa()):
        assert "AVX-512" in got["mkl"], got["mkl"]


@pytest.mark.runtime
def test_inductor_compiles_for_the_runs_isa(runtime_isa):
    """Inductor's vector ISA (from ATEN_CPU_CAPABILITY) and its -march (TORCHINDUCTOR_CPP_MARCH;
    unset: native)."""
    got, _ = runtime_isa
    if isa_helpers.TIER == "avx2":
        assert (got["inductor_vec_isa"], got["inductor_arch_flags"]) == ("avx2", ["march=x86-64-v3"]), got
    elif not os.environ.get("TORCHINDUCTOR_CPP_MARCH") and os.uname().machine == "x86_64":
        assert got["inductor_arch_flags"] == ["march=native"], got


# ld.so --list-diagnostics prints glibc's view of cpuid after its tunables, e.g.
# "x86.cpu_features.features[0x1].active[0x1]=0x21ac0b38": entry 1 is cpuid leaf 7, register 1 EBX,
# where AVX512F is bit 16 and AVX512VL bit 31 (Intel SDM vol. 2, CPUID leaf 07H)
_LD_SO = "/lib64/ld-linux-x86-64.so.2"
_LEAF7_EBX = "x86.cpu_features.features[0x1].active[0x1]="


def test_glibc_dispatches_at_the_runs_isa():
    """glibc picks its string functions' variants from the features it holds active: in the tier
    neither AVX512F nor AVX512VL (which its EVEX variants need)."""
    if not os.path.exists(_LD_SO):
        pytest.skip(f"no x86-64 glibc loader at {_LD_SO}")
    done = subprocess.run([_LD_SO, "--list-diagnostics"], env=runtime_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    ebx = [int(line.split("=", 1)[1], 16) for line in done.stdout.splitlines() if line.startswith(_LEAF7_EBX)]
    assert len(ebx) == 1, done.stdout[-2000:]
    active = {"avx512f": bool(ebx[0] >> 16 & 1), "avx512vl": bool(ebx[0] >> 31 & 1)}
    isa = isa_helpers.host_isa()
    assert active == {"avx512f": bool(isa["avx512f"]), "avx512vl": bool(isa["avx512vl"])}, (active, isa)
    if isa_helpers.TIER == "avx2":
        assert active == {"avx512f": False, "avx512vl": False}, active


# --- the code itself: what inductor compiled and the kernels selected, disassembled

# A graph whose C++ g++ -march=native compiles with EVEX instructions on an AVX-512 host even
# with inductor's AVX2 vector ISA (uint8 and bf16 conversions, a gather, float64): measured on
# x86_64-amx; the check must then catch it (test_the_check_catches_a_graph_compiled_for_this_cpu).
_COMPILE_A_GRAPH = r"""
import json, os
import torch

def graph(x, u, idx, h):
    a = torch.nn.functional.gelu(x) * u.float()
    b = (x.to(torch.bfloat16) * h).float()
    c = a.cumsum(-1) + b.amax(-1, keepdim=True)
    d = torch.gather(c, 1, idx) + (idx // 3).float()
    e = (x.double() * 1.5).sum(-1)
    return d.sum(-1) + e.float() + torch.argmax(c, -1).float() + x.var(-1)

torch.manual_seed(0)
args = (torch.randn(37, 203), torch.randint(0, 255, (37, 203), dtype=torch.uint8),
        torch.randint(0, 203, (37, 5)), torch.randn(203).bfloat16())
torch.testing.assert_close(torch.compile(graph, backend="inductor")(*args), graph(*args), atol=1e-3, rtol=1e-3)

from edgectl_runtime.kernels import ops  # the level EDGECTL_KERNEL_ISA selects, as the engine loads it
print(json.dumps({"kernel_library": str(ops.LIBRARY), "kernel_isa": ops.load()}))
"""


def _compile_a_graph(cache_dir: Path, extra: dict[str, str] | None = None) -> tuple[dict, list[Path]]:
    """Compile the graph above in a runtime process of the run (its ISA environment), with
    inductor's cache in a fresh ``cache_dir``: what it read back, and every shared object it built."""
    env = runtime_env({"TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **(extra or {})})
    done = subprocess.run([RUNTIME_PYTHON, "-c", _COMPILE_A_GRAPH], env=env, capture_output=True, text=True,
                          timeout=900, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    return read_json_line(done.stdout), sorted(cache_dir.rglob("*.so"))


def _tier_only() -> None:
    if isa_helpers.TIER != "avx2":
        pytest.skip("natively the compiled code may use this CPU's whole ISA: the AVX2 tier disassembles it")


@pytest.fixture(scope="module")
def compiled_in_the_run(tmp_path_factory) -> tuple[dict, list[Path]]:
    _tier_only()
    return _compile_a_graph(tmp_path_factory.mktemp("inductor-cache"))


@pytest.mark.runtime
def test_no_instruction_above_avx2_in_what_inductor_compiled(compiled_in_the_run):
    _, objects = compiled_in_the_run
    assert objects, "inductor compiled no shared object for the graph: there was nothing to check"
    found = [f for path in objects for f in isa_disassembly.check_shared_object(path)]
    assert not found, isa_disassembly.report(found)


@pytest.mark.runtime
def test_no_instruction_above_avx2_in_the_kernels_the_run_selected(compiled_in_the_run):
    """The code of the level the run's environment selected (before its name: a level that names
    itself avx2 but is compiled above it must fail too)."""
    got, _ = compiled_in_the_run
    found = isa_disassembly.check_kernel_unit(Path(got["kernel_library"]), got["kernel_isa"])
    assert not found, isa_disassembly.report(found)
    assert got["kernel_isa"] == "avx2", got


@pytest.mark.runtime
def test_the_check_catches_a_graph_compiled_for_this_cpu(tmp_path):
    """The same graph, the same environment but inductor's default -march=native: on an AVX-512
    host the disassembly must find AVX-512 in it (what the tier's TORCHINDUCTOR_CPP_MARCH stops)."""
    _tier_only()
    if not isa_helpers.avx512(isa_helpers.machine_isa()):
        pytest.skip("this CPU has no AVX-512: -march=native cannot emit it")
    _, objects = _compile_a_graph(tmp_path / "inductor-cache", {"TORCHINDUCTOR_CPP_MARCH": "native"})
    found = [f for path in objects for f in isa_disassembly.check_shared_object(path)]
    assert found, f"no AVX-512 found in {len(objects)} objects compiled with -march=native: the check is blind"


# --- inside the engine: the plan an AVX2 user gets, served at AVX2

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.engine
def test_the_engine_serves_the_runs_plan_at_the_runs_isa(tmp_path, pulled_smollm2):
    """The planner is told the run's ISA (in the tier: this host as an AVX2 machine, device class
    x86_64-avx2); the worker serves only once the engine's read-back matches that plan; the engine
    reads back PyTorch's capability and vLLM's attention kernel for the run's ISA; and it answers."""
    isa = isa_helpers.host_isa()
    env = runtime_env()
    # eager: a compile costs minutes on 2 cores (compiled mode is the deploy test's and the bench's)
    out = subprocess.run([sys.executable, "-m", "edgectl", "plan", "smollm2-135m", "--max-model-len", "1024",
                          "--compilation", "eager", "--json", *isa_helpers.plan_args(tmp_path)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    if isa_helpers.TIER == "avx2":
        assert plan["device_class"] == "x86_64-avx2", plan["device_class"]
    port = _free_port()
    plan["serve"]["port"] = port
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in env.items() if k not in ("NOTIFY_SOCKET", "VLLM_CPU_KVCACHE_SPACE")}
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(worker_command(RUNTIME_PYTHON, str(tmp_path / "plan.json"),
                                               plan["levers"]["python_optimize"]),
                                env=env, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 900
            eff: dict = {}
            while True:
                # the worker exits 3 if the engine's settings differ from the plan (effective.py)
                assert proc.poll() is None, log_path.read_text()[-3000:]
                try:
                    eff = _get(base + "/edgectl/effective")
                    if eff.get("phase") == "serving":
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "the worker did not become ready"
                time.sleep(0.5)
            assert eff["kernel"]["cpu_capability"] == isa_helpers.expected_torch_capability(isa), eff["kernel"]
            assert eff["attention_isa"] == [isa_helpers.expected_attention_isa(isa)], eff["attention_isa"]
            # edgectl's plugin loads its kernel library in every worker at the level the environment
            # selects (runtime/edgectl_runtime/kernels/ops: EDGECTL_KERNEL_ISA, under ATEN_CPU_CAPABILITY)
            assert eff["kernel_isa"] == isa_helpers.expected_kernel_isa(isa), eff["kernel_isa"]
            if isa_helpers.TIER == "avx2":
                assert (eff["kernel"]["cpu_capability"], eff["attention_isa"], eff["kernel_isa"]) == \
                    ("AVX2", ["vec"], "avx2"), eff
            req = urllib.request.Request(base + "/v1/chat/completions", headers={"content-type": "application/json"},
                                         data=json.dumps({"model": "smollm2-135m", "max_tokens": 16, "temperature": 0,
                                                          "messages": [{"role": "user", "content": QUESTION}]}).encode())
            with urllib.request.urlopen(req, timeout=300) as r:
                answer = json.loads(r.read())["choices"][0]["message"]["content"]
            assert "Paris" in answer, answer
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_tiers_caps_are_the_variables_edgectl_passes_on():
    """The tier's variables are the ISA caps a benchmarked server inherits and a compiled graph's
    cache key holds (edgectl/contract/environment.py ISA_CAPS): one list, not two."""
    from edgectl.bench.provenance import child_environment
    from edgectl.contract.environment import ISA_CAPS

    assert set(isa_helpers.AVX2_CAPS) == set(ISA_CAPS)
    env, dropped = child_environment({**isa_helpers.AVX2_CAPS, "MKL_NUM_THREADS": "1", "EDGECTL_TRIM": "1"})
    assert all(env[k] == v for k, v in isa_helpers.AVX2_CAPS.items())
    assert dropped == ["EDGECTL_TRIM", "MKL_NUM_THREADS"]
