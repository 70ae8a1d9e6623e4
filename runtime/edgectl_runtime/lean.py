"""Keeping out of the worker what a CPU text-only server never runs (the plan's
``levers.optional_imports`` = skip; the worker applies it before it imports vLLM).

Only packages that vLLM (or transformers) already treat as optional are kept out, by the
interpreter's own mechanism: ``sys.modules[name] = None`` makes ``import name`` raise
ModuleNotFoundError and ``importlib.util.find_spec(name)`` return None, exactly as if the
package were not installed. Each one's fallback is vLLM's or transformers' own code path:

- ``opentelemetry`` (and the grpc/protobuf exporters it pulls in): request tracing
  (``--otlp-traces-endpoint``), which edgectl does not expose. vLLM 0.32
  ``vllm/tracing/otel.py:18-45`` imports it in ``try/except ImportError`` and reports tracing
  as unavailable.
- ``cv2`` (OpenCV): video decoding for multimodal models. ``vllm/multimodal/video.py:22-25``
  replaces it with a ``PlaceholderModule`` when it is missing.
- ``accelerate``: transformers' big-model loading helpers; vLLM loads weights itself.
  transformers asks ``is_accelerate_available()`` (``transformers/utils/import_utils.py``) and
  skips it when the answer is no.

Measured on the import of ``vllm.entrypoints.openai.api_server`` alone (RssAnon / RssFile of a
fresh interpreter, x86_64-amx): 387 / 125 MiB with them, 374 / 106 MiB without.
"""

from __future__ import annotations

import sys

OPTIONAL_IMPORTS = ("opentelemetry", "cv2", "accelerate")


def skip_optional_imports(modules: dict | None = None) -> list[str]:
    """Mark the optional packages as absent (before vLLM is imported); the names marked."""
    modules = sys.modules if modules is None else modules
    done = []
    for name in OPTIONAL_IMPORTS:
        if modules.get(name, None) is None:  # already imported: too late to keep it out
            modules[name] = None
            done.append(name)
    return done


def optional_imports_state(modules: dict | None = None) -> dict[str, str]:
    """Read-back, per optional package: ``kept out`` (marked absent), ``loaded``, or ``not imported``."""
    modules = sys.modules if modules is None else modules
    return {name: ("not imported" if name not in modules else "kept out" if modules[name] is None else "loaded")
            for name in OPTIONAL_IMPORTS}
