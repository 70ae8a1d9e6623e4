"""A GGUF in vLLM's terms (edgectl/contract/gguf_names.py, edgectl/models/gguf_hf.py): tensor
names, llama.cpp's q/k row permutation undone, and config.json from the metadata — checked against llama.cpp's own Python
(the gguf package's tensor name map) and against the catalog model's transformers conversion."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_models_gguf import write_tiny

from edgectl.contract import gguf_names
from edgectl.contract.gguf_header import read_gguf
from edgectl.errors import EdgectlError
from edgectl.models import gguf_hf

gguf = pytest.importorskip("gguf")

ARCHS = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
         "gemma3": gguf.MODEL_ARCH.GEMMA3}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_names_agree_with_llama_cpps_tensor_map(arch: str) -> None:
    # gguf-py's TensorNameMap is what convert_hf_to_gguf.py names the tensors with.
    tmap = gguf.get_tensor_name_map(ARCHS[arch], 4)
    hf_names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    hf_names += [f"model.layers.3.{m}.weight" for m in gguf_names.BLOCK_NAMES[arch].values()]
    for hf in hf_names:
        theirs = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        ours = gguf_names.gguf_name(arch, hf)
        assert ours == theirs, (arch, hf)
        assert gguf_names.hf_name(arch, ours) == hf
    assert gguf_names.hf_name(arch, "blk.0.attn_q.bias") == "model.layers.0.self_attn.q_proj.bias"
    assert gguf_names.hf_name(arch, "blk.0.no_such.weight") is None
    assert gguf_names.hf_name(arch, "rope_freqs.weight") is None


@pytest.mark.parametrize("heads,rows", [(9, 576), (3, 192), (1, 8)])
def test_unpermute_inverts_llama_cpps_permute(heads: int, rows: int) -> None:
    import numpy as np

    w = np.arange(rows * 3).reshape(rows, 3)
    # convert_hf_to_gguf.py LlamaModel.permute:
    permuted = w.reshape(heads, 2, rows // heads // 2, 3).swapaxes(1, 2).reshape(rows, 3)
    order = gguf_names.unpermute_order(rows, heads)
    assert (permuted[order] == w).all()
    assert not (permuted == w).all() or rows // heads == 2


def test_only_llama_is_permuted() -> None:
    cfg = {"num_attention_heads": 9, "num_key_value_heads": 3}
    assert gguf_names.heads_of("llama", "blk.0.attn_q.weight", cfg) == 9
    assert gguf_names.heads_of("llama", "blk.0.attn_k.weight", cfg) == 3
    assert gguf_names.heads_of("llama", "blk.0.attn_v.weight", cfg) is None
    for arch in ("qwen2", "qwen3", "gemma3"):
        assert gguf_names.heads_of(arch, "blk.0.attn_q.weight", cfg) is None


def test_config_of_a_tiny_gemma3(tmp_path: Path) -> None:
    cfg = gguf_hf.hf_config(read_gguf(write_tiny(tmp_path / "g.gguf", arch="gemma3", layers=7, window=512)))
    assert cfg["model_type"] == "gemma3_text" and cfg["architectures"] == ["Gemma3ForCausalLM"]
    assert cfg["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert cfg["rope_local_base_freq"] == 10000.0 and cfg["query_pre_attn_scalar"] == cfg["head_dim"] == 16
    assert cfg["tie_word_embeddings"] is True


def test_config_of_the_catalog_gguf_matches_its_transformers_conversion() -> None:
    from edgectl.models import read_manifest, resolve_model

    try:
        directory = resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")
    manifest = read_manifest(directory)
    gguf_file = Path(manifest["gguf"]["path"])
    ours = gguf_hf.hf_config(read_gguf(gguf_file))
    theirs = json.loads((directory / "config.json").read_text())
    theta = ours.pop("rope_theta")
    assert theta == theirs["rope_parameters"]["rope_theta"]
    for key, value in ours.items():
        if key == "model_type" or key == "dtype":
            assert theirs[key] == value
            continue
        assert theirs.get(key) == value, key
