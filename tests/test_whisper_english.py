"""The English-only Whisper of edgectl's vLLM plugin (runtime/edgectl_runtime/vllm_plugin/whisper_english.py):
its prompt, its languages and its lazy registration. The real engine transcribing tiny.en with it is
checked by hand (see the module's docstring); here only vLLM's classes are imported (about 10 s)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.runtime


@pytest.fixture(scope="module")
def english_only():
    np = pytest.importorskip("numpy")
    from vllm.config import SpeechToTextConfig
    from vllm.config.speech_to_text import SpeechToTextParams

    from edgectl_runtime.vllm_plugin.whisper_english import (
        WhisperEnglishOnlyForConditionalGeneration,
    )

    def params(**kw):
        return SpeechToTextParams(audio=np.zeros(1600, dtype=np.float32), stt_config=SpeechToTextConfig(),
                                  model_config=None, **kw)

    return WhisperEnglishOnlyForConditionalGeneration, params


def test_the_prompt_has_no_language_and_no_task(english_only) -> None:
    cls, params = english_only
    prompt = cls.get_generation_prompt(params(language="en"))
    assert prompt["decoder_prompt"]["prompt"] == "<|startoftranscript|><|notimestamps|>"
    assert prompt["encoder_prompt"]["multi_modal_data"]["audio"][1] == 16000
    with_previous = cls.get_generation_prompt(params(language="en", request_prompt="Hello."))
    assert with_previous["decoder_prompt"]["prompt"] == "<|prev|>Hello.<|startoftranscript|><|notimestamps|>"
    with pytest.raises(ValueError, match="does not translate"):
        cls.get_generation_prompt(params(language="en", task_type="translate"))


def test_english_is_the_only_language_and_none_is_english(english_only) -> None:
    cls, _ = english_only
    assert cls.validate_language(None) == "en" and cls.validate_language("en") == "en"
    with pytest.raises(ValueError, match="English-only"):
        cls.validate_language("de")
    assert cls.supports_explicit_language_detection is False  # no detection pass before each request


def test_the_plugin_registers_it_lazily() -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    from edgectl.contract.whisper_names import ARCHITECTURE, ENGLISH_ONLY_ARCHITECTURE
    from edgectl_runtime.vllm_plugin import register_whisper

    register_whisper()
    assert {ARCHITECTURE, ENGLISH_ONLY_ARCHITECTURE} <= set(ModelRegistry.get_supported_archs())
    assert ModelRegistry.models[ENGLISH_ONLY_ARCHITECTURE].module_name == "edgectl_runtime.vllm_plugin.whisper_english"
    assert ModelRegistry.models[ARCHITECTURE].module_name == "edgectl_runtime.vllm_plugin.whisper_exact_top"


def test_it_keeps_the_exact_best_logits(english_only) -> None:
    from edgectl_runtime.vllm_plugin.whisper_exact_top import (
        WhisperExactTopForConditionalGeneration,
    )

    cls, _ = english_only
    assert issubclass(cls, WhisperExactTopForConditionalGeneration)
