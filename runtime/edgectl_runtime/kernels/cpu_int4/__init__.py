"""``cpu_int4``: edgectl's vLLM quantization method for 4-bit (and 8-bit) weights on any CPU.

Layers of this package, each apart from the others (imports go down this list):

- :mod:`.names` — the method's name and the attributes a quantized layer carries;
- :mod:`.checkpoint` — the 4-bit tensors a GPTQ / AWQ / portable checkpoint stores;
- :mod:`.kernel` — the interface of one kernel; :mod:`.kernel_torch`, :mod:`.kernel_vllm`,
  :mod:`.kernel_edgectl` — one class per kernel; :mod:`.kernel_choice` — which serves a layer;
- :mod:`.config` — the settings (kernel, LM head format, group size, source) and where they come
  from;
- :mod:`.method` — one layer's weights inside vLLM: created, loaded (layer-wise, low peak),
  packed by its kernel, multiplied, looked up;
- :mod:`.registration` — registers the method with vLLM (``register_quantization_config``): the
  config class whose ``get_quant_method`` hands each layer its method.

The kernels live in :mod:`edgectl_runtime.kernels.ops` (edgectl's own library, PyTorch's and vLLM's int4
ops), the arithmetic of the formats in :mod:`edgectl_runtime.formats`, the diagnostics in
:mod:`edgectl_runtime.tools.diagnostics`.
"""

from edgectl_runtime.kernels.cpu_int4.config import LM_HEAD_FORMATS  # noqa: F401
from edgectl_runtime.kernels.cpu_int4.kernel_choice import KERNELS, format_name  # noqa: F401
from edgectl_runtime.kernels.cpu_int4.method import (  # noqa: F401
    CpuInt4LinearMethod,
    dequantized_weight,
    unpack_layer,
)
from edgectl_runtime.kernels.cpu_int4.names import (  # noqa: F401
    INFO_ATTR,
    LAYOUT_ATTR,
    NAME,
    S_ATTR,
    SZ_ATTR,
    W_ATTR,
    Z_ATTR,
)
from edgectl_runtime.kernels.cpu_int4.registration import CpuInt4Config  # noqa: F401
