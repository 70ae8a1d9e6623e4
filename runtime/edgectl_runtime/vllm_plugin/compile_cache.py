"""vLLM's compiled mode, started from its cache: the load fix, edgectl's part of the key, read-back.

**What vLLM 0.32 does wrong.** With ``--compilation default`` on CPU,
``CpuPlatform.check_and_update_config`` (``vllm/platforms/cpu.py:356-377``) turns ``VLLM_COMPILE``
into ``DYNAMO_TRACE_ONCE`` with the backend *string* ``"inductor"``; ``CompilationConfig.init_backend``
returns that string as is (``config/compilation.py:1117-1118``), so ``TorchCompileWithNoGuardsWrapper``
(``compilation/wrapper.py:164``) calls ``torch.compile(backend="inductor")``. torch's
``aot_compile_fullgraph`` (``torch/_dynamo/aot_compile.py:399-415``) wraps what inductor returns in a
``BundledAOTAutogradSerializableCallable``, and vLLM saves it (``decorators.py:740``). On the next
start ``_try_load_aot_compiled_fn`` (``decorators.py:285-341``) loads it fine, verifies the sources,
then calls ``loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`` (``decorators.py:315``),
a method only vLLM's own ``VllmSerializableFunction`` (``compilation/caching.py:382``, the
``VLLM_COMPILE`` backend) has. The bundled callable forwards unknown attributes to the plain function
it wraps (``torch/_dynamo/aot_compile_types.py:158-159``), which raises ``AttributeError: 'function'
object has no attribute 'finalize_loading'``; the ``except Exception`` at ``decorators.py:325-341``
logs only ``str(e)`` ("Compiling model again due to a load failure ... reason: ...") and compiles
from scratch, at every start, in every topology. (``VLLM_FORCE_AOT_LOAD=1`` makes vLLM raise it.)

**The fix** (:func:`install_load_fix`): the bundled callable gets a ``finalize_loading`` that does
nothing. That is what it needs: its deserializer already returned the loaded inductor graph; nothing
is deferred. Only installed where the class has no such method, so a torch or vLLM that fixes this
itself is left alone.

**The key.** vLLM's key (``caching.py`` ``aot_compile_hash_factors``: its own environment variables,
``VllmConfig.compute_hash``, inductor's factors) covers the model's config, the context, the batch
shapes and vLLM's version, but not what edgectl's plugin reads from its environment (int4 group size,
kernel, LM-head format, RoPE cap, ...): ``compute_hash`` skips the quantization config ("captured by
model_config.quantization", ``config/vllm.py:530-531``: the method's *name*). Nor edgectl's own code,
nor the CPU capability the kernels were generated for. vLLM loads with its guards off
(``disable_guard_check``, ``decorators.py:311``), so a graph traced for other weight shapes would run
on the wrong tensors. :func:`key_factors` adds all of these, computed in the process that builds the
graph from the environment that process's plugin reads; :func:`install_key` appends them to vLLM's.

**Inductor's ISA probe, once per machine** (:func:`apply_isa_record`, :func:`record_isa_probe`).
Loading a cached graph still builds the command line of its C++ kernels, and for that inductor
asks which vector ISAs work (``torch/_inductor/cpu_vec_isa.py``, ``valid_vec_isa_list``): for
every ISA the CPU flags allow (AMX, AVX-512 VNNI, AVX-512 and AVX2 here) it compiles a test
file and starts a Python subprocess to ``dlopen`` it, 1.5 s of a 15 s warm start on the
development box. The answer depends on the CPU, the compiler and torch only. The first start
records it beside vLLM's cache; a later start whose CPU, compiler and torch match, and where
every ISA passed, sets inductor's own switch for it (``config.cpp.vec_isa_ok``, the
``TORCHINDUCTOR_VEC_ISA_OK`` setting) instead of probing again: the same ISAs, so the same
kernels. Where one failed, the switch cannot say which, and the probe runs as before.

**Inductor's precompiled header** (:func:`install_header_dir`). Every load of a cached graph
asks for the precompiled header its C++ kernels were built with, and builds it when it is missing
(``torch/_inductor/codecache.py``, ``_precompile_header``: a 149 MB ``.gch``, 6–8 s on the
development box). Inductor keeps it in ``tempfile.gettempdir()`` whatever
``TORCHINDUCTOR_CACHE_DIR`` says ("these headers need to be global"); a unit with
``PrivateTmp=yes`` gets an empty /tmp at every start, so every restart built it again. Where the
inductor cache directory is set (the unit, the bench), the header goes there, beside the rest;
its name carries the compiler's version and the preprocessed header's hash, as before.

**Read-back** (:func:`facts`): whether this process's graph was loaded from the cache or compiled,
how long that took, and why a load failed (the traceback goes to the log too: vLLM logs only
``str(e)``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgectl.contract.environment import ISA_CAPS

log = logging.getLogger("edgectl.compile")

# Runtime levers that change no graph: toggling them must not cost a compile (the vision tower's batches:
# vLLM compiles no multimodal encoder unless compile_mm_encoder is on, which no plan sets).
_NOT_IN_KEY = frozenset({"EDGECTL_COMPILE_CACHE", "EDGECTL_TOWER_TILES"})
# The variables that change the code inductor and the kernels generate (the ISA caps).
_ISA_ENV = ISA_CAPS

# What happened in this process (one compiled model per process here: the backbone).
_state: dict[str, Any] = {"source": None, "artifact": None, "load_s": None, "compile_s": None,
                          "load_failure": None, "key": None, "compile_started_monotonic": None,
                          "vec_isa": None}
_installed = False
# Called as listener(event, state) on "loading", "loaded", "compiling", "compiled" (the worker
# turns them into its phase and systemd STATUS=; only where the model lives in this process).
listeners: list = []


def _emit(event: str) -> None:
    for listener in list(listeners):
        try:
            listener(event, dict(_state))
        except Exception:  # a status line must never break the engine
            log.exception("compile listener failed")


# -- the key ------------------------------------------------------------------------------------------

def _runtime_sources_digest() -> str:
    """One digest of edgectl's runtime code (Python and any compiled kernel library).

    A development checkout keeps its version number across commits; code that lays out the weights
    differently changes the graph's input shapes without changing a traced source vLLM checks.
    """
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".so") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def graph_wrapper() -> str:
    """The language of this process's compiled graph's wrapper: ``cpp`` or ``python``.

    Inductor reads ``TORCHINDUCTOR_CPP_WRAPPER`` into its config when it is imported
    (torch/_inductor/config.py, ``cpp_wrapper``); the graph is compiled, or loaded under a key that
    holds this answer (:func:`key_factors`), with that config.
    """
    from torch._inductor import config

    return "cpp" if config.cpp_wrapper else "python"


def _layer_names() -> str:
    """How vLLM passes a layer's name to its attention ops: torch's opaque ``LayerName`` object or a str
    (``VLLM_USE_LAYERNAME``, vllm/utils/torch_utils.py); a graph traced one way calls the ops that way."""
    from vllm.utils import torch_utils

    return "opaque" if getattr(torch_utils, "_USE_LAYERNAME", False) else "str"


def key_factors(environ: Mapping[str, str]) -> dict[str, Any]:
    """Everything edgectl knows changes the compiled graph, beyond what vLLM's own key covers."""
    import torch

    from edgectl.contract import environment

    settings = {k: v for k, v in environment.snapshot(environ).items() if k not in _NOT_IN_KEY}
    try:
        from importlib.metadata import version

        edgectl_version = version("edgectl")
    except Exception:  # not installed as a distribution (a checkout on PYTHONPATH)
        edgectl_version = None
    return {
        "schema": "edgectl.compile-key/2",
        "edgectl": edgectl_version,
        "edgectl_runtime_sources": _runtime_sources_digest(),
        "torch": str(torch.__version__),  # a TorchVersion, which vLLM's msgpack refuses between processes
        "python": sys.version.split()[0],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "avx512": bool(torch.cpu._is_avx512_supported()),
        "isa_env": {k: environ.get(k, "") for k in _ISA_ENV},
        # vLLM's key has neither (inductor's factors only with VLLM_USE_MEGA_AOT_ARTIFACT)
        "graph_wrapper": graph_wrapper(),
        "layer_names": _layer_names(),
        "settings": settings,
    }


def key_digest(factors: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()


def install_key() -> None:
    """Append edgectl's factors to vLLM's AOT cache key (``caching.aot_compile_hash_factors``).

    ``decorators.py`` imports the function from its module at every call, so replacing the module
    attribute reaches it. Whatever launched vLLM (the worker, the bench, a bare ``vllm serve`` with
    the plugin), a settings change gives another directory.
    """
    from vllm.compilation import caching

    original = caching.aot_compile_hash_factors
    if getattr(original, "_edgectl", False):
        return

    def aot_compile_hash_factors(vllm_config) -> list[str]:
        factors = list(original(vllm_config))
        mine = key_factors(os.environ)
        _state["key"] = {"digest": key_digest(mine), "factors": mine}
        factors.append("edgectl:" + _state["key"]["digest"])
        return factors

    aot_compile_hash_factors._edgectl = True  # type: ignore[attr-defined]
    caching.aot_compile_hash_factors = aot_compile_hash_factors


# -- inductor's ISA probe ------------------------------------------------------------------------------

def _isa_candidates_and_factors() -> tuple[list[str], dict[str, Any]]:
    """The ISAs the probe would test (those the CPU flags allow, as ``valid_vec_isa_list`` picks
    them) and what the probe's answer depends on."""
    import platform

    import torch
    from torch._inductor import cpp_builder, cpu_vec_isa

    cpu = cpu_vec_isa.x86_isa_checker()
    candidates = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
                  if all(flag in cpu for flag in str(isa).split())]
    compiler = cpp_builder.get_cpp_compiler()
    return candidates, {"torch": str(torch.__version__), "machine": platform.machine(), "cpu_isa": cpu,
                        "compiler": compiler, "compiler_version": cpp_builder.get_compiler_version_info(compiler)}


def _isa_record_path(cache_root: str, factors: Mapping[str, Any]) -> Path:
    return Path(cache_root) / "edgectl" / f"inductor-vec-isa-{key_digest(factors)[:16]}.json"


def apply_isa_record(cache_root: str) -> bool:
    """Skip inductor's ISA probe where an earlier start recorded that every candidate passed on
    this CPU, compiler and torch. Returns whether it was skipped."""
    from torch._inductor import config

    if config.cpp.vec_isa_ok is not None:  # set by the user (TORCHINDUCTOR_VEC_ISA_OK): theirs
        return False
    candidates, factors = _isa_candidates_and_factors()
    try:
        record = json.loads(_isa_record_path(cache_root, factors).read_text())
    except (OSError, ValueError):
        return False
    if not candidates or record.get("factors") != factors or record.get("valid") != candidates:
        return False
    config.cpp.vec_isa_ok = True
    _state["vec_isa"] = "recorded"
    return True


def record_isa_probe(cache_root: str) -> bool:
    """After a start that probed: write down which ISAs passed (only if the probe ran in this
    process; never starts one). Returns whether a record was written."""
    from torch._inductor import config, cpu_vec_isa

    if config.cpp.vec_isa_ok is not None or cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0:
        return False
    _state["vec_isa"] = "probed"
    candidates, factors = _isa_candidates_and_factors()
    path = _isa_record_path(cache_root, factors)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"factors": factors, "candidates": candidates,
                                   "valid": [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]}))
        os.replace(tmp, path)
    except OSError as exc:  # a cache that cannot be written costs the probe next time, nothing else
        log.warning("could not record inductor's ISA probe in %s: %s", path, exc)
        return False
    return True


def _cache_root() -> str:
    from vllm import envs

    return envs.VLLM_CACHE_ROOT


# -- inductor's precompiled header ----------------------------------------------------------------

def install_header_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Keep inductor's precompiled headers in ``TORCHINDUCTOR_CACHE_DIR`` when it is set, not in
    the temporary directory (see the module's docstring). Returns the directory, or None where
    inductor's own choice stands."""
    environ = os.environ if environ is None else environ
    root = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not root:
        return None
    import torch
    from torch._inductor import codecache

    if not hasattr(codecache, "_HEADER_DIR"):  # another torch: its own layout stands
        log.info("torch %s has no precompiled-header directory to move", torch.__version__)
        return None
    header_dir = os.path.join(os.path.abspath(root), "precompiled_headers")
    codecache._HEADER_DIR = header_dir
    codecache._HEADER_LOCK_DIR = os.path.join(header_dir, "locks")
    return header_dir


# -- the load fix and the read-back ------------------------------------------------------------------

def install_load_fix() -> bool:
    """Give torch's bundled AOT callable the no-op ``finalize_loading`` vLLM 0.32 calls (see above).

    Returns whether anything was installed.
    """
    try:
        from torch._dynamo.aot_compile_types import (
            BundledAOTAutogradSerializableCallable as Bundled,
        )
    except ImportError:  # a torch without AOT compile: vLLM does not use the path at all
        return False
    if "finalize_loading" in vars(Bundled):
        return False

    def finalize_loading(self, vllm_config) -> None:
        """Nothing to finalize: ``deserialize_compile_artifacts`` returned the loaded graph."""

    Bundled.finalize_loading = finalize_loading
    return True


class _LoadFailureFilter(logging.Filter):
    """Keeps vLLM's "Compiling model again due to a load failure" record, with its traceback.

    vLLM logs it inside its ``except`` block (``decorators.py:333-338``), so the exception being
    handled is still ``sys.exc_info()`` here.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if "due to a load failure" in str(record.msg):
            exc = sys.exc_info()
            if exc[0] is not None and record.exc_info is None:
                record.exc_info = exc
                _state["load_failure"] = f"{exc[0].__name__}: {exc[1]}"
        return True


def install_readback() -> None:
    """Time and record the load attempt and the compile (module attributes, this process only)."""
    from vllm.compilation import decorators, wrapper

    logging.getLogger(decorators.__name__).addFilter(_LoadFailureFilter())

    original_load = decorators._try_load_aot_compiled_fn
    if not getattr(original_load, "_edgectl", False):
        def _try_load_aot_compiled_fn(model, aot_compilation_path):
            t0 = time.monotonic()
            _state["artifact"] = aot_compilation_path
            if os.path.exists(aot_compilation_path):
                _emit("loading")
                apply_isa_record(_cache_root())
            loaded = original_load(model, aot_compilation_path)
            if loaded is not None:
                record_isa_probe(_cache_root())
                _state.update(source="cache", load_s=round(time.monotonic() - t0, 3))
                log.info("compiled graph loaded from cache %s in %.1f s", aot_compilation_path,
                         time.monotonic() - t0)
                _emit("loaded")
            return loaded

        _try_load_aot_compiled_fn._edgectl = True  # type: ignore[attr-defined]
        decorators._try_load_aot_compiled_fn = _try_load_aot_compiled_fn

    cls = wrapper.TorchCompileWithNoGuardsWrapper
    original_compile = cls.aot_compile
    if not getattr(original_compile, "_edgectl", False):
        def aot_compile(self, *args, **kwargs):
            t0 = time.monotonic()
            _state["compile_started_monotonic"] = t0
            _emit("compiling")
            result = original_compile(self, *args, **kwargs)
            _state.update(source="compiled", compile_s=round(time.monotonic() - t0, 3))
            record_isa_probe(_cache_root())
            log.info("graph compiled in %.1f s (%s)", time.monotonic() - t0,
                     "the cache had none for this key" if _state["load_failure"] is None
                     else f"the cached one failed to load: {_state['load_failure']}")
            _emit("compiled")
            return result

        aot_compile._edgectl = True  # type: ignore[attr-defined]
        cls.aot_compile = aot_compile


def install(environ: Mapping[str, str]) -> None:
    """The plugin's entry: the key and the read-back always, the load fix when the lever asks.

    The key and the read-back change nothing vLLM computes; the fix changes what vLLM does (a
    cached graph is used), so it is a lever (``EDGECTL_COMPILE_CACHE``), off for unmodified vLLM.
    """
    global _installed
    if _installed:
        return
    from edgectl.contract import environment

    install_key()
    install_readback()
    if environment.read_bool("EDGECTL_COMPILE_CACHE", environ):
        install_load_fix()
        install_header_dir(environ)
    _installed = True


def facts(vllm_config=None) -> dict[str, Any]:
    """This process's compiled graph: where it came from (``cache`` / ``compiled`` / None = eager)."""
    from vllm.compilation.counter import compilation_counter as counter

    out = dict(_state)
    out.pop("compile_started_monotonic", None)
    out.update(aot_loaded=counter.num_aot_artifacts_loaded, aot_compiled=counter.num_aot_compiles,
               aot_saved=counter.num_aot_artifacts_saved)
    if vllm_config is not None:
        cc = vllm_config.compilation_config
        out["mode"] = str(getattr(cc.mode, "name", cc.mode))
        out["cache_dir"] = cc.local_cache_dir or None
        if out["mode"] != "NONE":  # eager mode runs no graph, and need not import inductor to say so
            out["wrapper"] = graph_wrapper()
    return out
