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


# -- the tokenizer: one load, no construction inputs kept (the plan's ``levers.tokenizer`` = lean) ---
#
# What vLLM 0.32's one-process server holds of a Hugging Face fast tokenizer (read in a Gemma-3
# worker, docs/memory.md "A large vocabulary"): the renderer's tokenizer, which
# ``vllm/tokenizers/hf.py`` (``maybe_make_thread_pool``) deep-copies once per render thread plus
# one; and a second load of the whole tokenizer at the first chat render, when
# ``vllm/renderers/hf.py`` (``_try_get_processor_chat_template``) asks ``AutoProcessor`` for a
# chat template and keeps what it got in ``cached_get_processor``'s cache. For a model directory
# without a processor's files AutoProcessor falls back to the tokenizer, which is no
# ``ProcessorMixin``, so vLLM's answer is None: the second load buys nothing. And transformers'
# BPE tokenizers (``models/gemma/tokenization_gemma.py:78-84``, ``models/llama/...``) keep the
# vocabulary and merges they built the Rust tokenizer from as Python objects (``_vocab``,
# ``_merges``: 262144 strings and 514906 pairs for Gemma-3) that nothing reads after ``__init__``
# but ``save_vocabulary``; every deep copy copies their containers.

# Files whose presence lets AutoProcessor build a processor (and so a processor's chat template).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                   "chat_template.json")
CONSTRUCTION_INPUTS = ("_vocab", "_merges")
_AFTER_INIT_EXEMPT = ("__init__", "save_vocabulary")  # what may read them: building, and saving to disk


def has_processor_files(model_dir: str | None) -> bool:
    """Whether AutoProcessor could find a processor in this directory (not a local one: assume so)."""
    import os

    if not model_dir or not os.path.isdir(model_dir):
        return True
    return any(os.path.exists(os.path.join(model_dir, name)) for name in PROCESSOR_FILES)


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):  # nested functions and comprehensions
            names |= _code_names(const)
    return names


def read_after_init(cls: type, name: str) -> bool:
    """Whether any method of ``cls`` (its MRO) but ``__init__`` and ``save_vocabulary`` names ``name``."""
    for klass in cls.__mro__:
        for attr, member in vars(klass).items():
            if attr in _AFTER_INIT_EXEMPT:
                continue
            for fn in (member, getattr(member, "__func__", None), getattr(member, "fget", None)):
                code = getattr(fn, "__code__", None)
                if code is not None and name in _code_names(code):
                    return True
    return False


def release_construction_inputs(tokenizer) -> list[str]:
    """Drop a Rust-backed tokenizer's construction inputs that its class never reads again; the names dropped."""
    held = vars(tokenizer) if hasattr(tokenizer, "__dict__") else {}
    if held.get("_tokenizer") is None:  # not a fast (Rust-backed) tokenizer: nothing was built from them
        return []
    released = []
    for name in CONSTRUCTION_INPUTS:
        if name in held and not read_after_init(type(tokenizer), name):
            del held[name]
            released.append(name)
    return released


def share_tokenizer() -> None:
    """Install the lean tokenizer in vLLM's modules (before the engine loads the tokenizer)."""
    import vllm.renderers.hf as hf_renderer
    import vllm.tokenizers.hf as hf_tokenizers

    probe = hf_renderer._try_get_processor_chat_template
    if getattr(probe, "edgectl_lean", False):
        return

    no_processor: dict[str, bool] = {}  # asked at every chat render: look at each directory once

    def processor_chat_template(tokenizer, **kwargs):
        name = getattr(tokenizer, "name_or_path", None)
        if name not in no_processor:
            no_processor[name] = not has_processor_files(name)
        if no_processor[name]:
            return None  # what vLLM concludes for such a directory, without loading the tokenizer again
        return probe(tokenizer, **kwargs)

    cache = hf_tokenizers.get_cached_tokenizer

    def cached_tokenizer(tokenizer):
        release_construction_inputs(tokenizer)
        return cache(tokenizer)

    processor_chat_template.edgectl_lean = True
    hf_renderer._try_get_processor_chat_template = processor_chat_template
    hf_tokenizers.get_cached_tokenizer = cached_tokenizer


def tokenizer_state(engine_client=None) -> dict:
    """Read-back: whether the lean tokenizer is installed, which construction inputs the served
    tokenizer still holds (and which its class reads after ``__init__``), and whether vLLM loaded
    a processor (the second load; it happens at the first chat render, the warm-up)."""
    out: dict = {"lean": False, "processor_loaded": None, "construction_inputs": None}
    hf_renderer = sys.modules.get("vllm.renderers.hf")
    if hf_renderer is not None:
        out["lean"] = bool(getattr(hf_renderer._try_get_processor_chat_template, "edgectl_lean", False))
    processor = sys.modules.get("vllm.transformers_utils.processor")
    cached = getattr(processor, "cached_get_processor", None)
    if cached is not None and hasattr(cached, "cache_info"):
        out["processor_loaded"] = cached.cache_info().currsize > 0
    tokenizer = None
    try:
        tokenizer = engine_client.renderer.get_tokenizer() if engine_client is not None else None
    except Exception:  # no renderer, or a model served without a tokenizer
        tokenizer = None
    if tokenizer is not None and hasattr(tokenizer, "__dict__"):
        held = [n for n in CONSTRUCTION_INPUTS if n in vars(tokenizer)]
        out["construction_inputs"] = {"held": held,
                                      "read_after_init": [n for n in held if read_after_init(type(tokenizer), n)]}
    return out
