"""The facts of a Whisper (``WhisperForConditionalGeneration``) directory: its encoder and decoder
read from config.json, its weights from the safetensors headers, else laid out from config.json
(the catalog's shipped copy, planned before the pull) by ``edgectl/contract/whisper_names.py``.

How the decoder maps onto ModelFacts' text-model fields (what the planner sizes the decoder's KV
and the served weights from): layers, heads and hidden size are the decoder's, every head has its
own K and V (no grouped-query attention in Whisper), the context is the decoder's 448 positions,
the LM head is the embedding table (``proj_out`` tied), and there is no RoPE (learned positions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgectl.contract.whisper_names import (
    MULTILINGUAL_MIN_VOCAB,
    WhisperDims,
    hf_tensors,
)
from edgectl.errors import EdgectlError
from edgectl.models import config_json
from edgectl.models.facts import FULL_ATTENTION, ModelFacts, SpeechFacts
from edgectl.models.safetensors_header import read_model_tensors
from edgectl.models.tokenizer_files import has_tokenizer
from edgectl.models.weights import weights_from_config, weights_from_tensors

WHISPER_MODEL_TYPE = "whisper"


def speech_facts(path: Path, config: dict[str, Any]) -> tuple[SpeechFacts, int]:
    """The encoder and decoder config.json describes, and its vocabulary size."""
    def need(name: str) -> int:
        value = config_json.int_field(path, config, name)
        assert value is not None  # required: int_field raised otherwise
        return value

    vocab = need("vocab_size")
    speech = SpeechFacts(
        encoder_layers=need("encoder_layers"), decoder_layers=need("decoder_layers"), d_model=need("d_model"),
        encoder_attention_heads=need("encoder_attention_heads"),
        decoder_attention_heads=need("decoder_attention_heads"),
        encoder_ffn_dim=need("encoder_ffn_dim"), decoder_ffn_dim=need("decoder_ffn_dim"),
        num_mel_bins=need("num_mel_bins"), max_source_positions=need("max_source_positions"),
        max_target_positions=need("max_target_positions"), multilingual=vocab >= MULTILINGUAL_MIN_VOCAB,
    )
    for heads in (speech.encoder_attention_heads, speech.decoder_attention_heads):
        if speech.d_model % heads:
            raise config_json.bad_config(path, f"d_model {speech.d_model} is not a multiple of {heads} heads")
    return speech, vocab


def whisper_dims(speech: SpeechFacts, vocab_size: int) -> WhisperDims:
    return WhisperDims(
        encoder_layers=speech.encoder_layers, decoder_layers=speech.decoder_layers, d_model=speech.d_model,
        encoder_ffn_dim=speech.encoder_ffn_dim, decoder_ffn_dim=speech.decoder_ffn_dim,
        num_mel_bins=speech.num_mel_bins, max_source_positions=speech.max_source_positions,
        max_target_positions=speech.max_target_positions, vocab_size=vocab_size,
    )


def inspect_whisper(path: Path, config: dict[str, Any], architecture: str, name: str | None,
                    require_tokenizer: bool) -> ModelFacts:
    """ModelFacts of a Whisper directory; EdgectlError (one line) for what cannot be served."""
    speech, vocab = speech_facts(path, config)
    dtype = config.get("dtype") or config.get("torch_dtype")
    dtype = dtype if isinstance(dtype, str) else None
    if require_tokenizer and not has_tokenizer(path):
        raise EdgectlError(f"{path}: no tokenizer (tokenizer.json) beside config.json; vLLM needs it to turn "
                           "Whisper's tokens into text: pull the model again (`edgectl models pull`)")
    tensors = [t for t in read_model_tensors(path) if t.name != "proj_out.weight"]  # tied: vLLM skips it
    unknown: list[str] = []
    if tensors:
        weights, source = weights_from_tensors(tensors, True, WHISPER_MODEL_TYPE, None), "safetensors"
    else:
        layout = [(t.name, t.shape) for t in hf_tensors(whisper_dims(speech, vocab))]
        weights, source = weights_from_config(path, layout, dtype, True, WHISPER_MODEL_TYPE), "config"
    if dtype is None:
        dtype = weights.weights_dtype
        unknown.append("dtype")
    heads = speech.decoder_attention_heads
    return ModelFacts(
        name=name or path.name, path=str(path), architecture=architecture, model_type=WHISPER_MODEL_TYPE,
        num_layers=speech.decoder_layers, hidden_size=speech.d_model, intermediate_size=speech.decoder_ffn_dim,
        num_attention_heads=heads, num_kv_heads=heads, head_dim=speech.d_model // heads, vocab_size=vocab,
        tie_word_embeddings=True, max_position_embeddings=speech.max_target_positions, rope_theta=None,
        rope_scaling=None, sliding_window=None, layer_types=(FULL_ATTENTION,) * speech.decoder_layers,
        dtype=dtype, weights_dtype=weights.weights_dtype, param_bytes=weights.param_bytes, param_source=source,
        num_params=weights.num_params, linear_layers=weights.linear_layers,
        quantization_config=config_json.quantization_config(path, config),
        tokenizer=has_tokenizer(path), chat_template=False, unknown=tuple(unknown + weights.unknown),
        modality="speech", speech=speech,
    )
