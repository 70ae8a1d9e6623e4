"""edgectl's CPU kernels: its compiled library and the other int4 ops (``ops``), and the vLLM
quantization method that puts linear layers on them (``cpu_int4``)."""
