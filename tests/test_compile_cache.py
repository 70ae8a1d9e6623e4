"""The compile cache's key and load-failure read-back (``edgectl_runtime/vllm_plugin/compile_cache.py``), without an
engine: every runtime setting that can change the graph changes the key; the rest does not; a
swallowed load failure keeps its traceback."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from edgectl.contract import environment  # noqa: E402
from edgectl_runtime.vllm_plugin import compile_cache  # noqa: E402


def _digest(environ) -> str:
    return compile_cache.key_digest(compile_cache.key_factors(environ))


def _other_value(var: environment.Var) -> str:
    if var.choices:
        return next(c for c in var.choices if c != var.default)
    return var.default + "1"


# The runtime's levers: what the plugin reads in the process that builds the graph.
RUNTIME_LEVERS = sorted(environment.snapshot({}))
GRAPH_SETTINGS = [environment.REGISTRY[n] for n in RUNTIME_LEVERS if n not in compile_cache._NOT_IN_KEY]


@pytest.mark.parametrize("var", GRAPH_SETTINGS, ids=lambda v: v.name)
def test_every_runtime_setting_changes_the_key(var):
    """A variable added to the registry later (a kernel choice, say) is in the key unless it is
    declared not to change the graph: a stale graph is never reused after a settings change."""
    assert _digest({}) != _digest({var.name: _other_value(var)})


@pytest.mark.parametrize("name", sorted(compile_cache._NOT_IN_KEY))
def test_settings_that_change_no_graph_keep_the_key(name):
    assert name in RUNTIME_LEVERS  # a lever the plugin reads, not a stale name
    var = environment.REGISTRY[name]
    assert _digest({}) == _digest({name: _other_value(var)})


@pytest.mark.parametrize("name", compile_cache._ISA_ENV)
def test_the_isa_the_code_was_generated_for_is_in_the_key(name):
    assert _digest({}) != _digest({name: "avx2"})


def test_the_graphs_wrapper_and_vllms_layer_names_are_in_the_key(monkeypatch):
    """The cpp_wrapper lever sets TORCHINDUCTOR_CPP_WRAPPER and VLLM_USE_LAYERNAME, which neither vLLM's key
    nor edgectl's settings hold: a graph with a Python wrapper is never loaded for a C++ one, nor the reverse."""
    from torch._inductor import config
    from vllm.utils import torch_utils

    before = _digest({})
    assert compile_cache.key_factors({})["graph_wrapper"] == ("cpp" if config.cpp_wrapper else "python")
    with config.patch(cpp_wrapper=not config.cpp_wrapper):  # inductor's own way to change its config
        with_wrapper = _digest({})
    assert with_wrapper != before and _digest({}) == before
    monkeypatch.setattr(torch_utils, "_USE_LAYERNAME", not torch_utils._USE_LAYERNAME)
    assert _digest({}) not in (before, with_wrapper)


def test_the_key_is_stable():
    env = {"EDGECTL_INT4_GROUP_SIZE": "64", "ATEN_CPU_CAPABILITY": "avx2"}
    assert _digest(env) == _digest(dict(env))


def test_a_swallowed_load_failure_keeps_its_traceback():
    """vLLM logs only ``str(e)`` inside its ``except`` (decorators.py:333-338); the filter adds
    the exception being handled, so the journal shows where the load failed."""
    logger = logging.getLogger("test.compile_cache.decorators")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger.addFilter(compile_cache._LoadFailureFilter())
    logger.addHandler(Keep())
    logger.propagate = False
    saved = dict(compile_cache._state)
    try:
        try:
            raise AttributeError("'function' object has no attribute 'finalize_loading'")
        except Exception as e:
            logger.warning("%sCompiling model again due to a load failure from %s, reason: %s", "", "/x", e)
        logger.warning("unrelated")
        assert records[0].exc_info is not None and records[0].exc_info[0] is AttributeError
        assert records[1].exc_info is None
        assert compile_cache._state["load_failure"] == \
            "AttributeError: 'function' object has no attribute 'finalize_loading'"
    finally:
        compile_cache._state.clear()
        compile_cache._state.update(saved)


def test_the_load_fix_goes_only_where_the_method_is_missing():
    from torch._dynamo.aot_compile_types import (
        BundledAOTAutogradSerializableCallable as Bundled,
    )

    before = vars(Bundled).get("finalize_loading")
    if before is not None:
        del Bundled.finalize_loading
    try:
        assert compile_cache.install_load_fix() is True
        assert Bundled.finalize_loading(object(), None) is None
        assert compile_cache.install_load_fix() is False  # already there: left alone
    finally:
        if "finalize_loading" in vars(Bundled):
            del Bundled.finalize_loading
        if before is not None:
            Bundled.finalize_loading = before


# -- inductor's ISA probe, recorded once ----------------------------------------------------------

@pytest.fixture
def inductor_isa(monkeypatch):
    """Inductor's ISA switch and probe cache as a fresh process has them; restored afterwards."""
    from torch._inductor import config, cpu_vec_isa

    if config.cpp.vec_isa_ok is not None:
        pytest.skip("TORCHINDUCTOR_VEC_ISA_OK is set in this environment")
    monkeypatch.setitem(compile_cache._state, "vec_isa", None)
    candidates, _ = compile_cache._isa_candidates_and_factors()
    if not candidates:
        pytest.skip("no x86 vector ISA for inductor to probe on this machine")
    with config.patch({"cpp.vec_isa_ok": None}):
        yield config, cpu_vec_isa


def test_a_start_that_probed_records_and_the_next_skips_the_probe(tmp_path, inductor_isa):
    """The record is what the probe found; the next start with the same CPU, compiler and torch
    sets inductor's switch instead of compiling and loading test programs again."""
    config, cpu_vec_isa = inductor_isa
    assert not compile_cache.apply_isa_record(str(tmp_path))  # nothing recorded yet: probe
    valid = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]  # the probe (cached per process)
    assert compile_cache.record_isa_probe(str(tmp_path))
    record = json.loads(next((tmp_path / "edgectl").glob("inductor-vec-isa-*.json")).read_text())
    assert record["valid"] == valid
    if record["valid"] != record["candidates"]:
        pytest.skip(f"the probe failed an ISA here ({record}): the switch cannot express it")
    assert compile_cache.apply_isa_record(str(tmp_path))
    assert config.cpp.vec_isa_ok is True and compile_cache._state["vec_isa"] == "recorded"


def test_a_record_from_another_compiler_or_a_failed_isa_is_not_trusted(tmp_path, inductor_isa):
    config, _ = inductor_isa
    candidates, factors = compile_cache._isa_candidates_and_factors()
    path = compile_cache._isa_record_path(str(tmp_path), factors)
    path.parent.mkdir(parents=True)
    # a compiler that could not build one of them: probe again (the switch is all or nothing)
    path.write_text(json.dumps({"factors": factors, "candidates": candidates, "valid": candidates[1:]}))
    assert not compile_cache.apply_isa_record(str(tmp_path))
    # another compiler version written under this digest's name (a tampered or stale file)
    other = {**factors, "compiler_version": factors["compiler_version"] + " (another)"}
    path.write_text(json.dumps({"factors": other, "candidates": candidates, "valid": candidates}))
    assert not compile_cache.apply_isa_record(str(tmp_path))
    path.write_text("{not json")
    assert not compile_cache.apply_isa_record(str(tmp_path))
    assert config.cpp.vec_isa_ok is None


def test_no_record_where_the_probe_did_not_run(tmp_path, inductor_isa, monkeypatch):
    """Recording never starts a probe itself (an eager start, or a switch set by the user)."""
    _, cpu_vec_isa = inductor_isa
    cpu_vec_isa.valid_vec_isa_list.cache_clear()
    assert not compile_cache.record_isa_probe(str(tmp_path))
    assert not (tmp_path / "edgectl").exists()


# -- inductor's precompiled header --------------------------------------------------------------------

def test_the_precompiled_header_goes_to_the_inductor_cache_when_one_is_set(tmp_path, monkeypatch):
    """Inductor keeps it in the temporary directory, which a unit with PrivateTmp= loses at every
    start; with TORCHINDUCTOR_CACHE_DIR set (the unit, the bench) it stays beside the rest."""
    from torch._inductor import codecache

    monkeypatch.setattr(codecache, "_HEADER_DIR", codecache._HEADER_DIR)  # restored afterwards
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_LOCK_DIR)
    before = codecache._HEADER_DIR
    assert compile_cache.install_header_dir({}) is None  # not set: inductor's own place stands
    assert codecache._HEADER_DIR == before
    got = compile_cache.install_header_dir({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")})
    assert got == str(tmp_path / "inductor" / "precompiled_headers") == codecache._HEADER_DIR
    assert codecache._HEADER_LOCK_DIR == str(tmp_path / "inductor" / "precompiled_headers" / "locks")


def test_the_compile_facts_cross_vllms_process_boundary():
    # in vLLM's multi-process topology the read-back (compile facts among it) returns through vLLM's msgpack,
    # which refuses a str subclass such as torch's TorchVersion: the engine's output thread died on it
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    for factors in (compile_cache.key_factors({}), compile_cache._isa_candidates_and_factors()[1]):
        assert MsgpackDecoder().decode(MsgpackEncoder().encode(factors)) == factors
