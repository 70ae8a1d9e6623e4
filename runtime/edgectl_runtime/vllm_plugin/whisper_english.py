"""An English-only Whisper (tiny.en, every ``*.en`` model) served the way it was trained.

vLLM 0.32's ``WhisperForConditionalGeneration.get_generation_prompt``
(vllm/model_executor/models/whisper.py) always builds ``<|startoftranscript|><|lang|><|task|><|notimestamps|>``,
and detects a language first when the request names none (``supports_explicit_language_detection``,
vllm/entrypoints/speech_to_text/base/serving.py ``_preprocess_speech_to_text``). An English-only model
was trained on ``<|startoftranscript|><|notimestamps|>``: given a language and a task it emits
end-of-text at once, and answers empty text (docs/speech-research.md, checked with CTranslate2).

This class is the same model with that prompt: English is the only language it accepts (none means
English, with no detection pass), and it only transcribes. vLLM imports this module only when a
server names its architecture (``edgectl.contract.whisper_names.ENGLISH_ONLY_ARCHITECTURE``, registered
lazily by the plugin's ``register``); everything else (weights, processor, KV, the exact best logits of
``whisper_exact_top.py``) is the parent's.

Checked against the real engine (2026-12-03, x86_64-amx; ``vllm.entrypoints.openai.api_server --model
<cache>/whisper-tiny-en --hf-overrides '{"architectures": ["EdgectlWhisperEnglishOnlyForConditionalGeneration"]}'``,
an espeak-ng clip): json and verbose_json answer the sentence (with segments), ``language=de`` and
/v1/audio/translations a 400 naming why. The same server without the override answered ``""`` with
``language=en`` and a 500 with no language (its detection pass).
"""

from __future__ import annotations

from vllm.config.speech_to_text import SpeechToTextParams
from vllm.inputs import ExplicitEncoderDecoderPrompt, PromptType, TextPrompt

from edgectl_runtime.vllm_plugin.whisper_exact_top import (
    WhisperExactTopForConditionalGeneration,
)

# The prompt an English-only Whisper was trained on (openai-whisper, whisper/tokenization.py
# ``sot_sequence``: no language or task token when the tokenizer is not multilingual).
ENGLISH_ONLY_PROMPT = "<|startoftranscript|><|notimestamps|>"


class WhisperEnglishOnlyForConditionalGeneration(WhisperExactTopForConditionalGeneration):
    supports_explicit_language_detection = False
    supported_languages = {"en": "English"}

    @classmethod
    def validate_language(cls, language: str | None) -> str | None:
        if language not in (None, "en"):
            raise ValueError(f"Unsupported language: {language!r}. This model is English-only: give 'en' or no "
                             "language.")
        return "en"

    @classmethod
    def get_generation_prompt(cls, stt_params: SpeechToTextParams) -> PromptType:
        if stt_params.task_type != "transcribe":
            raise ValueError("This model is English-only: it transcribes English, it does not translate.")
        request_prompt = stt_params.request_prompt
        # the previous text as the stock prompt gives it (whisper.py, get_generation_prompt)
        decoder_text = (f"<|prev|>{request_prompt}" if request_prompt else "") + ENGLISH_ONLY_PROMPT
        return ExplicitEncoderDecoderPrompt(
            encoder_prompt=TextPrompt(prompt="", multi_modal_data={"audio": (stt_params.audio,
                                                                             stt_params.stt_config.sample_rate)}),
            decoder_prompt=TextPrompt(prompt=decoder_text),
        )
