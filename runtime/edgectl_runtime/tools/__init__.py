"""Offline tools the control plane starts (``edgectl/contract/launch.py``): the GGUF converter,
the synthetic model maker, the int4 quantizer, and the kernel diagnostics."""
