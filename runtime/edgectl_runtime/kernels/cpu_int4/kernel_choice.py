"""Which kernel serves a layer, chosen once: by the setting (``EDGECTL_INT4_KERNEL``) for linear
layers, by the LM head's format for the head and a tied embedding, then by the layer's shape
(a kernel that cannot run it hands it to its fallback, and the read-back says why)."""

from __future__ import annotations

from edgectl_runtime.kernels.cpu_int4.kernel import Int4Kernel
from edgectl_runtime.kernels.cpu_int4.kernel_edgectl import EdgectlBlocksKernel
from edgectl_runtime.kernels.cpu_int4.kernel_torch import TorchInt4Kernel
from edgectl_runtime.kernels.cpu_int4.kernel_vllm import VllmWna16Kernel

KERNEL_CLASSES: dict[str, type[Int4Kernel]] = {
    cls.name: cls for cls in (TorchInt4Kernel, VllmWna16Kernel, EdgectlBlocksKernel)}
KERNELS = tuple(KERNEL_CLASSES)  # the setting's values
W8_KERNEL = EdgectlBlocksKernel  # the only kernel with an 8-bit format (GGUF Q8_0 blocks)


def kernel_class(name: str) -> type[Int4Kernel]:
    """The kernel a setting names (``KeyError`` for an unknown one: the config validates it)."""
    return KERNEL_CLASSES[name]


def head_kernel(linear: type[Int4Kernel], lm_head: str) -> type[Int4Kernel]:
    """The kernel of a quantized LM head / tied embedding: edgectl's for int8 (its W8 is the only
    8-bit format), the linear kernel's lookup partner for int4 (vLLM's has no lookup)."""
    return W8_KERNEL if lm_head == "int8" else linear.lookup_kernel()


def fit_kernel(kernel: type[Int4Kernel], n: int, k: int) -> tuple[type[Int4Kernel], str]:
    """The kernel that runs a ``[n, k]`` layer, starting from ``kernel``, and the note the
    layer's read-back reason gets when it is another (``""`` otherwise)."""
    ok, why = kernel.can_implement(n, k)
    if ok:
        return kernel, ""
    fallback = kernel.fallback()
    return fallback, f"; {fallback.name} kernel ({why})"


def format_name(kernel: str, bits: int, group: int) -> str:
    """The read-back name of a layer's format (the plan's weight formats, by kernel)."""
    return kernel_class(kernel).format_name(bits, group)
