"""A Hugging Face Whisper directory → whisper.cpp's ggml model file, for the bench's whisper.cpp anchor.

``python -m edgectl_runtime.tools.whisper_ggml HF_DIR OUT_FILE [--ftype f16|f32]`` reads the
directory the pull converts the CTranslate2 files into (``model.safetensors``, ``config.json``,
``tokenizer.json``), so whisper.cpp runs the very weights vLLM and faster-whisper run.

The file is whisper.cpp's legacy ggml layout, as its converters write it
(``models/convert-h5-to-ggml.py`` and ``convert-pt-to-ggml.py`` in ggerganov/whisper.cpp), all
little-endian int32 unless said:

- magic ``0x67676d6c``; hyper-parameters ``n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
  n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype``;
- the mel filter bank: ``n_mels, n_fft_bins`` then float32 ``[n_mels, n_fft_bins]``;
- the BPE vocabulary: a count, then per token in id order its byte length and bytes (GPT-2's
  byte-to-unicode mapping undone); whisper.cpp adds the special tokens itself up to ``n_vocab``;
- per tensor: ``n_dims, name length, ftype`` (0 float32, 1 float16), the dimensions innermost
  first, the name, the data. Tensors of one dimension, the convolution biases (reshaped to
  ``[n, 1]``) and the positional embeddings stay float32, as whisper.cpp's converter keeps them.

Names follow openai/whisper's (``encoder.blocks.0.attn.query.weight``); ``proj_out`` is tied to
the token embedding and not written. The mel filters are what openai/whisper's
``assets/mel_filters.npz`` holds (librosa's Slaney-style filter bank for 16 kHz, n_fft 400),
computed here with numpy (:func:`mel_filters`) instead of being read from that file.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

GGML_MAGIC = 0x67676D6C  # "ggml"
FTYPES = {"f32": 0, "f16": 1}
SAMPLE_RATE = 16000
N_FFT = 400  # Whisper's STFT: 25 ms windows at 16 kHz

# Hugging Face name part -> openai/whisper's (the inverse of transformers' conversion script)
_LAYER_PARTS = {
    "self_attn.q_proj": "attn.query", "self_attn.k_proj": "attn.key", "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln",
}
_TOP_LEVEL = {
    "encoder.layer_norm.weight": "encoder.ln_post.weight", "encoder.layer_norm.bias": "encoder.ln_post.bias",
    "encoder.embed_positions.weight": "encoder.positional_embedding",
    "decoder.layer_norm.weight": "decoder.ln.weight", "decoder.layer_norm.bias": "decoder.ln.bias",
    "decoder.embed_positions.weight": "decoder.positional_embedding",
    "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
}
_KEPT_F32 = {"encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
             "decoder.positional_embedding"}
_CONV_BIASES = {"encoder.conv1.bias", "encoder.conv2.bias"}


def ggml_name(hf_name: str) -> str | None:
    """openai/whisper's name for a Hugging Face tensor, or None for the tied ``proj_out``."""
    if hf_name.startswith("proj_out."):
        return None
    parts = hf_name.removeprefix("model.").split(".")
    if len(parts) > 3 and parts[1] == "layers":  # encoder.layers.3.self_attn.q_proj.weight
        return ".".join([parts[0], "blocks", parts[2], _LAYER_PARTS[".".join(parts[3:-1])], parts[-1]])
    name = ".".join(parts)
    return _TOP_LEVEL.get(name, name)


def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """The Slaney-style mel filter bank ``[n_mels, n_fft // 2 + 1]`` (librosa.filters.mel's default:
    Slaney's mel scale, linear below 1 kHz and logarithmic above, each filter area-normalized)."""
    fft_hz = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    f_sp, min_log_hz = 200.0 / 3, 1000.0  # 66.7 Hz per mel below 1 kHz
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0

    def hz_to_mel(hz: float) -> float:
        return hz / f_sp if hz < min_log_hz else min_log_mel + float(np.log(hz / min_log_hz)) / logstep

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2)
    hz = np.where(mels < min_log_mel, f_sp * mels, min_log_hz * np.exp(logstep * (mels - min_log_mel)))
    ramps = hz[:, None] - fft_hz[None, :]
    fdiff = np.diff(hz)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (hz[2:n_mels + 2] - hz[:n_mels]))[:, None]
    return weights.astype(np.float32)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character table (the BPE vocabulary is written in it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def convert(hf_dir: Path, out: Path, ftype: str = "f16") -> dict[str, object]:
    """Write ``out`` from ``hf_dir``; returns a summary (tensors, bytes)."""
    config = json.loads((hf_dir / "config.json").read_text())
    vocab = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    tensors = load_file(str(hf_dir / "model.safetensors"))
    filters = mel_filters(config["num_mel_bins"])
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    written = 0
    with open(out, "wb") as f:
        header = [GGML_MAGIC, config["vocab_size"], config["max_source_positions"], config["d_model"],
                  config["encoder_attention_heads"], config["encoder_layers"], config["max_target_positions"],
                  config["d_model"], config["decoder_attention_heads"], config["decoder_layers"],
                  config["num_mel_bins"], FTYPES[ftype]]
        f.write(struct.pack(f"<{len(header)}i", *header))
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        f.write(struct.pack("<i", len(vocab)))
        for token, _id in sorted(vocab.items(), key=lambda kv: kv[1]):
            raw = bytes(byte_of[c] for c in token)
            f.write(struct.pack("<i", len(raw)) + raw)
        for hf_name in sorted(tensors):
            name = ggml_name(hf_name)
            if name is None:
                continue
            data = tensors[hf_name]
            if name in _CONV_BIASES:
                data = data.reshape(data.shape[0], 1)
            as_f32 = ftype == "f32" or data.ndim < 2 or name in _KEPT_F32
            data = np.ascontiguousarray(data.astype("<f4" if as_f32 else "<f2"))
            encoded = name.encode()
            f.write(struct.pack("<3i", data.ndim, len(encoded), 0 if as_f32 else 1))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            f.write(encoded)
            f.write(data.tobytes())
            written += 1
    return {"file": str(out), "tensors": written, "bytes": out.stat().st_size, "ftype": ftype}


def read_ftype(path: Path) -> str:
    """The float type a ggml Whisper file's header names ("f16", "f32", or "ftype N" for others)."""
    with open(path, "rb") as f:
        header = f.read(12 * 4)
    if len(header) < 48 or struct.unpack_from("<i", header)[0] != GGML_MAGIC:
        raise ValueError(f"{path} is not a ggml Whisper file (no ggml magic)")
    ftype = struct.unpack_from("<i", header, 11 * 4)[0]
    return {v: k for k, v in FTYPES.items()}.get(ftype, f"ftype {ftype}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgectl_runtime.tools.whisper_ggml",
                                     description="A Hugging Face Whisper directory -> a whisper.cpp ggml file.")
    parser.add_argument("hf_dir", type=Path, help="directory with model.safetensors, config.json, tokenizer.json")
    parser.add_argument("out", type=Path, help="the ggml file to write")
    parser.add_argument("--ftype", choices=sorted(FTYPES), default="f16",
                        help="float type of the matrices (f16: as whisper.cpp's own models)")
    args = parser.parse_args(argv)
    missing = [n for n in ("model.safetensors", "config.json", "tokenizer.json") if not (args.hf_dir / n).is_file()]
    if missing:
        print(f"error: {args.hf_dir} has no {', '.join(missing)} (a converted Hugging Face Whisper directory)",
              file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(convert(args.hf_dir, args.out, args.ftype), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
