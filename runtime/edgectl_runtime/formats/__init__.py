"""Weight layouts and converters: pure arithmetic on tensors, no kernel calls, no vLLM.

- :mod:`.blocks`  — edgectl's own formats, blocks of 32 along K: W4 (GGUF Q4_1 arithmetic,
  ``w = d * q + m``) and W8 (GGUF Q8_0, ``w = d * q``), quantized, packed into the tiled records
  the op library reads (``ops/csrc/kernels.h``), and unpacked again.
- :mod:`.groups`  — group-wise asymmetric int4 ``w = (q - 8) * scale + zero`` (PyTorch's int4
  kernel's arithmetic, and the portable checkpoint's), and its nibble packing.
- :mod:`.gptq_awq` — GPTQ / AWQ 4-bit checkpoints converted to the group-wise form.
"""
