"""Offline tools the control plane starts (``edgectl/contract/launch.py``): the GGUF converter,
the synthetic model maker, the int4 quantizer, the kernel diagnostics, the speech bench's
anchors (faster-whisper and whisper.cpp on a clip set, and the ggml file whisper.cpp reads), and the
vision tower's agreement check (vLLM's bf16 tower and connector against transformers' float32)."""
