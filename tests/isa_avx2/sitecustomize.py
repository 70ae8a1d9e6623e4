"""The AVX2 path on an AVX-512 machine (a test and bench tier, never installed).

Use (the whole set, with why each is needed: tests/isa_helpers.py ``AVX2_CAPS``)::

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
    TORCHINDUCTOR_CPP_MARCH=x86-64-v3 GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,... \
    EDGECTL_KERNEL_ISA=avx2 PYTHONPATH=tests/isa_avx2 COMMAND

- ``ATEN_CPU_CAPABILITY=avx2``: torch's ATen kernels dispatch to their AVX2 builds, and inductor
  generates AVX2 vector code for the compiled mode (``torch/_inductor/cpu_vec_isa.py``
  ``pick_vec_isa``); ``TORCHINDUCTOR_CPP_MARCH=x86-64-v3`` has g++ compile it for AVX2 too (else
  ``-march=native``, which on an AVX-512 host still emits EVEX instructions).
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's JIT stops at AVX2 (no AVX-512, AVX512-BF16 or AMX code);
  ``MKL_ENABLE_INSTRUCTIONS=AVX2`` the same for MKL; ``GLIBC_TUNABLES`` for glibc's own choice.
- this file: ``torch.cpu._is_avx512_supported()`` and its siblings read cpuid, not
  ``ATEN_CPU_CAPABILITY``, and vLLM asks them which C library to load (``vllm/platforms/cpu.py:639-660``:
  ``_C``, ``_C_AVX512`` or ``_C_AVX2``, when ``vllm._custom_ops`` is first imported), which attention
  kernel to run (``v1/attention/backends/cpu_attn.py:533-545``) and which int4 kernels exist. Python
  imports ``sitecustomize`` before anything else in every interpreter, including vLLM's spawned
  EngineCore and Worker (they inherit ``PYTHONPATH``), so the answers are in place before vLLM asks.

It acts only when ``ATEN_CPU_CAPABILITY`` asks for AVX2 or less; ``EDGECTL_TEST_ISA_REPORT=1`` prints
what it changed. (It replaces Debian's own ``sitecustomize``, which only installs apport's hook.)
"""

import os

_CAP = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()

if _CAP in ("avx2", "default"):
    import torch.cpu

    _ABOVE_AVX2 = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
                   "_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_vnni_supported")
    _changed = []
    for _name in _ABOVE_AVX2:
        _real = getattr(torch.cpu, _name, None)
        if _real is not None:
            _changed.append(f"{_name}: {_real()} -> False")
            setattr(torch.cpu, _name, lambda: False)
    if os.environ.get("EDGECTL_TEST_ISA_REPORT") == "1":
        print(f"tests/isa_avx2/sitecustomize: ATEN_CPU_CAPABILITY={_CAP}; " + "; ".join(_changed), flush=True)
