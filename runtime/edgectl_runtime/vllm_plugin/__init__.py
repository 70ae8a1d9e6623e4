"""edgectl's vLLM plugin (entry point ``vllm.general_plugins``: ``edgectl_cpu_int4``) and the
patches it installs into vLLM, one module each (this package).

vLLM calls :func:`register` once in every process it starts (front end, EngineCore, each
worker: ``vllm/plugins/__init__.py`` ``load_general_plugins``), before any model exists. It

- registers the ``cpu_int4`` quantization method (importing ``edgectl_runtime.kernels.cpu_int4``
  registers it; the config object is pickled to the children, so the class must be importable
  everywhere, which the entry point guarantees);
- registers the ``edgectl_gguf`` load format (``gguf_loader.py``: a model straight from a GGUF);
- registers, lazily (imported only by a server that names them), edgectl's two Whisper
  architectures (``whisper_exact_top.py``: the best logits of each step in float32;
  ``whisper_english.py``: tiny.en prompted without a language and a task);
- registers edgectl's fused RMSNorm as provider ``edgectl`` of vLLM's norm IR ops
  (``fused_norm.py``), used only by a server whose ``ir_op_priority`` names it;
- calls vLLM's attention ops with less Python if ``EDGECTL_LEAN_ATTENTION=1`` (``lean_attention.py``;
  the same ops with the same arguments; off by default for the same reason as the RoPE cap below);
- puts decode steps on edgectl's attention kernel if ``EDGECTL_DECODE_ATTENTION=1``
  (``decode_attention.py``; off by default for the same reason as the RoPE cap below);
- has a vision tower encode an image's tiles a few at a time if ``EDGECTL_TOWER_TILES`` is above 0
  (``tower_tiles.py``; off by default, for the same reason);
- installs the RoPE cap if ``EDGECTL_ROPE_CAP=1`` (off by default: the plugin is loaded by
  every vLLM process in the venv, including a benchmark's unmodified "stock" arm);
- asks Linux for permission to use AMX tiles where the CPU has them (:func:`request_amx`);
- adds edgectl's settings to vLLM's compile-cache key and records whether the compiled graph
  was loaded or compiled; with ``EDGECTL_COMPILE_CACHE=1`` makes the saved graph load
  (``edgectl_runtime/vllm_plugin/compile_cache.py``).

``VLLM_PLUGINS`` (a comma list of entry-point names) can exclude it entirely.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("edgectl.plugin")


def register() -> None:
    """Called once per vLLM process."""
    from edgectl_runtime.kernels import cpu_int4  # registers the quantization method
    from edgectl_runtime.vllm_plugin import (  # noqa: F401 (gguf_loader registers)
        decode_attention,
        fused_norm,
        gguf_loader,
        lean_attention,
        rope,
        tower_tiles,
    )

    register_whisper()
    request_amx()
    capped = rope.install(os.environ)
    lean = lean_attention.install(os.environ)  # before decode_attention, which wraps the methods it replaces
    attention = decode_attention.install(os.environ)
    tiles = tower_tiles.install(os.environ)
    norms = fused_norm.register()
    from edgectl_runtime.vllm_plugin import compile_cache, embedding

    compile_cache.install(os.environ)
    pack = embedding.install(os.environ)
    logger.debug("edgectl plugin: %s registered, norms %s, RoPE cap %s, embedding pack %s, attention calls %s, "
                 "decode attention %s, tower tiles a batch %s", cpu_int4.NAME, norms or "unavailable",
                 "on" if capped else "off", pack, "lean" if lean else "vllm", "edgectl" if attention else "vllm",
                 tiles or "all")


def register_whisper() -> None:
    """edgectl's Whisper classes under their architecture names, as ``module:Class`` strings
    (``ModelRegistry.register_model``, vllm/model_executor/models/registry.py): nothing is imported
    until a server names one (the registry is already loaded by the loader registered above)."""
    from vllm.model_executor.models.registry import ModelRegistry

    from edgectl.contract.whisper_names import ARCHITECTURE, ENGLISH_ONLY_ARCHITECTURE

    ModelRegistry.register_model(ARCHITECTURE, "edgectl_runtime.vllm_plugin.whisper_exact_top:"
                                               "WhisperExactTopForConditionalGeneration")
    ModelRegistry.register_model(ENGLISH_ONLY_ARCHITECTURE, "edgectl_runtime.vllm_plugin.whisper_english:"
                                                            "WhisperEnglishOnlyForConditionalGeneration")


def request_amx() -> bool | None:
    """Ask the kernel for AMX tile data in this process, where the CPU has AMX.

    Linux enables AMX per process, on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``, kernel ``Documentation/arch/x86/xstate.rst``); the first AMX
    instruction of a process that did not ask dies of SIGILL. vLLM 0.32 picks its AMX attention
    kernel from ``torch.cpu._is_amx_tile_supported()`` alone (``v1/attention/backends/cpu_attn.py:
    533-545``) and never asks: it works only when something else asked first (oneDNN does, when
    a bf16 linear layer goes through it). With every linear layer on edgectl's int4 kernels,
    nothing else asks, and the first forward pass dies (seen on a Xeon with AMX;
    ``tests/test_plugin_amx.py``).
    ``torch.cpu._init_amx()`` makes the request. Returns whether it was granted, or None where the
    CPU has no AMX.
    """
    import torch

    if not torch.cpu._is_amx_tile_supported():
        return None
    granted = bool(torch.cpu._init_amx())
    if not granted:
        logger.warning("edgectl plugin: the kernel refused AMX tile data to this process; "
                       "vLLM's AMX attention would fail")
    return granted
