"""Which ISA a test run holds the runtime to, and what each ISA must read back (no tests here).

``sh scripts/test.sh`` runs the whole suite on this machine's own ISA, then runs the tests marked
``isa_avx2`` once more as the **AVX2 tier**, with (scripts/test.sh, ``avx2_tier``)::

    EDGECTL_TEST_ISA=avx2                    # names the tier: the tests below expect AVX2
    ATEN_CPU_CAPABILITY=avx2                 # PyTorch's kernels (and inductor's vector ISA) at AVX2
    ONEDNN_MAX_CPU_ISA=AVX2                  # oneDNN's JIT at AVX2: no AVX-512, bf16 or AMX code
    MKL_ENABLE_INSTRUCTIONS=AVX2             # MKL's dispatch (torch's float GEMMs) at AVX2
    TORCHINDUCTOR_CPP_MARCH=x86-64-v3        # inductor compiles its C++ for AVX2, not -march=native
    GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,...  # glibc's string functions: no EVEX variants
    EDGECTL_KERNEL_ISA=avx2                  # edgectl's own kernels (runtime/edgectl_runtime/kernels/ops)
    PYTHONPATH=tests/isa_avx2                # vLLM asks torch.cpu._is_avx512_supported() & co.:
                                             # tests/isa_avx2/sitecustomize.py answers False

(:data:`AVX2_CAPS` has the values and why each is needed.) Settings are not proof: the tier also
disassembles the code it ran — every shared object inductor compiled, and the level of edgectl's
kernels the run selected — and fails on any instruction above AVX2 (tests/isa_disassembly.py,
tests/test_isa_tier.py).

``EDGECTL_TEST_ISA`` is what the tier's own check (tests/test_isa_tier.py) holds every layer to,
so an environment that did not take fails there instead of passing on the wrong ISA.

A test that depends on the ISA asks :func:`host_isa` what the run has — in the tier, this host
as an AVX2 machine would be; otherwise what ``edgectl probe`` finds — and the planner is asked
the same question: :func:`plan_args` gives ``edgectl plan`` the ``--facts`` of this host with
the ISA above AVX2 taken away, so a worker in the tier runs the plan an AVX2 user gets.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

TIER = (os.environ.get("EDGECTL_TEST_ISA") or "").strip().lower() or None  # "avx2" in the AVX2 tier
TIERS = ("avx2",)

# cpu.isa fields of edgectl.probe/1 an AVX2 machine does not have (edgectl/probe/facts.py ISA_FEATURES)
ABOVE_AVX2 = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8",
              "amx_bf16")


@functools.cache
def _probe_json() -> dict:
    """This host's probe, from the checkout's control plane (no torch)."""
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo)] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-m", "edgectl", "probe", "--json"], capture_output=True, text=True,
                         timeout=120, env=env, cwd=repo)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def probe_facts() -> dict:
    """``edgectl probe --json`` of this host as the run should see it: in the AVX2 tier, with
    every ISA feature above AVX2 absent, AMX unsupported and the device class ``x86_64-avx2``."""
    facts = json.loads(json.dumps(_probe_json()))
    if TIER is None:
        return facts
    if TIER not in TIERS:
        raise AssertionError(f"EDGECTL_TEST_ISA={TIER!r}: the test tiers are {', '.join(TIERS)}")
    cpu = facts["cpu"]
    if not (cpu["isa"].get("avx2") and cpu["isa"].get("fma")):
        raise AssertionError("the AVX2 tier needs a CPU with AVX2 and FMA; this one has "
                             f"{sorted(k for k, v in cpu['isa'].items() if v)}")
    for feature in ABOVE_AVX2:
        cpu["isa"][feature] = False
    cpu["flags"] = [f for f in cpu["flags"] if not f.startswith(("avx512", "amx"))]
    cpu["amx_permission"] = "unsupported"
    facts["device_class"] = "x86_64-avx2"
    return facts


def machine_isa() -> dict[str, bool]:
    """This machine's own ISA (``cpu.isa`` of ``edgectl probe``), whatever the run holds it to."""
    return dict(_probe_json()["cpu"]["isa"])


def host_isa() -> dict[str, bool]:
    """The usable ISA of the run (``cpu.isa`` of :func:`probe_facts`)."""
    return dict(probe_facts()["cpu"]["isa"])


def plan_args(tmp: Path) -> list[str]:
    """Extra ``edgectl plan`` arguments that plan for the run's ISA: none natively (the planner
    probes this host), ``--facts FILE`` in a tier."""
    if TIER is None:
        return []
    path = tmp / f"facts-{TIER}.json"
    path.write_text(json.dumps(probe_facts()))
    return ["--facts", str(path)]


def avx512(isa: dict[str, bool]) -> bool:
    """AVX-512 as torch and vLLM's CPU build mean it: F+BW+VL+DQ (edgectl/probe/cpu.py device_class)."""
    return all(isa.get(f) for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


def expected_torch_capability(isa: dict[str, bool]) -> str:
    """``torch.backends.cpu.get_cpu_capability()`` on x86-64 (aten/src/ATen/native/DispatchStub.cpp)."""
    if avx512(isa):
        return "AVX512"
    return "AVX2" if isa.get("avx2") and isa.get("fma") else "DEFAULT"


def expected_vllm_library(isa: dict[str, bool]) -> str:
    """The C library vLLM 0.32 loads on x86-64 (vllm/platforms/cpu.py:639-660, the selection
    rules of tests/data/vllm_kernels.yaml): ``_C`` with AVX512-BF16, ``_C_AVX512``, else ``_C_AVX2``."""
    if avx512(isa):
        return "_C" if isa.get("avx512_bf16") else "_C_AVX512"
    return "_C_AVX2"


def expected_attention_isa(isa: dict[str, bool]) -> str:
    """vLLM's CPU attention kernel for bf16 KV in 128-token blocks (a head size divisible by 32):
    ``amx`` where the CPU has AMX tiles, else ``vec`` (vllm/v1/attention/backends/cpu_attn.py
    ``_get_attn_isa``)."""
    return "amx" if isa.get("amx_tile") else "vec"


def vllm_packs_bf16_gemm(isa: dict[str, bool]) -> bool:
    """Whether vLLM 0.32 can prepack a bf16 linear layer here (``dispatch_cpu_unquantized_gemm``,
    vllm/model_executor/layers/utils.py:470-608): sgl-kernel needs AMX tiles, oneDNN a bf16 matmul,
    which it builds from AVX-512 (core) up; on AVX2 it falls back to an unpacked F.linear."""
    return bool(isa.get("amx_tile")) or avx512(isa)


# The variables that hold a process on this CPU to AVX2, with the values the AVX2 tier gives
# them (scripts/test.sh avx2_tier sets the same; test_isa_tier.py checks that it did, and reads
# each layer back):
AVX2_CAPS = {
    # ATen's dispatch (aten/src/ATen/native/DispatchStub.cpp), and inductor's vector ISA:
    # torch/_inductor/cpu_vec_isa.py pick_vec_isa() (lines 649-667) maps ATEN_CPU_CAPABILITY
    # through get_isa_from_cpu_capability() (lines 565-592) to VecAVX2 (-mavx2 -mfma -mf16c).
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's JIT
    # torch's CPU wheel does its float GEMMs in MKL, which picks its code from cpuid (AVX-512 and
    # AMX on x86_64-amx) unless capped; MKL_VERBOSE's first line names the ISA it took.
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    # inductor adds -march=native to every C++ kernel it compiles unless config.cpp.march is set
    # (torch/_inductor/cpp_builder.py _get_cpu_arch_cflags, lines 998-1025; config.py line 1697,
    # config.cpp.march = TORCHINDUCTOR_CPP_MARCH): with its AVX2 vector ISA, g++ -march=native
    # still uses AVX-512VL's EVEX forms and ymm16-31 on an AVX-512 host. x86-64-v3 is the
    # x86-64 psABI level of AVX2 (with FMA, F16C, BMI1/2, LZCNT, MOVBE).
    "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3",
    # glibc picks memcpy, strlen & co. by cpuid at load time; on AVX-512VL hosts it takes their
    # EVEX variants (sysdeps/x86_64/multiarch/ifunc-impl-list.c). glibc.cpu.hwcaps turns the
    # features off for that choice (sysdeps/x86/cpu-tunables.c, the names it accepts); read back
    # with ld.so --list-diagnostics.
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD",
    "EDGECTL_KERNEL_ISA": "avx2",  # edgectl's kernels (runtime/edgectl_runtime/kernels/ops)
}
# what a process started for the run must be given to run at the run's ISA (e.g. a systemd unit,
# which inherits nothing: tests/test_faults_systemd.py), set or not
ISA_CAPS = tuple(AVX2_CAPS)

# what a test that builds its own subprocess environment passes on, so the subprocess runs at the run's ISA
TIER_VARIABLES = ("EDGECTL_TEST_ISA", *ISA_CAPS)


def tier_environment(pythonpath: list[str]) -> dict[str, str]:
    """The run's ISA variables, and ``PYTHONPATH`` = ``pythonpath`` then the run's own (where the
    tier puts tests/isa_avx2)."""
    env = {k: os.environ[k] for k in TIER_VARIABLES if os.environ.get(k)}
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, *[p for p in [os.environ.get("PYTHONPATH")] if p]])
    return env


def expected_kernel_isa(isa: dict[str, bool]) -> str:
    """The level edgectl's kernels run at (runtime/edgectl_runtime/kernels/ops/csrc/dispatch.cpp
    ``detect_levels``): ``avx512vnni`` with AVX-512 F+BW+VL and VNNI, ``avxvnni`` with AVX2+FMA and
    AVX-VNNI, ``avx2`` with AVX2+FMA, else ``scalar``. In the AVX2 tier EDGECTL_KERNEL_ISA=avx2
    selects avx2, which this rule gives too. The probe's ``cpu.isa`` has no AVX-VNNI field, so
    natively it is read from the probe's ``cpu.flags`` (the kernel's spelling, ``avx_vnni``)."""
    if all(isa.get(f) for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")):
        return "avx512vnni"
    if not (isa.get("avx2") and isa.get("fma")):
        return "scalar"
    return "avxvnni" if TIER is None and "avx_vnni" in probe_facts()["cpu"]["flags"] else "avx2"


def expected_int4_block_rows(isa: dict[str, bool]) -> int:
    """Rows per block of torch's packed int4 weight (``_convert_weight_to_int4pack_for_cpu``):
    BLOCK_N is 64 in its AVX-512 kernel, 32 in its AVX2 and scalar ones (tests/test_int4_kernel.py)."""
    return 64 if expected_torch_capability(isa) == "AVX512" else 32
