"""vLLM load format ``edgectl_gguf``: build a model straight from a GGUF file.

vLLM 0.32 has no GGUF loader (``vllm/model_executor/model_loader/`` holds none), so the plugin
registers this one (``register_model_loader``, ``model_loader/__init__.py``). The model
directory is what ``edgectl models pull`` writes for a GGUF (``edgectl/models/convert.py``):
``config.json`` made from the GGUF metadata, the tokenizer made from the GGUF's, and the GGUF
itself as :data:`GGUF_FILE`. Nothing is downloaded.

Loading, tensor by tensor, read from the file at its offset (nothing else of the file is held):

1. every layer whose ``cpu_int4`` method takes GGUF blocks (edgectl's kernels: ``takes_gguf``)
   gets its tensors' raw blocks — the q/k/v and gate/up parts of a merged layer in vLLM's order —
   with llama.cpp's q/k row permutation undone on the raw rows; the method converts them
   (``formats/ggml.py``: Q4_0/Q4_1 are W4 and Q8_0/Q5_0 are W8 as they are);
2. every other tensor (norms, biases; every weight of a bf16 plan or of another kernel) is
   dequantized to fp32 here (``formats.ggml.dequantize``), corrected (Gemma's norms stored plus
   one), cast to the model's dtype and given to the model's own ``load_weights``, which merges
   and quantizes it as for a safetensors checkpoint.

A tensor that maps to no parameter, or a parameter no tensor fed, is an error (the file does
not describe the model its config says).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import torch
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from edgectl.contract import gguf_names
from edgectl.contract.gguf_header import GGUFHeader, GGUFTensor, read_gguf
from edgectl.contract.gguf_names import DIRECT_GGUF
from edgectl.contract.vllm_args import GGUF_LOAD_FORMAT
from edgectl_runtime.formats import ggml

logger = logging.getLogger("edgectl.gguf_loader")

LOAD_FORMAT = GGUF_LOAD_FORMAT
GGUF_FILE = DIRECT_GGUF


class GGUFFile:
    """The tensors of one GGUF file, read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: GGUFHeader = read_gguf(path)
        self.arch = self.header.architecture or ""
        self.tensors: dict[str, GGUFTensor] = {t.name: t for t in self.header.tensors}
        self._f = path.open("rb")

    def close(self) -> None:
        self._f.close()

    def raw(self, t: GGUFTensor) -> torch.Tensor:
        """uint8 ``[rows, row_bytes]`` (a 1-D tensor is one row)."""
        self._f.seek(self.header.data_offset + t.offset)
        buf = bytearray(t.nbytes)
        if self._f.readinto(buf) != t.nbytes:
            raise ValueError(f"{self.path}: tensor {t.name} is cut short (the file was truncated)")
        rows = t.numel // t.dims[0]
        return torch.frombuffer(buf, dtype=torch.uint8).reshape(rows, -1)

    def rows_in_order(self, t: GGUFTensor, config) -> torch.Tensor:
        """Raw rows, with llama.cpp's per-head q/k permutation undone."""
        raw = self.raw(t)
        heads = gguf_names.heads_of(self.arch, t.name, {
            "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads})
        if heads is not None:
            if len(t.dims) != 2:
                raise ValueError(f"{self.path}: {t.name}: a permuted q/k bias is not supported")
            raw = raw[torch.tensor(gguf_names.unpermute_order(raw.shape[0], heads))]
        return raw

    def values(self, t: GGUFTensor, config) -> torch.Tensor:
        """fp32 in PyTorch's shape, in vLLM's terms (rows unpermuted, norm offset removed)."""
        w = ggml.dequantize(self.rows_in_order(t, config), t.type.name, t.dims[0]).reshape(t.shape)
        offset = gguf_names.NORM_OFFSET.get(self.arch)
        if offset and t.name.endswith("norm.weight"):
            w = w - offset
        return w


def _text_config(model_config):
    hf = model_config.hf_config
    return hf.get_text_config() if hasattr(hf, "get_text_config") else hf


def _block_layers(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    for prefix, module in model.named_modules():
        if getattr(getattr(module, "quant_method", None), "takes_gguf", False):
            yield prefix, module


def _parts(model: torch.nn.Module, prefix: str) -> list[str]:
    """vLLM's unmerged weight names of module ``prefix`` (``...qkv_proj`` -> q, k, v)."""
    parent, _, leaf = prefix.rpartition(".")
    mapping = getattr(model, "packed_modules_mapping", {}) or {}
    subs = mapping.get(leaf, [leaf])
    return [f"{parent}.{s}.weight" if parent else f"{s}.weight" for s in subs]


@register_model_loader(LOAD_FORMAT)
class GGUFModelLoader(BaseModelLoader):
    """See the module docstring."""

    def download_model(self, model_config) -> None:
        path = Path(model_config.model) / GGUF_FILE
        if not path.is_file():
            raise ValueError(f"{model_config.model} holds no {GGUF_FILE}: load format {LOAD_FORMAT} reads a "
                             "directory written by `edgectl models pull` from a GGUF file")

    def load_weights(self, model: torch.nn.Module, model_config) -> None:
        self.download_model(model_config)
        gguf = GGUFFile(Path(model_config.model) / GGUF_FILE)
        try:
            self._load(model, model_config, gguf)
        finally:
            gguf.close()

    def _load(self, model: torch.nn.Module, model_config, gguf: GGUFFile) -> None:
        config = _text_config(model_config)
        used: set[str] = set()
        direct: set[str] = set()
        for prefix, module in _block_layers(model):
            parts = []
            for hf in _parts(model, prefix):
                name = gguf_names.gguf_name(gguf.arch, hf)
                t = gguf.tensors.get(name or "")
                if t is None:
                    raise ValueError(f"{gguf.path}: no tensor {name or '?'} for {hf} (the file does not hold "
                                     "the model its metadata describes)")
                parts.append((t.type.name, gguf.rows_in_order(t, config), t.dims[0]))
                used.add(t.name)
            module.quant_method.load_gguf(module, parts)
            direct.add(prefix)

        dtype = model_config.dtype
        unknown: list[str] = []

        def rest() -> Iterator[tuple[str, torch.Tensor]]:
            for t in gguf.header.tensors:
                if t.name in used:
                    continue
                hf = gguf_names.hf_name(gguf.arch, t.name)
                if hf is None:
                    unknown.append(t.name)
                    continue
                yield hf, gguf.values(t, config).to(dtype)

        loaded = set(model.load_weights(rest()))
        if unknown:
            raise ValueError(f"{gguf.path}: tensors edgectl does not map to {gguf.arch}'s parameters: "
                             f"{', '.join(unknown[:5])}{' …' if len(unknown) > 5 else ''}")
        # By module: a layer quantized as it loads (vLLM's layer-wise path) has swapped the
        # parameter the checkpoint fed for its packed ones.
        fed = direct | {name.rpartition(".")[0] for name in loaded}
        missing = sorted(name for name, _ in model.named_parameters() if name.rpartition(".")[0] not in fed)
        if missing:
            raise ValueError(f"{gguf.path}: no tensor fed {', '.join(missing[:5])}"
                             f"{' …' if len(missing) > 5 else ''}")
        logger.info("edgectl: loaded %s (%d tensors; %d layers from GGUF blocks)", gguf.path.name,
                    len(gguf.header.tensors), len(direct))
