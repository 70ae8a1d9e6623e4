"""Which kernels this process can actually run, as JSON (``python -m edgectl_runtime.tools.diagnostics.report``).

- edgectl's own library (``edgectl_runtime.kernels.ops``): built or not, the ISA levels the CPU and the
  OS allow, the level selected (``EDGECTL_KERNEL_ISA``);
- PyTorch's int4 op, run once against the dequantized product;
- the weight formats edgectl serves (``formats``: those of the plan's ``WeightFormat``), each with
  whether its kernel runs in this process;
- vLLM's C library: vLLM 0.32's x86 wheel ships three builds (``_C`` for AVX-512 + BF16/AMX,
  ``_C_AVX512``, ``_C_AVX2``) and ``platforms/cpu.py`` picks one from the CPU flags. Its int4 ops
  (``cpu_gemm_wna16``, ``int4_scaled_mm_cpu``) exist only in some of them, and vLLM's kernel
  selection does not check: a W4A16 checkpoint on an AVX2 box selects ``cpu_gemm_wna16`` and
  fails at the first forward pass. So the weight formats are offered from what is registered
  here, never from flags alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from edgectl_runtime.kernels.ops.tinygemm import (
    int4_matmul,
    kernel_pack,
    scales_and_zeros,
)

# vLLM C ops that matter to a weight format (torch.ops._C.<name>).
VLLM_OPS = (
    "cpu_gemm_wna16",  # W4A16, GPTQ-style int4 (w4a16-vllm)
    "int4_scaled_mm_cpu",  # W4A8 with dynamic int8 activations, AMX: vLLM's own path, not an edgectl format
    "convert_weight_packed",
    "convert_weight_packed_scale_zp",
    "weight_packed_linear",
    "create_onednn_mm_handler",  # bf16/fp32 dense GEMM through oneDNN
    "onednn_scaled_mm",  # W8A8 int8
)


def _loaded_vllm_libraries() -> list[str]:
    """Names of vLLM's C libraries mapped into this process (from /proc/self/maps: importing
    ``vllm._C_AVX512`` raises even when the library is loaded, so sys.modules cannot tell)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    names = set()
    for line in maps.splitlines():
        path = line.rsplit(" ", 1)[-1]
        if "/vllm/" in path and path.endswith(".so"):
            name = Path(path).name.split(".", 1)[0]
            if name.startswith("_C"):
                names.add(name)
    return sorted(names)


def _expected_vllm_library() -> str:
    """The library vLLM's CPU platform chooses on this CPU (platforms/cpu.py import_kernels)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64", "i386", "i686"):
        return "_C"
    if torch.cpu._is_avx512_supported():
        return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    return "_C_AVX2"


def torch_int4_check() -> dict:
    """Run torch's CPU int4 op once on a small matrix and compare with the dequantized product."""
    from edgectl_runtime.formats.groups import dequantize_int4, quantize_int4

    result = {"op": "aten._weight_int4pack_mm_for_cpu", "registered": hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")}
    if not result["registered"]:
        result["works"] = False
        return result
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(64, 128, generator=gen)
        x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
        q, s, z = quantize_int4(w, 32, torch.bfloat16)
        out = int4_matmul(x, kernel_pack(q), 32, scales_and_zeros(s, z, torch.bfloat16)).float()
        ref = x.float() @ dequantize_int4(q, s, z).t()
        rel = float((out - ref).norm() / ref.norm())
        result.update(works=rel < 2e-2, rel_error=rel)
    except RuntimeError as exc:
        result.update(works=False, error=str(exc).splitlines()[0])
    return result


def kernel_report() -> dict:
    import vllm._custom_ops  # noqa: F401  (loads vLLM's C library, as the engine does)

    ops = {name: hasattr(torch.ops._C, name) for name in VLLM_OPS}
    all_ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("_C::"))
    amx = bool(torch.cpu._is_amx_tile_supported())
    torch_int4 = torch_int4_check()
    edgectl = edgectl_kernels()
    formats = {
        "bf16": True,
        "w4a16": bool(torch_int4.get("works")),
        "w4a16-vllm": ops["cpu_gemm_wna16"],
        # edgectl's own kernels (every x86 and ARM CPU, once built); w8a8: a speech model's linear layers
        "w4a8": edgectl["loaded"],
        "w8a8": edgectl["loaded"],
    }
    return {
        "schema": "edgectl.kernels/1",
        "torch": {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "avx512": bool(torch.cpu._is_avx512_supported()),
                  "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()), "amx": amx,
                  "int4": torch_int4},
        "vllm": {"library_expected": _expected_vllm_library(), "libraries_loaded": _loaded_vllm_libraries(),
                 "registered_ops_count": len(all_ops), "int4_ops": ops,
                 # whether vLLM's own W4A8 kernel could run here: vLLM uses it only with AMX (or
                 # RISC-V) and VLLM_CPU_INT4_W4A8=1 (model_executor/kernels/linear/mixed_precision/
                 # cpu.py). A fact about vLLM, not a format edgectl serves: its runtime never calls it.
                 "w4a8_amx_usable": ops["int4_scaled_mm_cpu"] and amx},
        "edgectl": edgectl,
        "formats": formats,
    }


def edgectl_kernels() -> dict:
    """edgectl's library: loaded or why not, the levels cpuid + XCR0 allow, the level in use."""
    from edgectl_runtime.kernels import ops

    ok, why = ops.available()
    out: dict = {"loaded": ok, "library": str(ops.LIBRARY)}
    if not ok:
        out["error"] = why
        return out
    try:
        out["isa"] = ops.load()
    except ops.KernelLibraryError as exc:
        out.update(loaded=False, error=str(exc))
        return out
    out["supported_isas"] = ops.supported_levels()
    try:
        out["build"] = json.loads(ops.STAMP.read_text())
    except (OSError, ValueError):
        out["build"] = None
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.diagnostics.report",
                            description="Which int4/int8 kernels this process can run (JSON).").parse_args(argv)
    print(json.dumps(kernel_report(), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())


# SmolLM2-135M's linear layers (vLLM's fused qkv and gate_up) and its LM head.
