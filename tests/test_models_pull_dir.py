"""`edgectl models pull DIR` of a vision-language directory: recognised by config.json's architecture,
checked for what vLLM reads offline, copied into the cache with its manifest; anything it could not serve
refused with one line, exit 2, nothing written. A tiny shape of synth-smolvlm-256m's directory (headers
only; tests/vision_helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from models_helpers import run_cli, write_safetensors
from vision_helpers import make_vlm, vlm_config

from edgectl.models import pull_dir as pull_dir_module
from edgectl.models.cache import LAYOUT_HF, read_manifest
from edgectl.models.pull_dir import pull_dir

TINY_TEXT = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
             "max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": True,
             "architectures": ["VLlama3ForCausalLM"]}  # the Hub's SmolVLM names its text model so: not what vLLM loads
TINY_VISION = {"model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 2, "image_size": 64, "patch_size": 16}


def _tiny(root: Path) -> Path:
    """A tiny SmolVLM directory the Hub's way: preprocessor_config.json, image_seq_len 4 in
    processor_config.json, and files vLLM does not read (an onnx/ folder, a .bin)."""
    d = make_vlm(root, vlm_config(text_config=TINY_TEXT, vision_config=TINY_VISION, scale_factor=2),
                 processor={"image_seq_len": 4, "processor_class": "Idefics3Processor"})
    (d / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Idefics3ImageProcessor", "do_image_splitting": True, "size": {"longest_edge": 256},
         "max_image_size": {"longest_edge": 64}}))
    (d / "onnx").mkdir()
    (d / "onnx" / "vision_encoder.onnx").write_bytes(b"x" * 100)
    (d / "pytorch_model.bin").write_bytes(b"x" * 100)
    return d


@pytest.fixture
def no_tokenizer_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    # what the tokenizer costs the worker is measured in the runtime (its own tests); here a fixed record
    monkeypatch.setattr(pull_dir_module, "measure_tokenizer", lambda *a: {"bytes": 1234})


def test_pulled_checked_and_pulled_once(tmp_path: Path, no_tokenizer_measure: None) -> None:
    src = _tiny(tmp_path / "SmolVLM-Tiny")
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path / "models")}
    seen: list[str] = []
    result = pull_dir(src, env, seen.append)
    final = tmp_path / "models" / "smolvlm-tiny"
    assert result.action == "pulled" and result.path == final
    assert sorted(p.name for p in final.iterdir()) == [
        "chat_template.jinja", "config.json", "edgectl-model.json", "model.safetensors", "preprocessor_config.json",
        "processor_config.json", "tokenizer.json", "tokenizer_config.json"]
    manifest = read_manifest(final)
    assert manifest is not None and manifest["layout"] == LAYOUT_HF
    assert manifest["source"] == {"kind": "directory", "path": str(src), "architecture": "Idefics3ForConditionalGeneration",
                                  "skipped": ["onnx", "pytorch_model.bin"]}
    # 64x64 tiles of 16-pixel patches, shuffled by 2: 4 tokens a tile; a 512x512 image resized to 256: 4x4 + 1
    assert manifest["vision"] == {"tokens_per_tile": 4, "image_tokens_512": 17 * 4, "image_tokens_max": 17 * 4}
    assert result.to_dict()["path"] == str(final) and "gguf_path" not in result.to_dict()
    assert pull_dir(src, env).action == "already pulled"
    (final / "tokenizer.json").write_text("{}")  # damaged: copied again
    assert pull_dir(src, env).action == "pulled" and read_manifest(final) is not None
    assert (final / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    done = run_cli(["models", "inspect", str(final), "--json"])
    assert done.returncode == 0 and json.loads(done.stdout)["vision"]["tiles_512"] == 17


def _drop(name: str):
    return lambda d: (d / name).unlink()


def _index_names_a_missing_shard(d: Path) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]})),
     "config.json names 'LlamaForCausalLM'; a LlamaForCausalLM directory is served from where it is: `edgectl deploy"),
    (lambda d: (d / "config.json").write_text(json.dumps({"architectures": ["Qwen2VLForConditionalGeneration"]})),
     "edgectl reads Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration"),
    (lambda d: (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["x.Y", None]}})),
     "tokenizer_config.json: auto_map names code shipped with the model (trust_remote_code)"),
    (_index_names_a_missing_shard, "model.safetensors.index.json names model-00002-of-00002.safetensors, which"),
    (_drop("model.safetensors"), "no *.safetensors weights (nor model.safetensors.index.json)"),
    (_drop("tokenizer.json"), "no tokenizer (none of tokenizer.json"),
    (_drop("chat_template.jinja"), "no chat template"),
    (_drop("preprocessor_config.json"), "no preprocessor_config.json (nor an image_processor in processor_config.json)"),
])
def test_refused_with_one_line_and_nothing_written(tmp_path: Path, change, message: str) -> None:
    src = _tiny(tmp_path / "vlm")
    if "tokenizer_config" not in message and "tokenizer.json" not in message:
        (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    change(src)
    cache = tmp_path / "models"
    done = run_cli(["models", "pull", str(src)], env={"EDGECTL_MODEL_CACHE": str(cache)})
    assert done.returncode == 2 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not cache.exists()


def test_another_model_of_the_same_name_is_not_overwritten(tmp_path: Path, no_tokenizer_measure: None) -> None:
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path / "models")}
    pull_dir(_tiny(tmp_path / "a" / "vlm"), env)
    done = run_cli(["models", "pull", str(_tiny(tmp_path / "b" / "vlm"))], env=env)
    assert done.returncode == 2 and "already holds another model" in done.stderr
    assert read_manifest(tmp_path / "models" / "vlm")["source"]["path"] == str(tmp_path / "a" / "vlm")


def test_weights_in_shards_are_all_kept(tmp_path: Path, no_tokenizer_measure: None) -> None:
    src = _tiny(tmp_path / "vlm")
    (src / "model.safetensors").rename(src / "model-00001-of-00002.safetensors")
    write_safetensors(src / "model-00002-of-00002.safetensors", {})
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    result = pull_dir(src, {"EDGECTL_MODEL_CACHE": str(tmp_path / "models")})
    assert {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
            "model.safetensors.index.json"} <= {p.name for p in result.path.iterdir()}
