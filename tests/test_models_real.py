"""The real SmolLM2-135M-Instruct in the model cache (EDGECTL_MODEL_CACHE, else the default),
as the test set-up pulls it; skipped when it is not pulled."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from models_helpers import SHAPES

from edgectl.errors import EdgectlError
from edgectl.models import CATALOG, inspect_model, read_manifest, resolve_model
from edgectl.models.cache import check_model_dir


@pytest.fixture(scope="module")
def smollm2() -> Path:
    try:
        return resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")


def test_real_smollm2_matches_its_published_shape(smollm2: Path) -> None:
    # docs/facts.md, "The catalog model": LlamaForCausalLM, hidden 576, 30 layers, 9 heads, 3 KV heads, head_dim 64,
    # vocab 49152, max_position_embeddings 8192, tied embeddings, 134.5 M parameters
    facts = inspect_model(smollm2, "smollm2-135m")
    assert facts.architecture == "LlamaForCausalLM"
    assert (facts.num_layers, facts.hidden_size, facts.num_attention_heads, facts.num_kv_heads,
            facts.head_dim) == (30, 576, 9, 3, 64)
    assert (facts.vocab_size, facts.max_position_embeddings, facts.tie_word_embeddings) == (49152, 8192, True)
    assert round(facts.num_params / 1e6, 1) == 134.5
    # the pull serves the Q4_1 GGUF as it is (the embedding table Q8_0)
    assert facts.param_source == "gguf" and facts.dtype == "bfloat16" and facts.weights_dtype == "Q4_1"
    assert facts.quantization_config["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert facts.tokenizer and facts.chat_template
    assert facts.layer_types == ("full_attention",) * 30 and facts.sliding_window is None


def test_real_smollm2_agrees_with_its_config_only_shape(smollm2: Path) -> None:
    # the shape's config.json is a copy of transformers' conversion; the config made from the GGUF
    # metadata must agree with it on every field it sets, and the bytes the planner prices the
    # dequantized weights at must equal those computed from the shape
    from edgectl.planner.ledger import _served_param_bytes

    ours = json.loads((smollm2 / "config.json").read_text())
    theirs = json.loads((SHAPES / "smollm2-135m" / "config.json").read_text())
    assert {k: v for k, v in ours.items() if k != "transformers_version"} == {
        k: v for k, v in theirs.items() if k in ours and k != "transformers_version"}
    real, shape = inspect_model(smollm2), inspect_model(SHAPES / "smollm2-135m")
    assert _served_param_bytes(real) == shape.param_bytes
    assert [(x.name, x.out_features, x.in_features) for x in real.linear_layers] == [
        (x.name, x.out_features, x.in_features) for x in shape.linear_layers]


def test_real_smollm2_is_intact_and_readable(smollm2: Path) -> None:
    entry = CATALOG["smollm2-135m"]
    assert check_model_dir(smollm2, entry, full=True) is None
    manifest = read_manifest(smollm2)
    assert manifest is not None and manifest["files"]["model.gguf"]["sha256"] == entry.gguf_sha256
    for f in smollm2.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    assert Path(manifest["gguf"]["path"]).stat().st_size == entry.gguf_bytes
