"""Bad models through the real CLI (`edgectl models inspect`): exit 2, one `error:` line saying
what was wrong and what to do, no traceback, nothing on stdout."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from models_helpers import make_model, run_cli, tiny_config

from edgectl.models import inspect_model


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


def _set_header(path: Path, raw: bytes) -> None:
    # Replace the header, keeping the data that followed it.
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def _header(path: Path) -> dict:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8: 8 + n])


def no_config(m: Path) -> None:
    (m / "config.json").unlink()


def malformed_config(m: Path) -> None:
    (m / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 64,,}')


def config_not_an_object(m: Path) -> None:
    (m / "config.json").write_text("[1, 2]")


def config_without_layers(m: Path) -> None:
    config = tiny_config()
    del config["num_hidden_layers"]
    (m / "config.json").write_text(json.dumps(config))


def config_with_bad_value(m: Path) -> None:
    (m / "config.json").write_text(json.dumps(tiny_config(hidden_size="big")))


def unsupported_architecture(m: Path) -> None:
    (m / "config.json").write_text(json.dumps(tiny_config(architectures=["BertForMaskedLM"])))


def no_architectures(m: Path) -> None:
    config = tiny_config()
    del config["architectures"]
    (m / "config.json").write_text(json.dumps(config))


def no_tokenizer(m: Path) -> None:
    (m / "tokenizer.json").unlink()  # tokenizer_config.json alone holds no vocabulary


def broken_tokenizer(m: Path) -> None:
    (m / "tokenizer.json").write_text('{"version": "1.0", "model": ')


def header_beyond_file(m: Path) -> None:
    _truncate(m / "model.safetensors", 8 + 100)  # cut inside the JSON header


def shorter_than_length_field(m: Path) -> None:
    _truncate(m / "model.safetensors", 5)


def header_not_json(m: Path) -> None:
    raw = bytearray((m / "model.safetensors").read_bytes())
    raw[8:16] = b"\xff\xfe garb"
    (m / "model.safetensors").write_bytes(bytes(raw))


def data_beyond_file(m: Path) -> None:
    path = m / "model.safetensors"
    _truncate(path, path.stat().st_size - 4096)  # the last tensor's data is cut short


def offsets_disagree_with_shape(m: Path) -> None:
    path = m / "model.safetensors"
    header = _header(path)
    begin, end = header["model.norm.weight"]["data_offsets"]
    header["model.norm.weight"]["data_offsets"] = [begin, end - 2]
    _set_header(path, json.dumps(header).encode())


def unknown_dtype(m: Path) -> None:
    path = m / "model.safetensors"
    header = _header(path)
    header["model.norm.weight"]["dtype"] = "Q4"
    _set_header(path, json.dumps(header).encode())


def missing_shard(m: Path) -> None:
    (m / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                        "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    os.rename(m / "model.safetensors", m / "model-00001-of-00002.safetensors")


def config_only_unknown_layout(m: Path) -> None:
    (m / "model.safetensors").unlink()
    (m / "config.json").write_text(json.dumps(tiny_config(architectures=["GemmaForCausalLM"],
                                                          model_type="gemma")))


# case: (damage, words the error line must contain)
CASES: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "no config": (no_config, ["no config.json", "give the directory that holds config.json"]),
    "malformed config": (malformed_config, ["config.json: not valid JSON (line 1 column", "download the model again"]),
    "config not an object": (config_not_an_object, ["config.json: holds a JSON list, expected an object"]),
    "config lacks layers": (config_without_layers, ["config.json: has no num_hidden_layers"]),
    "config bad value": (config_with_bad_value, ["hidden_size is 'big', expected a positive integer"]),
    "no architectures": (no_architectures, ["has no 'architectures' list", "LlamaForCausalLM"]),
    "unsupported architecture": (unsupported_architecture, [
        "architecture 'BertForMaskedLM' is not one vLLM 0.32.0 can serve for text generation",
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"]),
    "no tokenizer": (no_tokenizer, ["no tokenizer (none of tokenizer.json, tokenizer.model",
                                    "copy the model's tokenizer files"]),
    "broken tokenizer": (broken_tokenizer, ["tokenizer.json: not a valid tokenizer file"]),
    "header beyond file": (header_beyond_file, ["corrupt safetensors file: header length",
                                                "beyond the file size 108 (truncated?)"]),
    "shorter than length field": (shorter_than_length_field, ["file is 5 bytes, shorter than the 8-byte"]),
    "header not JSON": (header_not_json, ["corrupt safetensors file: header is not valid JSON"]),
    "data beyond file": (data_beyond_file, ["data ends at byte", "(truncated?)",
                                            "download or convert the model again"]),
    "offsets disagree with shape": (offsets_disagree_with_shape, [
        "'model.norm.weight' (BF16 [64]) needs 128 bytes but its data_offsets span 126"]),
    "unknown dtype": (unknown_dtype, ["tensor 'model.norm.weight' has unknown dtype 'Q4'"]),
    "missing shard": (missing_shard, ["names 1 missing shard(s) (model-00002-of-00002.safetensors)"]),
    "config-only unknown layout": (config_only_unknown_layout, ["no *.safetensors weights", "'gemma'"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_model_gives_one_clear_line(case: str, tmp_path: Path) -> None:
    damage, words = CASES[case]
    model = make_model(tmp_path / "model")
    inspect_model(model)  # the model is fine before the damage
    damage(model)
    done = run_cli(["models", "inspect", str(model)])
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    first, *rest = done.stderr.splitlines()
    assert first.startswith("error: ")
    for w in words:
        assert w in first, f"{w!r} not in {first!r}"
    if case == "unsupported architecture":
        # the full list goes on a second line, for whoever wants it
        assert len(rest) == 1 and rest[0].startswith("supported: ") and "Qwen3ForCausalLM" in rest[0]
    else:
        assert rest == []


def test_not_a_directory(tmp_path: Path) -> None:
    done = run_cli(["models", "inspect", str(tmp_path / "nowhere" / "model")])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: no model '") and "neither a catalog name" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_catalog_name_not_pulled(tmp_path: Path) -> None:
    done = run_cli(["models", "inspect", "smollm2-135m"], env={"EDGECTL_MODEL_CACHE": str(tmp_path)})
    assert done.returncode == 2
    assert done.stderr == ("error: model 'smollm2-135m' is not pulled yet: run `edgectl models pull smollm2-135m`\n")


def test_pull_unknown_name(tmp_path: Path) -> None:
    done = run_cli(["models", "pull", "gpt-5"], env={"EDGECTL_MODEL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: no model 'gpt-5' in the catalog (it has: gemma3-270m, smollm2-135m, synth-llama-1b, synth-smolvlm-256m, whisper-base, whisper-tiny-en)")
    assert not (tmp_path / "cache").exists()  # nothing written for a bad request


def test_good_model_inspects_as_json(tmp_path: Path) -> None:
    done = run_cli(["models", "inspect", str(make_model(tmp_path / "m")), "--json"])
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["schema"] == "edgectl.model/1" and data["name"] == "m" and data["num_layers"] == 2
