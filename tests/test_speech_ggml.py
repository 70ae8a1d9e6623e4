"""whisper.cpp's ggml file made from a Hugging Face Whisper directory (runtime/edgectl_runtime/tools/whisper_ggml.py),
read back field by field from a small fabricated model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from edgectl_runtime.tools.whisper_ggml import (  # noqa: E402
    GGML_MAGIC,
    convert,
    ggml_name,
    mel_filters,
    read_ftype,
)

D, FFN, MELS, VOCAB, SRC, TGT = 8, 16, 80, 12, 6, 5


def read_ggml(path: Path) -> tuple[tuple[int, ...], np.ndarray, list[bytes], dict[str, tuple[int, tuple[int, ...], bytes]]]:
    """The header, filters, vocabulary and tensors of a ggml Whisper file (whisper.cpp's reader, in Python)."""
    b, o = path.read_bytes(), 0

    def ints(n: int) -> tuple[int, ...]:
        nonlocal o
        v = struct.unpack_from(f"<{n}i", b, o)
        o += 4 * n
        return v

    header = ints(12)
    rows, cols = ints(2)
    filters = np.frombuffer(b, "<f4", rows * cols, o).reshape(rows, cols)
    o += 4 * rows * cols
    tokens = []
    for _ in range(ints(1)[0]):
        (n,) = ints(1)
        tokens.append(b[o:o + n])
        o += n
    tensors = {}
    while o < len(b):
        n_dims, name_len, ftype = ints(3)
        dims = ints(n_dims)
        name = b[o:o + name_len].decode()
        o += name_len
        size = int(np.prod(dims)) * (4 if ftype == 0 else 2)
        tensors[name] = (ftype, dims, b[o:o + size])
        o += size
    return header, filters, tokens, tensors


@pytest.fixture()
def hf_dir(tmp_path: Path) -> Path:
    """A one-layer Whisper in Hugging Face's names and float16, as the pull converts it."""
    g = np.random.default_rng(0)

    def t(*shape: int) -> np.ndarray:
        return g.standard_normal(shape).astype(np.float16)

    w: dict[str, np.ndarray] = {
        "model.encoder.conv1.weight": t(D, MELS, 3), "model.encoder.conv1.bias": t(D),
        "model.encoder.conv2.weight": t(D, D, 3), "model.encoder.conv2.bias": t(D),
        "model.encoder.embed_positions.weight": t(SRC, D),
        "model.encoder.layer_norm.weight": t(D), "model.encoder.layer_norm.bias": t(D),
        "model.decoder.embed_tokens.weight": t(VOCAB, D), "model.decoder.embed_positions.weight": t(TGT, D),
        "model.decoder.layer_norm.weight": t(D), "model.decoder.layer_norm.bias": t(D),
    }
    for side in ("encoder", "decoder"):
        p = f"model.{side}.layers.0."
        w |= {p + "self_attn.q_proj.weight": t(D, D), p + "self_attn.q_proj.bias": t(D),
              p + "self_attn.k_proj.weight": t(D, D), p + "self_attn.v_proj.weight": t(D, D),
              p + "self_attn.v_proj.bias": t(D), p + "self_attn.out_proj.weight": t(D, D),
              p + "self_attn.out_proj.bias": t(D), p + "self_attn_layer_norm.weight": t(D),
              p + "self_attn_layer_norm.bias": t(D), p + "fc1.weight": t(FFN, D), p + "fc1.bias": t(FFN),
              p + "fc2.weight": t(D, FFN), p + "fc2.bias": t(D), p + "final_layer_norm.weight": t(D),
              p + "final_layer_norm.bias": t(D)}
    p = "model.decoder.layers.0."
    w |= {p + "encoder_attn.q_proj.weight": t(D, D), p + "encoder_attn.k_proj.weight": t(D, D),
          p + "encoder_attn.v_proj.weight": t(D, D), p + "encoder_attn.out_proj.weight": t(D, D),
          p + "encoder_attn_layer_norm.weight": t(D)}
    safetensors_numpy.save_file(w, str(tmp_path / "model.safetensors"))
    config = {"vocab_size": VOCAB, "max_source_positions": SRC, "d_model": D, "encoder_attention_heads": 2,
              "encoder_layers": 1, "max_target_positions": TGT, "decoder_attention_heads": 2, "decoder_layers": 1,
              "num_mel_bins": MELS}
    (tmp_path / "config.json").write_text(json.dumps(config))
    # GPT-2's byte-level BPE writes a space as "Ġ" and a newline as "Ċ"
    vocab = {"!": 0, "Ġhello": 1, "Ċ": 2, "é": 3}
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}), encoding="utf-8")
    return tmp_path


def test_the_file_reads_back_as_whisper_cpp_expects(hf_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ggml.bin"
    summary = convert(hf_dir, out)
    header, filters, tokens, tensors = read_ggml(out)
    assert header == (GGML_MAGIC, VOCAB, SRC, D, 2, 1, TGT, D, 2, 1, MELS, 1)
    assert filters.shape == (MELS, 201) and np.array_equal(filters, mel_filters(MELS))
    assert tokens == [b"!", b" hello", b"\n", "é".encode("latin-1")]  # byte 0xe9 is its own unicode character
    assert summary["tensors"] == len(tensors) == 46 and read_ftype(out) == "f16"
    source = safetensors_numpy.load_file(str(hf_dir / "model.safetensors"))
    for hf, arr in source.items():
        ftype, dims, data = tensors[ggml_name(hf)]
        kept_f32 = arr.ndim == 1 or "positional" in ggml_name(hf)
        assert ftype == (0 if kept_f32 else 1), hf
        got = np.frombuffer(data, "<f4" if kept_f32 else "<f2")
        assert np.array_equal(got, arr.astype(np.float32).ravel()), hf  # float16 -> float32 is exact
        want = (1, D) if ggml_name(hf) in ("encoder.conv1.bias", "encoder.conv2.bias") else tuple(reversed(arr.shape))
        assert dims == want, hf


def test_names_follow_openai_whisper() -> None:
    assert ggml_name("model.encoder.layers.3.self_attn.q_proj.weight") == "encoder.blocks.3.attn.query.weight"
    assert ggml_name("model.decoder.layers.0.encoder_attn.k_proj.weight") == "decoder.blocks.0.cross_attn.key.weight"
    assert ggml_name("model.decoder.layers.5.fc2.bias") == "decoder.blocks.5.mlp.2.bias"
    assert ggml_name("model.encoder.layer_norm.bias") == "encoder.ln_post.bias"
    assert ggml_name("model.decoder.embed_tokens.weight") == "decoder.token_embedding.weight"
    assert ggml_name("model.encoder.conv1.weight") == "encoder.conv1.weight"
    assert ggml_name("proj_out.weight") is None  # tied to the token embedding


def test_f32_writes_every_matrix_as_float32(hf_dir: Path, tmp_path: Path) -> None:
    convert(hf_dir, tmp_path / "f32.bin", "f32")
    _h, _f, _t, tensors = read_ggml(tmp_path / "f32.bin")
    assert read_ftype(tmp_path / "f32.bin") == "f32" and {ft for ft, _d, _b in tensors.values()} == {0}
    (tmp_path / "not.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="not a ggml"):
        read_ftype(tmp_path / "not.bin")


def test_mel_filters_match_faster_whispers() -> None:
    # faster-whisper's numpy port of librosa.filters.mel(sr=16000, n_fft=400, n_mels) (feature_extractor.py)
    fe = pytest.importorskip("faster_whisper.feature_extractor")
    for n_mels in (80, 128):
        theirs = fe.FeatureExtractor.get_mel_filters(16000, 400, n_mels)
        assert np.allclose(mel_filters(n_mels), theirs, rtol=1e-5, atol=1e-8)
