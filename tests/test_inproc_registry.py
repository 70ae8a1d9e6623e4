"""The single-process worker lets vLLM inspect a model class in its own process
(``edgectl_runtime.vllm_plugin.inproc.inspect_models_in_process``), not in a second Python that imports vLLM
again; the answer is the one vLLM's subprocess gives, and it still reaches vLLM's cache."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")


def test_model_inspection_runs_in_this_process_and_answers_as_the_subprocess_did(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    from vllm.model_executor.models import registry

    original = registry._run_in_subprocess
    monkeypatch.setattr(registry, "_run_in_subprocess", original)  # restored after the test
    lazy = registry._LazyRegisteredModel(module_name="vllm.model_executor.models.llama", class_name="LlamaForCausalLM")

    from edgectl_runtime.vllm_plugin import inproc

    inproc.inspect_models_in_process()
    assert registry._run_in_subprocess(os.getpid) == os.getpid()  # no other process
    info = lazy.inspect_model_cls()
    assert list((tmp_path / "modelinfos").glob("*")), "vLLM's model-info cache was not written"
    # vLLM's own way, in a subprocess, for the same class
    reference = original(lambda: registry._ModelInfo.from_model_cls(lazy.load_model_cls()))
    assert info == reference
    assert info.supports_pp  # a fact about Llama, so the comparison is not of two empty answers
