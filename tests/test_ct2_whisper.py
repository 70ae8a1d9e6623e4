"""The CTranslate2 reader and the Whisper conversion (runtime/edgectl_runtime/formats/ct2_model.py,
runtime/edgectl_runtime/tools/convert_ct2_whisper.py) on a small random model the test writes itself
(tests/ct2_helpers.py): every tensor where docs/speech-research.md's mapping puts it, the fused q/k/v
and k/v split by rows, the zero k biases dropped and a non-zero one refused. NumPy and safetensors
only; about a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from ct2_helpers import (  # noqa: E402
    ALIASES,
    SMALL,
    SPECIAL,
    TIMESTAMPS,
    VOCAB,
    small_whisper,
    write_ct2,
    write_small_ct2_dir,
)

from edgectl.contract.whisper_names import hf_tensors  # noqa: E402
from edgectl_runtime.formats.ct2_model import Ct2FormatError, read_ct2_model  # noqa: E402
from edgectl_runtime.tools import convert_ct2_whisper as conv  # noqa: E402

D = SMALL["d"]


@pytest.fixture()
def variables() -> dict:
    return small_whisper(seed=7)


def _converted(tmp_path: Path, variables: dict) -> dict:
    write_ct2(tmp_path / "model.bin", variables, ALIASES)
    model = read_ct2_model(tmp_path / "model.bin")
    conv.check_model(model)
    return conv.convert_tensors(model, conv.whisper_dims(model))


def test_the_reader_gives_back_every_variable(tmp_path: Path, variables: dict) -> None:
    write_ct2(tmp_path / "model.bin", variables, ALIASES)
    model = read_ct2_model(tmp_path / "model.bin")
    assert (model.spec, model.revision, model.aliases) == ("WhisperSpec", 3, ALIASES)
    assert list(model.variables) == list(variables)
    for name, want in variables.items():
        got = model.variables[name]
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), name
    assert model.scalar("decoder/num_heads") == SMALL["heads"]


def test_a_damaged_file_is_refused(tmp_path: Path, variables: dict) -> None:
    path = tmp_path / "model.bin"
    write_ct2(path, variables, ALIASES)
    whole = path.read_bytes()
    for damaged, why in ((whole[:len(whole) // 2], "truncated or damaged"), (whole[:-7], "malformed string"), (whole + b"\0", "bytes after the aliases"),
                         (b"\x05" + whole[1:], "binary version 5")):
        path.write_bytes(damaged)
        with pytest.raises(Ct2FormatError, match=why):
            read_ct2_model(path)


def test_every_tensor_lands_where_the_mapping_says(tmp_path: Path, variables: dict) -> None:
    out = _converted(tmp_path, variables)
    v = variables
    expected = {t.name for t in hf_tensors(conv.whisper_dims(read_ct2_model(tmp_path / "model.bin")))}
    assert set(out) == expected
    # 5 + 15 per encoder layer + 2, 2 + 24 per decoder layer + 2 (whisper-base: 245)
    assert len(out) == 5 + 15 * SMALL["encoder_layers"] + 2 + 2 + 24 * SMALL["decoder_layers"] + 2
    same = {
        "model.encoder.conv1.weight": v["encoder/conv1/weight"],
        "model.encoder.conv2.bias": v["encoder/conv2/bias"],
        "model.encoder.embed_positions.weight": v["encoder/position_encodings/encodings"],
        "model.decoder.embed_tokens.weight": v["decoder/embeddings/weight"],
        "model.decoder.embed_positions.weight": v["decoder/position_encodings/encodings"],
        "model.encoder.layer_norm.weight": v["encoder/layer_norm/gamma"],
        "model.decoder.layer_norm.bias": v["decoder/layer_norm/beta"],
    }
    for side, i in (("encoder", 1), ("decoder", 0)):
        ct, hf = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
        qkv_w, qkv_b = v[f"{ct}/self_attention/linear_0/weight"], v[f"{ct}/self_attention/linear_0/bias"]
        same |= {
            f"{hf}.self_attn.q_proj.weight": qkv_w[:D], f"{hf}.self_attn.q_proj.bias": qkv_b[:D],
            f"{hf}.self_attn.k_proj.weight": qkv_w[D:2 * D],
            f"{hf}.self_attn.v_proj.weight": qkv_w[2 * D:], f"{hf}.self_attn.v_proj.bias": qkv_b[2 * D:],
            f"{hf}.self_attn.out_proj.weight": v[f"{ct}/self_attention/linear_1/weight"],
            f"{hf}.self_attn.out_proj.bias": v[f"{ct}/self_attention/linear_1/bias"],
            f"{hf}.self_attn_layer_norm.weight": v[f"{ct}/self_attention/layer_norm/gamma"],
            f"{hf}.fc1.weight": v[f"{ct}/ffn/linear_0/weight"], f"{hf}.fc2.bias": v[f"{ct}/ffn/linear_1/bias"],
            f"{hf}.final_layer_norm.bias": v[f"{ct}/ffn/layer_norm/beta"],
        }
        assert f"{hf}.self_attn.k_proj.bias" not in out
    ct, hf = "decoder/layer_0/attention", "model.decoder.layers.0.encoder_attn"
    kv_w, kv_b = v[f"{ct}/linear_1/weight"], v[f"{ct}/linear_1/bias"]
    same |= {
        f"{hf}.q_proj.weight": v[f"{ct}/linear_0/weight"], f"{hf}.q_proj.bias": v[f"{ct}/linear_0/bias"],
        f"{hf}.k_proj.weight": kv_w[:D], f"{hf}.v_proj.weight": kv_w[D:], f"{hf}.v_proj.bias": kv_b[D:],
        f"{hf}.out_proj.weight": v[f"{ct}/linear_2/weight"],
        "model.decoder.layers.0.encoder_attn_layer_norm.weight": v[f"{ct}/layer_norm/gamma"],
    }
    assert f"{hf}.k_proj.bias" not in out and "proj_out.weight" not in out  # tied: CTranslate2's alias
    for name, want in same.items():
        assert out[name].dtype == np.float16 and np.array_equal(out[name], want), name


@pytest.mark.parametrize("where", ["encoder/layer_1/self_attention/linear_0/bias",
                                   "decoder/layer_0/self_attention/linear_0/bias",
                                   "decoder/layer_0/attention/linear_1/bias"])
def test_a_non_zero_k_bias_is_refused(tmp_path: Path, variables: dict, where: str) -> None:
    rows = slice(D, 2 * D) if "self_attention" in where else slice(0, D)
    variables[where][rows][3] = 0.5
    with pytest.raises(conv.Refused, match=rf"{where}: the k bias .* is not zero \(max \|x\| 0.5\)"):
        _converted(tmp_path, variables)


def test_what_the_mapping_was_not_written_for_is_refused(tmp_path: Path, variables: dict) -> None:
    with pytest.raises(conv.Refused, match="does not place: encoder/layer_0/extra/weight"):
        _converted(tmp_path, {**variables, "encoder/layer_0/extra/weight": variables["encoder/conv1/bias"]})
    with pytest.raises(conv.Refused, match="decoder/activation is 1"):
        _converted(tmp_path, {**variables, "decoder/activation": np.array(1, dtype=np.int8)})
    write_ct2(tmp_path / "model.bin", variables, {})
    with pytest.raises(conv.Refused, match="aliases are {}"):
        conv.check_model(read_ct2_model(tmp_path / "model.bin"))
    write_ct2(tmp_path / "model.bin", variables, ALIASES, spec="TransformerSpec")
    with pytest.raises(conv.Refused, match="TransformerSpec"):
        conv.check_model(read_ct2_model(tmp_path / "model.bin"))


def test_the_tool_writes_the_directory(tmp_path: Path, variables: dict, capsys: pytest.CaptureFixture) -> None:
    src = write_small_ct2_dir(tmp_path / "ct2", variables)
    assert conv.main([str(src), str(tmp_path / "hf")]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["timestamp_tokens"] == len(TIMESTAMPS) and report["dtype"] == "float16"
    hf = tmp_path / "hf"
    loaded = safetensors_numpy.load_file(str(hf / "model.safetensors"))
    model = read_ct2_model(src / "model.bin")
    assert loaded.keys() == conv.convert_tensors(model, conv.whisper_dims(model)).keys()
    config = json.loads((hf / "config.json").read_text())
    eot, sot = VOCAB.index("<|endoftext|>"), VOCAB.index("<|startoftranscript|>")
    assert (config["d_model"], config["encoder_layers"], config["decoder_layers"], config["vocab_size"],
            config["max_source_positions"], config["max_target_positions"]) == (
        D, SMALL["encoder_layers"], SMALL["decoder_layers"], len(VOCAB), SMALL["src"], SMALL["tgt"])
    assert (config["eos_token_id"], config["decoder_start_token_id"], config["dtype"]) == (eot, sot, "float16")
    generation = json.loads((hf / "generation_config.json").read_text())
    assert generation["is_multilingual"] is False and "lang_to_id" not in generation
    assert generation["no_timestamps_token_id"] == VOCAB.index("<|notimestamps|>")
    added = json.loads((hf / "tokenizer.json").read_text())["added_tokens"]
    assert [(a["id"], a["content"]) for a in added] == [(VOCAB.index(t), t) for t in SPECIAL + TIMESTAMPS]
    assert json.loads((hf / "preprocessor_config.json").read_text())["feature_size"] == SMALL["mels"]
    # refused: an exit code 1, a reason, and nothing more written
    variables["decoder/layer_0/attention/linear_1/bias"][0] = 1
    bad = write_small_ct2_dir(tmp_path / "bad", variables)
    assert conv.main([str(bad), str(tmp_path / "out")]) == 1
    assert "the k bias" in capsys.readouterr().err and not (tmp_path / "out").exists()
