"""Keeping out of the worker what a CPU text-only server never runs.

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

import os
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


# -- settings that must be in place when the interpreter starts -------------------------------------

ALLOCATORS = {
    # Debian packages installed by scripts/setup.sh
    "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "tcmalloc": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
}
REEXEC_MARK = "EDGECTL_WORKER_REEXEC"


def mapped_libraries(maps_path: str = "/proc/self/maps") -> set[str]:
    try:
        with open(maps_path) as f:
            return {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return set()


def allocator_in_effect(name: str, maps_path: str = "/proc/self/maps") -> bool:
    """Read-back: ``glibc`` when no replacement is mapped, else the named library is mapped."""
    libs = mapped_libraries(maps_path)
    found = {n for n, path in ALLOCATORS.items()
             if any(os.path.basename(lib).startswith(os.path.basename(path).split(".so")[0]) for lib in libs)}
    return found == ({name} if name != "glibc" else set())


def startup_environment(allocator: str, python_optimize: int, environ: dict[str, str]) -> dict[str, str] | None:
    """The environment to re-execute the worker with, or None when the settings are in effect.

    An allocator must be preloaded before the interpreter allocates anything, and Python's
    optimization level is fixed when it starts: both need a fresh exec of the worker."""
    import sys

    want_preload = ALLOCATORS.get(allocator)
    ok = allocator_in_effect(allocator) and sys.flags.optimize == python_optimize
    if ok:
        return None
    env = dict(environ)
    preload = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
               if p and not any(os.path.basename(p).startswith(n) for n in ("libjemalloc", "libtcmalloc"))]
    if want_preload:
        preload.insert(0, want_preload)
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    if python_optimize:
        env["PYTHONOPTIMIZE"] = str(python_optimize)
    else:
        env.pop("PYTHONOPTIMIZE", None)
    return env


def set_arena_max(n: int) -> bool:
    """glibc ``mallopt(M_ARENA_MAX, n)``: at most ``n`` malloc arenas from now on (the main
    arena counts). Effective for threads that have not allocated yet: call it before vLLM
    starts its threads. False where the C library is not glibc."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt(-8, int(n)))  # M_ARENA_MAX (malloc/malloc.h)
    except (OSError, AttributeError):
        return False
