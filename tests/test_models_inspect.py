"""Model inspection: the config-only shapes (numbers checked by hand in the comments), real
safetensors files written by the helpers, and the JSON contract the planner reads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from models_helpers import (
    SHAPES,
    TINY,
    copy_shape,
    llama_tensors,
    make_model,
    tiny_config,
    write_safetensors,
)

from edgectl.errors import EdgectlError
from edgectl.models import ModelFacts, inspect_model

FULL, SLIDING = "full_attention", "sliding_attention"

# name: (layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied, max_pos,
#        linear bytes, embedding bytes, lm_head bytes, other bytes, parameters). All bf16 (2 B).
SHAPE_TABLE = {
    # per layer: q,o 576x576 = 331,776 each; k,v 192x576 = 110,592 each; gate,up,down 1536x576 =
    # 884,736 each -> 3,538,944; x30 = 106,168,320 params = 212,336,640 B. Embedding 49152x576 =
    # 28,311,552 params. Norms (2x576)x30 + 576 = 35,136. Sum 134,515,008 (docs/facts.md: 134.5 M).
    "smollm2-135m": (30, 576, 1536, 9, 3, 64, 49152, True, 8192,
                     212_336_640, 56_623_104, 0, 70_272, 134_515_008),
    # q,o 896x896 = 802,816; k,v 128x896 = 114,688; mlp 3 x 4864x896 = 13,074,432 -> 14,909,440 x24
    # = 357,826,560. Embedding 151936x896 = 136,134,656. Other: norms 2x896 + q/k/v biases
    # 896+128+128 = 2,944 per layer, x24 + 896 = 71,552. Sum 494,032,768 (Qwen's card: 0.49B).
    "qwen2.5-0.5b-instruct": (24, 896, 4864, 14, 2, 64, 151936, True, 32768,
                              715_653_120, 272_269_312, 0, 143_104, 494_032_768),
    # q,o 2048x2048 = 4,194,304; k,v 1024x2048 = 2,097,152; mlp 3 x 6144x2048 = 37,748,736 ->
    # 50,331,648 x28 = 1,409,286,144 (the card's "non-embedding 1.4B"). Embedding 151936x2048 =
    # 311,164,928. Other: norms 2x2048 + q_norm,k_norm 2x128 = 4,352 x28 + 2048 = 123,904.
    "qwen3-1.7b": (28, 2048, 6144, 16, 8, 128, 151936, True, 40960,
                   2_818_572_288, 622_329_856, 0, 247_808, 1_720_574_976),
    # q,o 4096x4096 = 16,777,216; k,v 1024x4096 = 4,194,304; mlp 3 x 12288x4096 = 150,994,944 ->
    # 192,937,984 x36 = 6,945,767,424. Embedding and lm_head 151936x4096 = 622,329,856 each.
    # Other (2x4096 + 2x128) x36 + 4096 = 308,224. Sum 8,190,735,360 (card: 8.2B).
    "qwen3-8b": (36, 4096, 12288, 32, 8, 128, 151936, False, 40960,
                 13_891_534_848, 1_244_659_712, 1_244_659_712, 616_448, 8_190_735_360),
    # q,o 16,777,216; k,v 1024x4096 = 4,194,304; mlp 3 x 14336x4096 = 176,160,768 -> 218,103,808
    # x32 = 6,979,321,856. Embedding and lm_head 128256x4096 = 525,336,576 each. Other 2x4096x32 +
    # 4096 = 266,240. Sum 8,030,261,248 (Meta's 8.03B).
    "llama-3.1-8b-instruct": (32, 4096, 14336, 32, 8, 128, 128256, False, 131072,
                              13_958_643_712, 1_050_673_152, 1_050_673_152, 532_480, 8_030_261_248),
    # The same body as Llama 3.1 8B; vocab 32000: embedding and lm_head 131,072,000 each.
    # Sum 7,241,732,096 (Mistral's 7.24B).
    "mistral-7b-v0.1": (32, 4096, 14336, 32, 8, 128, 32000, False, 32768,
                        13_958_643_712, 262_144_000, 262_144_000, 532_480, 7_241_732_096),
}


@pytest.mark.parametrize("name", sorted(SHAPE_TABLE))
def test_shape_from_config(name: str) -> None:
    (layers, hidden, inter, heads, kv, hd, vocab, tied, max_pos,
     linear, embedding, lm_head, other, params) = SHAPE_TABLE[name]
    facts = inspect_model(SHAPES / name)
    assert (facts.num_layers, facts.hidden_size, facts.intermediate_size) == (layers, hidden, inter)
    assert (facts.num_attention_heads, facts.num_kv_heads, facts.head_dim) == (heads, kv, hd)
    assert (facts.vocab_size, facts.tie_word_embeddings, facts.max_position_embeddings) == (vocab, tied, max_pos)
    pb = facts.param_bytes
    assert (pb.linear, pb.embedding, pb.lm_head, pb.other) == (linear, embedding, lm_head, other)
    assert pb.total == linear + embedding + lm_head + other
    assert facts.num_params == params
    assert facts.param_source == "config"
    assert facts.dtype == "bfloat16"
    assert len(facts.layer_types) == layers
    # 7 linear layers per decoder layer; lm_head is vLLM's ParallelLMHead, an embedding, not a linear layer
    assert len(facts.linear_layers) == 7 * layers
    assert sum(layer.out_features * layer.in_features for layer in facts.linear_layers) * 2 == linear
    assert facts.tokenizer and facts.unknown == ()
    assert facts.architecture == json.loads((SHAPES / name / "config.json").read_text())["architectures"][0]


def test_llama31_rope_scaling_is_reported() -> None:
    facts = inspect_model(SHAPES / "llama-3.1-8b-instruct")
    assert facts.rope_theta == 500000.0
    assert facts.rope_scaling == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    assert set(facts.layer_types) == {FULL} and facts.sliding_window is None


def test_mistral_slides_in_every_layer() -> None:
    # No layer_types in the config: vLLM's Attention uses the model-level window in every layer.
    facts = inspect_model(SHAPES / "mistral-7b-v0.1")
    assert facts.sliding_window == 4096
    assert facts.layer_types == (SLIDING,) * 32
    assert facts.chat_template is False  # the base model ships no chat template


def test_qwen_window_unused_without_use_sliding_window() -> None:
    # Qwen2.5's config says sliding_window 32768 but use_sliding_window false: nothing slides.
    facts = inspect_model(SHAPES / "qwen2.5-0.5b-instruct")
    assert facts.sliding_window is None and set(facts.layer_types) == {FULL}


def test_qwen_slides_from_max_window_layers(tmp_path: Path) -> None:
    model = copy_shape("qwen2.5-0.5b-instruct", tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config.update(use_sliding_window=True, max_window_layers=20, sliding_window=4096)
    (model / "config.json").write_text(json.dumps(config))
    facts = inspect_model(model)
    assert facts.layer_types == (FULL,) * 20 + (SLIDING,) * 4
    assert facts.sliding_window == 4096


def test_explicit_layer_types_win(tmp_path: Path) -> None:
    types = [SLIDING, FULL]
    model = make_model(tmp_path / "m", tiny_config(layer_types=types, sliding_window=512))
    facts = inspect_model(model)
    assert facts.layer_types == tuple(types) and facts.sliding_window == 512


def test_sliding_window_zero_means_none(tmp_path: Path) -> None:
    facts = inspect_model(make_model(tmp_path / "m", tiny_config(sliding_window=0)))
    assert facts.sliding_window is None and set(facts.layer_types) == {FULL}


def test_transformers5_rope_parameters(tmp_path: Path) -> None:
    # transformers 5 writes rope_parameters instead of rope_theta / rope_scaling (the real SmolLM2
    # conversion does: tests/model_shapes/smollm2-135m/config.json).
    smol = inspect_model(SHAPES / "smollm2-135m")
    assert smol.rope_theta == 100000.0 and smol.rope_scaling is None
    config = tiny_config(rope_parameters={"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                          "original_max_position_embeddings": 8192})
    del config["rope_theta"]
    facts = inspect_model(make_model(tmp_path / "m", config))
    assert facts.rope_theta == 500000.0
    assert facts.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}


# --- safetensors -------------------------------------------------------------------------

# TINY: per layer q,o 64x64 = 4,096 each; k,v 32x64 = 2,048 each; gate,up,down 128x64 = 8,192 each
# -> 36,864 params x2 layers = 73,728 = 147,456 B. Embedding 256x64 = 16,384 = 32,768 B.
# Norms 2x64x2 + 64 = 320 = 640 B.
TINY_LINEAR, TINY_EMBEDDING, TINY_OTHER = 147_456, 32_768, 640


def test_safetensors_sizes_match_the_config_computation(tmp_path: Path) -> None:
    with_weights = inspect_model(make_model(tmp_path / "w"))
    assert with_weights.param_source == "safetensors"
    pb = with_weights.param_bytes
    assert (pb.linear, pb.embedding, pb.lm_head, pb.other) == (TINY_LINEAR, TINY_EMBEDDING, 0, TINY_OTHER)
    assert with_weights.weights_dtype == "bfloat16"

    config_only = tmp_path / "c"
    make_model(config_only)
    (config_only / "model.safetensors").unlink()
    from_config = inspect_model(config_only)
    assert from_config.param_source == "config"
    assert from_config.param_bytes == with_weights.param_bytes
    assert from_config.linear_layers == with_weights.linear_layers
    assert from_config.num_params == with_weights.num_params == (TINY_LINEAR + TINY_EMBEDDING + TINY_OTHER) // 2


def test_linear_layers_have_pytorch_out_in_shapes(tmp_path: Path) -> None:
    facts = inspect_model(make_model(tmp_path / "m"))
    by_name = {layer.name: (layer.out_features, layer.in_features) for layer in facts.linear_layers}
    assert by_name["model.layers.0.self_attn.k_proj"] == (32, 64)  # 2 KV heads x 16
    assert by_name["model.layers.1.mlp.down_proj"] == (64, 128)
    assert len(by_name) == 14
    assert "lm_head" not in by_name and "model.embed_tokens" not in by_name


def test_untied_lm_head_is_counted(tmp_path: Path) -> None:
    tensors = llama_tensors(**TINY, tied=False)
    facts = inspect_model(make_model(tmp_path / "m", tiny_config(tie_word_embeddings=False), tensors))
    assert facts.param_bytes.lm_head == 256 * 64 * 2
    assert not facts.tie_word_embeddings


def test_stored_copy_of_a_tied_head_is_not_counted(tmp_path: Path) -> None:
    # Some checkpoints store lm_head.weight although tied; vLLM skips it and reuses the embedding.
    tensors = llama_tensors(**TINY, tied=False)
    facts = inspect_model(make_model(tmp_path / "m", tiny_config(tie_word_embeddings=True), tensors))
    assert facts.param_bytes.lm_head == 0
    assert facts.param_bytes.total == TINY_LINEAR + TINY_EMBEDDING + TINY_OTHER


def test_missing_tie_flag_is_read_from_the_weights(tmp_path: Path) -> None:
    config = tiny_config()
    del config["tie_word_embeddings"]
    untied = inspect_model(make_model(tmp_path / "u", config, llama_tensors(**TINY, tied=False)))
    tied = inspect_model(make_model(tmp_path / "t", config, llama_tensors(**TINY, tied=True)))
    assert (untied.tie_word_embeddings, tied.tie_word_embeddings) == (False, True)


def test_sharded_checkpoint_sums_every_shard(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "model.safetensors").unlink()
    tensors = list(llama_tensors(**TINY).items())
    half = len(tensors) // 2
    shards = {"model-00001-of-00002.safetensors": dict(tensors[:half]),
              "model-00002-of-00002.safetensors": dict(tensors[half:])}
    weight_map = {}
    for file, part in shards.items():
        write_safetensors(model / file, part)
        weight_map.update({name: file for name in part})
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    facts = inspect_model(model)
    assert facts.param_bytes.total == TINY_LINEAR + TINY_EMBEDDING + TINY_OTHER
    assert len(facts.linear_layers) == 14


def test_prequantized_checkpoint(tmp_path: Path) -> None:
    # A GPTQ-style 4-bit checkpoint (group 32): per linear layer qweight int32 [K/8, N], qzeros
    # int32 [K/32, N/8], scales fp16 [K/32, N], g_idx int32 [K]. The logical shapes come from config.json.
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    linear_bytes = 0
    for name, (dtype, shape) in llama_tensors(**TINY).items():
        if name.endswith("_proj.weight"):
            n, k = shape
            module = name[: -len(".weight")]
            parts = {"qweight": ("I32", (k // 8, n)), "qzeros": ("I32", (k // 32, n // 8)),
                     "scales": ("F16", (k // 32, n)), "g_idx": ("I32", (k,))}
            for part, (part_dtype, part_shape) in parts.items():
                tensors[f"{module}.{part}"] = (part_dtype, part_shape)
                linear_bytes += math.prod(part_shape) * {"I32": 4, "F16": 2}[part_dtype]
        else:
            tensors[name] = (dtype, shape)
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True}
    facts = inspect_model(make_model(tmp_path / "m", tiny_config(quantization_config=qc), tensors))
    assert facts.quantization_config == qc
    assert facts.param_bytes.linear == linear_bytes
    # 4 bits per weight plus per-group metadata: well under the bf16 size of the same layers
    assert TINY_LINEAR / 4 < facts.param_bytes.linear < TINY_LINEAR / 2
    assert facts.param_bytes.embedding == TINY_EMBEDDING
    plain = inspect_model(make_model(tmp_path / "plain"))
    assert facts.linear_layers == plain.linear_layers
    assert facts.num_params is None  # packed tensors do not give a parameter count


# --- the JSON contract -------------------------------------------------------------------

SCHEMA_KEYS = {
    "schema", "name", "path", "architecture", "model_type", "num_layers", "hidden_size", "intermediate_size",
    "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size", "tie_word_embeddings",
    "max_position_embeddings", "rope_theta", "rope_scaling", "sliding_window", "layer_types", "dtype",
    "weights_dtype", "param_bytes", "param_source", "num_params", "linear_layers", "quantization_config",
    "tokenizer", "chat_template", "unknown", "tokenizer_bytes", "modality", "speech", "vision",
}


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "mistral-7b-v0.1"])
def test_json_round_trip(name: str) -> None:
    facts = inspect_model(SHAPES / name)
    data = json.loads(json.dumps(facts.to_dict()))
    assert set(data) == SCHEMA_KEYS
    assert data["schema"] == "edgectl.model/1"
    assert set(data["param_bytes"]) == {"linear", "embedding", "lm_head", "other", "total"}
    assert data["linear_layers"][0] == {"name": "model.layers.0.mlp.down_proj", "out_features": 4096,
                                        "in_features": 14336}
    assert ModelFacts.from_dict(data) == facts


def test_from_dict_refuses_another_schema() -> None:
    data = inspect_model(SHAPES / "qwen3-8b").to_dict()
    with pytest.raises(EdgectlError, match="schema 'edgectl.model/0'"):
        ModelFacts.from_dict({**data, "schema": "edgectl.model/0"})
    with pytest.raises(EdgectlError, match="param_bytes.total"):
        ModelFacts.from_dict({**data, "param_bytes": {**data["param_bytes"], "total": 1}})
    with pytest.raises(EdgectlError, match=r"malformed: model.num_layers: expected an integer, got a string '36'$"):
        ModelFacts.from_dict({**data, "num_layers": "36"})
    # facts written before weights_dtype and num_params still load
    older = {k: v for k, v in data.items() if k not in ("weights_dtype", "num_params")}
    assert ModelFacts.from_dict(older).num_params is None


def test_render_text_shows_the_key_numbers() -> None:
    text = inspect_model(SHAPES / "mistral-7b-v0.1").render_text()
    assert "MistralForCausalLM" in text
    assert "32 sliding window 4096" in text
    assert "32 query, 8 KV, head_dim 128" in text
    assert "7241.7 M parameters" in text
