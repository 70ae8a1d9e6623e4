"""edgectl's CPU kernel library: PyTorch custom ops ``torch.ops.edgectl.*`` (C++ in ``csrc/``).

:func:`load` loads ``_edgectl_kernels.so`` (built by ``build.py``, which ``scripts/setup.sh``
runs), registers the fake implementations that let ``torch.compile`` keep every op as one
opaque call, and selects the ISA level: ``EDGECTL_KERNEL_ISA`` (``auto`` = the best level the
CPU and the OS support, at most the one PyTorch's ``ATEN_CPU_CAPABILITY`` allows, so that one
variable keeps the whole process off AVX-512; ``scalar``, ``avx2``, ``avxvnni`` or ``avx512vnni`` to
force one — refused with the levels this machine can run if it cannot run the one asked).

Ops (all functional; ``n``/``k`` are the real sizes of the weight, the packed tensor's shape
follows from them, see ``formats/blocks.py``):

- ``linear_w4a8(x, w, n, k) -> y``: ``x [..., k]`` (fp32/bf16/fp16) times a packed W4 weight;
  ``y [..., n]`` in x's dtype. Below ``dense_from_m`` rows of x (decode), activations are
  quantized to int8 per block of 32 inside the call and multiplied with integer dot products;
  from there on (prefill), the weight is dequantized a chunk of rows at a time and multiplied by
  PyTorch's dense GEMM (no activation quantization: W4A16 arithmetic, the faster one at those
  sizes; the crossover per ISA level is measured, docs/kernels.md).
- ``linear_w8a8(x, w, n, k) -> y``: the same with a packed W8 weight; ``linear_w5a8`` with a packed
  W5 weight (a GGUF's Q5_0 or Q4_0 blocks as they are).
- ``dequantize(w, n, k, bits, dtype) -> W``: the whole matrix, dequantized.
- ``set_dense_from_m(m) -> previous``: the crossover (-1 = the level's measured default, 0 = never).
- ``dense_rows(m) -> rows``: the row count the dense path runs its GEMM with for ``m`` rows (``m``
  rounded up to one of four sizes per octave, so oneDNN compiles a bounded set of shapes).
- ``embedding_w4 / embedding_w8(ids, w, n, k, dtype) -> rows``: rows of a packed matrix,
  dequantized (the tied embedding of an int8 / int4 LM head, stored once).
- ``add_rms_norm(x, residual, weight, eps) -> (normed, x + residual)`` and
  ``rms_norm(x, weight, eps) -> normed``: vLLM's fused_add_rms_norm / rms_norm in one pass.
- ``quantize_activations(x) -> (q, d, s)``: the activation quantizer alone (for tests).
- ``kernel_isa()``, ``supported_isas()``, ``set_kernel_isa(level)``.

:mod:`.reference` holds the same semantics in plain PyTorch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

LIBRARY = Path(__file__).with_name("_edgectl_kernels.so")
STAMP = Path(__file__).with_name("_edgectl_kernels.json")
LEVELS = ("scalar", "avx2", "avxvnni", "avx512vnni")  # lowest to highest
BUILD_COMMAND = "python -m edgectl_runtime.kernels.ops.build (scripts/setup.sh runs it)"


class KernelLibraryError(RuntimeError):
    """The library is missing, stale, or cannot run the level asked for."""


# PyTorch's ATEN_CPU_CAPABILITY (aten/src/ATen/native/DispatchStub.cpp) -> the highest level of ours
# it allows; values it does not know for x86 (e.g. zvector) set no ceiling. ATen has no capability
# between AVX2 and AVX-512: a CPU with AVX-VNNI and no AVX-512 (an N100) runs ATen at AVX2, and its
# AVX-VNNI is no AVX-512 instruction, so the AVX2 ceiling allows it.
ATEN_CEILING = {"default": "scalar", "avx2": "avxvnni", "avx512": "avx512vnni"}


def choose_level(requested: str, supported: list[str], aten_capability: str | None = None) -> str:
    """The level to run for ``EDGECTL_KERNEL_ISA=requested`` on a machine that supports
    ``supported`` (what the library's cpuid/XCR0 check reports); ``auto`` stays at or below the
    level ``ATEN_CPU_CAPABILITY=aten_capability`` allows PyTorch."""
    if requested == "auto":
        ceiling = ATEN_CEILING.get((aten_capability or "").strip().lower())
        allowed = [lv for lv in supported if ceiling is None or LEVELS.index(lv) <= LEVELS.index(ceiling)]
        return max(allowed or supported, key=LEVELS.index)
    if requested not in LEVELS:
        raise KernelLibraryError(f"EDGECTL_KERNEL_ISA={requested!r} is not a level: use auto, {', '.join(LEVELS)}")
    if requested not in supported:
        raise KernelLibraryError(f"EDGECTL_KERNEL_ISA={requested} asks for kernels this CPU cannot run: its cpuid "
                                 f"and XCR0 allow {', '.join(supported)} (use one of those, or auto)")
    return requested


def _check_stamp() -> None:
    if not LIBRARY.is_file():
        raise KernelLibraryError(f"edgectl's kernel library is not built ({LIBRARY} is missing): run {BUILD_COMMAND}")
    try:
        from edgectl_runtime.kernels.ops.build import source_hash

        stamp = json.loads(STAMP.read_text())
        fresh = stamp.get("sources_sha256") == source_hash()
    except (OSError, ValueError):
        fresh = False
    if not fresh:
        raise KernelLibraryError(f"edgectl's kernel library {LIBRARY} was built from other sources than the ones "
                                 f"beside it: run {BUILD_COMMAND}")


@functools.cache
def _loaded() -> None:
    import torch

    _check_stamp()
    torch.ops.load_library(str(LIBRARY))
    _register_fakes()


def load(environ: Mapping[str, str] | None = None) -> str:
    """Load the library (once per process) and select the level ``EDGECTL_KERNEL_ISA`` asks for;
    returns the active level. Raises :class:`KernelLibraryError` with the fix."""
    import torch

    from edgectl.contract import environment as runtime_env

    _loaded()
    environ = os.environ if environ is None else environ
    requested = runtime_env.read("EDGECTL_KERNEL_ISA", environ)
    level = choose_level(requested, list(torch.ops.edgectl.supported_isas()), environ.get("ATEN_CPU_CAPABILITY"))
    return str(torch.ops.edgectl.set_kernel_isa(level))


def available() -> tuple[bool, str]:
    """Whether the library loads here, and why not (for the kernel report and the plugin)."""
    try:
        _loaded()
    except (KernelLibraryError, OSError, RuntimeError) as exc:
        return False, str(exc).splitlines()[0]
    return True, "loaded"


def active_level() -> str:
    import torch

    _loaded()
    return str(torch.ops.edgectl.kernel_isa())


def supported_levels() -> list[str]:
    import torch

    _loaded()
    return list(torch.ops.edgectl.supported_isas())


@contextlib.contextmanager
def dense_from(m: int) -> Iterator[int]:
    """Use the dense-GEMM path from ``m`` activation rows on inside the block (0: never), then
    restore the level's default (tests and the micro-benchmark measure each path)."""
    import torch

    _loaded()
    torch.ops.edgectl.set_dense_from_m(m)
    try:
        yield m
    finally:
        torch.ops.edgectl.set_dense_from_m(-1)


@contextlib.contextmanager
def use_level(level: str) -> Iterator[str]:
    """Run the ops at ``level`` inside the block (tests, the micro-benchmark), then restore."""
    import torch

    _loaded()
    before = active_level()
    torch.ops.edgectl.set_kernel_isa(choose_level(level, supported_levels()))
    try:
        yield level
    finally:
        torch.ops.edgectl.set_kernel_isa(before)


def _register_fakes() -> None:
    """Shapes and dtypes without computing: what torch.compile traces instead of the op."""
    import torch

    def out_shape(x: torch.Tensor, n: int) -> tuple[int, ...]:
        return (*x.shape[:-1], n)

    @torch.library.register_fake("edgectl::linear_w4a8")
    def _linear_w4a8(x, w, n, k):
        return x.new_empty(out_shape(x, n))

    @torch.library.register_fake("edgectl::linear_w5a8")
    def _linear_w5a8(x, w, n, k):
        return x.new_empty(out_shape(x, n))

    @torch.library.register_fake("edgectl::linear_w8a8")
    def _linear_w8a8(x, w, n, k):
        return x.new_empty(out_shape(x, n))

    @torch.library.register_fake("edgectl::embedding_w4")
    def _embedding_w4(ids, w, n, k, dtype):
        return w.new_empty((*ids.shape, k), dtype=dtype)

    @torch.library.register_fake("edgectl::embedding_w8")
    def _embedding_w8(ids, w, n, k, dtype):
        return w.new_empty((*ids.shape, k), dtype=dtype)

    @torch.library.register_fake("edgectl::add_rms_norm")
    def _add_rms_norm(x, residual, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format), \
            torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("edgectl::rms_norm")
    def _rms_norm(x, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("edgectl::dequantize")
    def _dequantize(w, n, k, bits, dtype):
        return w.new_empty((n, k), dtype=dtype)

    @torch.library.register_fake("edgectl::quantize_activations")
    def _quantize_activations(x):
        k = x.shape[-1]
        m = x.numel() // k
        kb = -(-k // 32)
        return (x.new_empty((m, kb, 32), dtype=torch.int8), x.new_empty((m, kb), dtype=torch.float32),
                x.new_empty((m, kb), dtype=torch.float32))
