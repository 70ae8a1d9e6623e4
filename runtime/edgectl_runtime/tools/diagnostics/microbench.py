"""Kernel micro-benchmark: GB/s of weights moved at batch M per layer shape, per ISA level.

``python -m edgectl_runtime.tools.diagnostics.microbench [--shapes smollm2,1b] [--m 1 8] [--passes 5]``

For each layer shape, every arm multiplies ``[M, K]`` activations by the layer's weights:

- ``w4a8/<level>``, ``w5a8/<level>``, ``w8a8/<level>``: edgectl's integer kernels at each ISA level this
  CPU runs (the level is read back from the library while the arm runs; W5 holds a GGUF's Q5_0 as it is,
  so its weights here are the Q5_0 blocks gguf-py writes); ``w4a8-dense/<level>``: the same
  op forced onto its large-batch path (dequantize + PyTorch's dense GEMM), for the crossover;
- ``torch-int4``: PyTorch's ``_weight_int4pack_mm_for_cpu`` (the ``w4a16`` format), groups of 32,
  bf16 activations — the control arm;
- ``bf16``, ``fp32``: a dense ``F.linear`` (PyTorch's oneDNN / MKL GEMM): what a
  dequantize-then-GEMM path would call for large M (a lower bound of its cost).

Method: arms interleaved inside every pass (so a slow period hits all of them), medians over
passes, fresh random activations per pass, and each call reads a different copy of the weights,
rotating over copies that together exceed twice the last-level cache (the same sizing rule as
``edgectl probe --bandwidth``), so the weights come from memory as in a decode step and not
from a cache that a single layer would fit in. GB/s counts the bytes of the weights a call reads
(packed values, scales and minimums); the copy bandwidth counts read + write bytes of a memcpy.
Threads: torch's / OpenMP's current count (``--threads`` changes it). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch

# (name, N, K) with vLLM's fused qkv / gate_up.
SHAPES = {
    "smollm2": (("qkv_proj", 960, 576), ("o_proj", 576, 576), ("gate_up_proj", 3072, 576),
                ("down_proj", 576, 1536), ("lm_head", 49152, 576)),
    # Llama-3.2-1B's layers (hidden 2048, 32/8 heads of 64, FFN 8192) and its 128256-row tied head:
    # the catalog's synth-llama-1b (edgectl/models/catalog.py), the bench's 1B-class model.
    "1b": (("qkv_proj", 3072, 2048), ("o_proj", 2048, 2048), ("gate_up_proj", 16384, 2048),
           ("down_proj", 2048, 8192), ("lm_head", 128256, 2048)),
    # Gemma-3-270M (hidden 640, 4 query heads and 1 KV head of 256, FFN 2048): the catalog's Q4_K_M file
    # holds most of these layers in Q5_0 (640 is no multiple of 256), edgectl's W5 blocks.
    "gemma3": (("qkv_proj", 1536, 640), ("o_proj", 640, 1024), ("gate_up_proj", 4096, 640),
               ("down_proj", 640, 2048)),
}
MIB = 1024 * 1024


@dataclass
class Arm:
    name: str
    level: str | None  # edgectl's ISA level, None for other libraries
    weight_bytes: int
    copies: list
    call: object  # (x, weights) -> y
    dense_from: int = 0  # edgectl arms: 0 = the integer kernel, 1 = dequantize + dense GEMM


def _llc_bytes() -> int | None:
    best = None
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(f"{base}/{entry}/type") as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(f"{base}/{entry}/size") as f:
                text = f.read().strip()
            size = int(text[:-1]) * (1024 if text.endswith("K") else MIB) if text[-1] in "KM" else int(text)
            best = max(best or 0, size)
    except OSError:
        return None
    return best


def _copies(make, bytes_each: int, footprint: int) -> list:
    return [make() for _ in range(max(2, -(-footprint // max(1, bytes_each))))]


def _arms(n: int, k: int, levels: list[str], footprint: int, include: set[str]) -> list[Arm]:
    from edgectl_runtime.formats import blocks, ggml, groups
    from edgectl_runtime.kernels.ops import tinygemm

    gen = torch.Generator().manual_seed(n * 31 + k)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    arms: list[Arm] = []
    if "w4a8" in include or "w4a8-dense" in include:
        packed = blocks.quantize_and_pack(w, 4)
        copies = _copies(packed.clone, packed.numel(), footprint)
        for level in levels:
            for kind, dense in (("w4a8", 0), ("w4a8-dense", 1)):
                if kind in include:
                    arms.append(Arm(f"{kind}/{level}", level, packed.numel(), copies,
                                    lambda x, p: torch.ops.edgectl.linear_w4a8(x, p, n, k), dense))
    if "w8a8" in include:
        packed8 = blocks.quantize_and_pack(w, 8)
        copies8 = _copies(packed8.clone, packed8.numel(), footprint)
        for level in levels:
            arms.append(Arm(f"w8a8/{level}", level, packed8.numel(), copies8,
                            lambda x, p: torch.ops.edgectl.linear_w8a8(x, p, n, k)))
    if "w5a8" in include and k % 32 == 0:
        from gguf import (  # gguf-py, llama.cpp's own Python quantizer
            GGMLQuantizationType,
            quants,
        )

        raw = torch.from_numpy(quants.quantize(w.float().numpy(), GGMLQuantizationType.Q5_0))
        packed5 = blocks.pack_w5(*ggml.to_w5(raw, "Q5_0", k))
        copies5 = _copies(packed5.clone, packed5.numel(), footprint)
        for level in levels:
            arms.append(Arm(f"w5a8/{level}", level, packed5.numel(), copies5,
                            lambda x, p: torch.ops.edgectl.linear_w5a8(x, p, n, k)))
    if "torch-int4" in include and n % 16 == 0 and k % 32 == 0:
        q, s, z = groups.quantize_int4(w, 32, torch.bfloat16)
        pk, sz = tinygemm.kernel_pack(q), tinygemm.scales_and_zeros(s, z, torch.bfloat16)
        nbytes = pk.numel() + sz.numel() * 2
        copies_t = _copies(lambda: (pk.clone(), sz.clone()), nbytes, footprint)
        arms.append(Arm("torch-int4", None, nbytes, copies_t,
                        lambda x, p: tinygemm.int4_matmul(x.to(torch.bfloat16), p[0], 32, p[1])))
    if "bf16" in include:
        copies_d = _copies(w.clone, w.numel() * 2, footprint)
        arms.append(Arm("bf16", None, w.numel() * 2, copies_d,
                        lambda x, p: torch.nn.functional.linear(x.to(torch.bfloat16), p)))
    if "fp32" in include:  # a dense fp32 GEMM: what a dequantize-then-GEMM prefill path would call
        wf = w.float()
        copies_f = _copies(wf.clone, wf.numel() * 4, footprint)
        arms.append(Arm("fp32", None, wf.numel() * 4, copies_f,
                        lambda x, p: torch.nn.functional.linear(x.to(torch.float32), p)))
    return arms


def _time_arm(arm: Arm, x: torch.Tensor, calls: int) -> float:
    """Seconds per call: ``calls`` calls, each on the next copy of the weights."""
    from edgectl_runtime.kernels import ops

    ctx = ops.use_level(arm.level) if arm.level else _null()
    dense = ops.dense_from(arm.dense_from) if arm.level else _null()
    with ctx, dense:
        if arm.level:
            assert ops.active_level() == arm.level  # read back, not assumed
        arm.call(x, arm.copies[0])  # warm the code path (not the weights: the next copies are cold)
        t0 = time.perf_counter()
        for i in range(calls):
            arm.call(x, arm.copies[(i + 1) % len(arm.copies)])
        return (time.perf_counter() - t0) / calls


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def run(shapes: list[tuple[str, str, int, int]], ms: list[int], passes: int, levels: list[str] | None,
        act_dtype: torch.dtype, include: set[str], footprint: int, min_calls: int = 8) -> list[dict]:
    """One row per (shape, M, arm); ``shapes`` are (set name, layer, N, K)."""
    from edgectl_runtime.kernels import ops

    ops.load()
    levels = levels or ops.supported_levels()
    rows = []
    for set_name, layer, n, k in shapes:
        arms = _arms(n, k, levels, footprint, include)
        for m in ms:
            samples: dict[str, list[float]] = {a.name: [] for a in arms}
            gen = torch.Generator().manual_seed(m)
            for _ in range(passes):
                x = torch.randn(m, k, generator=gen).to(act_dtype)  # fresh activations every pass
                for arm in arms:
                    samples[arm.name].append(_time_arm(arm, x, max(min_calls, len(arm.copies))))
            for arm in arms:
                t = samples[arm.name]
                med = statistics.median(t)
                rows.append({"shape_set": set_name, "layer": layer, "n": n, "k": k, "m": m, "arm": arm.name,
                             "weight_bytes": arm.weight_bytes, "median_us": round(med * 1e6, 1),
                             "gbps": round(arm.weight_bytes / med / 1e9, 2),
                             "spread_gbps": [round(arm.weight_bytes / max(t) / 1e9, 2),
                                             round(arm.weight_bytes / min(t) / 1e9, 2)],
                             "passes": passes})
        del arms
    return rows


def run_norms(hiddens: list[int], ms: list[int], passes: int, dtype: torch.dtype, calls: int = 200) -> list[dict]:
    """RMSNorm + residual add per call: vLLM's native implementation (eager, several ops),
    edgectl's fused op, and the native one compiled by torch.compile (inductor fuses it)."""
    from vllm import ir

    from edgectl_runtime.kernels import ops

    ops.load()
    native = ir.ops.fused_add_rms_norm.impls["native"].impl_fn
    compiled = torch.compile(native, dynamic=False)
    arms = {"norm-native": native, "norm-compiled": compiled,
            "norm-edgectl": lambda x, r, w, e: torch.ops.edgectl.add_rms_norm(x, r, w, e)}
    rows = []
    for hidden in hiddens:
        for m in ms:
            gen = torch.Generator().manual_seed(hidden + m)
            w = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
            samples: dict[str, list[float]] = {a: [] for a in arms}
            for _ in range(passes):
                x = torch.randn(m, hidden, generator=gen).to(dtype)
                r = torch.randn(m, hidden, generator=gen).to(dtype)
                for name, fn in arms.items():
                    fn(x, r, w, 1e-5)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn(x, r, w, 1e-5)
                    samples[name].append((time.perf_counter() - t0) / calls)
            for name, t in samples.items():
                rows.append({"shape_set": "norm", "layer": f"hidden{hidden}", "n": hidden, "k": hidden, "m": m,
                             "arm": name, "weight_bytes": 0, "median_us": round(statistics.median(t) * 1e6, 2),
                             "gbps": 0.0, "spread_gbps": [0.0, 0.0],
                             "spread_us": [round(min(t) * 1e6, 2), round(max(t) * 1e6, 2)], "passes": passes})
    return rows


def _copy_bandwidth(gbps: float | None) -> dict:
    """The copy bandwidth the rows are compared with: measured by the control plane (``edgectl probe
    --bandwidth --json``, ``bandwidth_gbps``) and given with ``--copy-gbps``; the runtime does
    not measure the host itself."""
    if gbps is None:
        return {"error": "not given (pass --copy-gbps from `edgectl probe --bandwidth --json`)"}
    return {"gbps": round(gbps, 2), "method": "edgectl probe --bandwidth (given with --copy-gbps)"}


def render(result: dict) -> str:
    bw = result["copy_bandwidth"].get("gbps")
    lines = [f"edgectl kernel micro-benchmark: {result['cpu']}, {result['threads']} threads, "
             f"activations {result['activation_dtype']}, {result['passes']} interleaved passes (median [min-max])",
             f"copy bandwidth (edgectl probe --bandwidth, read + write): "
             f"{bw if bw is not None else result['copy_bandwidth'].get('error')} GB/s; weights rotate over "
             f"{result['footprint_bytes'] // MIB} MiB"]
    header = f"{'layer':<22}{'N x K':>14}{'M':>5}  {'arm':<18}{'us':>9}{'GB/s':>8}  {'spread':<13}{'% copy':>7}"
    lines.append(header)
    for r in result["rows"]:
        pct = f"{100 * r['gbps'] / bw:.0f}%" if bw else "-"
        lines.append(f"{r['shape_set'] + '/' + r['layer']:<22}{str(r['n']) + 'x' + str(r['k']):>14}{r['m']:>5}  "
                     f"{r['arm']:<18}{r['median_us']:>9}{r['gbps']:>8}  "
                     f"{str(r['spread_gbps'][0]) + '-' + str(r['spread_gbps'][1]):<13}{pct:>7}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.diagnostics.microbench",
                                description="GB/s of weights moved per layer shape and ISA level.")
    p.add_argument("--shapes", default="smollm2,1b", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--m", type=int, nargs="+", default=[1], help="activation rows (1 = one decoded token)")
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--levels", default=None, help="comma list of ISA levels (default: every level this CPU runs)")
    p.add_argument("--arms", default="w4a8,w8a8,torch-int4,bf16", help="comma list of w4a8, w4a8-dense, w5a8, w8a8, torch-int4, bf16, fp32")
    p.add_argument("--activations", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--footprint-mib", type=int, default=None,
                   help="weights rotated over per arm (default: 2 x last-level cache, at most 1024)")
    p.add_argument("--norms", action="store_true",
                   help="instead: RMSNorm + residual per call (vLLM native, edgectl's op, torch.compile'd native)")
    p.add_argument("--copy-gbps", type=float, default=None,
                   help="the host's copy bandwidth, read + write (bandwidth_gbps of edgectl probe --bandwidth --json), for the %% copy column")
    p.add_argument("--json", action="store_true")
    return p


def _kernels_problem(levels: list[str] | None) -> str | None:
    """Why edgectl's kernels cannot be measured here (the library, or a level this CPU cannot run)."""
    from edgectl_runtime.kernels import ops

    try:
        ops.load()
    except ops.KernelLibraryError as exc:
        return str(exc)
    for level in levels or []:
        if level not in ops.supported_levels():
            return f"this CPU cannot run the {level} kernels (it runs {', '.join(ops.supported_levels())})"
    return None


def _cpu_name() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return cpu


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    unknown = [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown:
        print(f"error: unknown shape set {unknown[0]!r}: use {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    llc = _llc_bytes()
    footprint = (a.footprint_mib * MIB) if a.footprint_mib else min(1024 * MIB, max(64 * MIB, 2 * (llc or 0)))
    levels = a.levels.split(",") if a.levels else None
    problem = _kernels_problem(levels)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if a.activations == "bf16" else torch.float32
    if a.norms:
        rows = run_norms([576, 2048], a.m, a.passes, dtype)
        print(json.dumps({"schema": "edgectl.microbench/1", "activation_dtype": a.activations, "passes": a.passes,
                          "threads": torch.get_num_threads(), "rows": rows}, indent=1))
        return 0
    bandwidth = _copy_bandwidth(a.copy_gbps)
    shapes = [(name, layer, n, k) for name in a.shapes.split(",") for layer, n, k in SHAPES[name]]
    rows = run(shapes, a.m, a.passes, levels, dtype, set(a.arms.split(",")), footprint)
    result = {"schema": "edgectl.microbench/1", "cpu": _cpu_name(), "threads": torch.get_num_threads(),
              "activation_dtype": a.activations, "passes": a.passes, "footprint_bytes": footprint,
              "llc_bytes": llc, "copy_bandwidth": bandwidth, "torch_capability": torch.backends.cpu.get_cpu_capability(),
              "env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "EDGECTL_KERNEL_ISA",
                                                 "OMP_NUM_THREADS") if k in os.environ},
              "rows": rows}
    print(json.dumps(result, indent=1) if a.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
