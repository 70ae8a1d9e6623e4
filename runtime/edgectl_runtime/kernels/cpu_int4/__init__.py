"""``cpu_int4``: edgectl's vLLM quantization method for 4-bit (and 8-bit) weights on any CPU.

Layers of this package, each apart from the others:

- :mod:`.config` — the settings (kernel, LM head format, group size, source) and where they come
  from; registers the method with vLLM (``register_quantization_config``);
- :mod:`.method` — one layer's weights inside vLLM: created, loaded (layer-wise, low peak),
  packed for the chosen kernel, multiplied, looked up.

The kernels live in :mod:`edgectl_runtime.kernels.ops` (edgectl's own library, PyTorch's and vLLM's int4
ops), the arithmetic of the formats in :mod:`edgectl_runtime.formats`, the diagnostics in
:mod:`edgectl_runtime.tools.diagnostics`.
"""

from edgectl_runtime.kernels.cpu_int4.config import KERNELS, LM_HEAD_FORMATS, NAME, CpuInt4Config  # noqa: F401
from edgectl_runtime.kernels.cpu_int4.method import (  # noqa: F401
    INFO_ATTR,
    LAYOUT_ATTR,
    S_ATTR,
    SZ_ATTR,
    W_ATTR,
    Z_ATTR,
    CpuInt4LinearMethod,
    dequantized_weight,
    format_name,
    unpack_layer,
)
