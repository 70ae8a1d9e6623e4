"""edgectl's data plane: the worker that runs inside the service, and the vLLM plugin.

This is the only package that imports torch and vLLM. It is installed with the ``runtime`` extra;
the control plane starts its programs through ``edgectl/launch.py`` only. Its packages, by what
each is:

- ``vllm_plugin``: the plugin vLLM loads in every process, and the patches it installs;
- ``service``: the worker a unit (or ``edgectl serve``) starts with a plan file;
- ``kernels``: edgectl's CPU kernels and the quantization method that uses them;
- ``formats``: the arithmetic of the weight formats (GGUF blocks, int4 groups, GPTQ/AWQ);
- ``introspect``: what a live worker holds (memory attribution, a tokenizer's cost);
- ``tools``: offline programs (the GGUF converter, the synthetic model maker, the quantizer,
  the kernel diagnostics).
"""
