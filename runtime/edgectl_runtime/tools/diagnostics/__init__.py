"""Diagnostics of the int4/int8 stack, apart from the kernels, the layouts and the vLLM method:

- ``python -m edgectl_runtime.tools.diagnostics.report``: which kernels this process can run (edgectl's
  own library and its ISA level, PyTorch's int4 op, vLLM's C library and its int4 ops), as JSON;
- ``python -m edgectl_runtime.tools.diagnostics.microbench``: GB/s of weights moved per layer shape and
  ISA level, next to the copy bandwidth ``edgectl probe --bandwidth`` measures.
"""
