"""Turn llama.cpp's GGUF pair of a vision-language model back into the weights and tokenizer of the
Hugging Face directory it was converted from, offline (the inverse of llama.cpp's
``convert_hf_to_gguf.py`` for Idefics3 / SmolVLM; the names and what it changed:
``edgectl/contract/mmproj_names.py``).

Run by ``edgectl models pull FILE.gguf --mmproj FILE`` under the runtime interpreter, in a subprocess::

    python -P -m edgectl_runtime.tools.convert_gguf_vlm TEXT_GGUF MMPROJ_GGUF OUT_DIR

``OUT_DIR`` (absent or empty) receives ``model.safetensors`` (every tensor bf16, named as
transformers' ``Idefics3ForConditionalGeneration`` saves it) and the tokenizer made from the language
model's GGUF (``convert_gguf.gguf_tokenizer``, as a pulled GGUF's: ``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``). The control plane writes the configs
(``edgectl/models/llamacpp_pair.py``), which need the ``<image>`` token's id this tool reports.

Each tensor is read with gguf-py's ``GGUFReader`` (the ``gguf`` package vLLM installs): BF16 as it is
(its bits, exact), F32 narrowed to bf16 (exact for a bf16 original: llama.cpp widens norms and the
tower's embeddings to F32), F16 and quantized types (Q8_0, Q4_K, ...) through
``gguf.quants.dequantize`` to float32 then bf16 (the quantization's error stays). The language
model's q/k rows are put back in Hugging Face's order (llama.cpp's ``LlamaModel.permute`` undone,
``gguf_names.unpermute_order``). A tensor the mapping does not know, or a shape that is not the
GGUF's dims reversed, refuses the pair.

On success the last line on stdout is one JSON object: the tensors written, the image token's id,
the tensor types read and the tools' versions. Exit codes: 0 done, 2 bad arguments, 1 refused or
failed (the reason on stderr).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Nothing here may reach a model hub (the tokenizer is made by transformers): set before it is imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from edgectl.contract.gguf_names import heads_of, unpermute_order  # noqa: E402
from edgectl.contract.mmproj_names import projector_hf_name, text_hf_name  # noqa: E402

TOOLS = ("gguf", "torch", "safetensors", "transformers", "tokenizers")
IMAGE_TOKEN = "<image>"  # Idefics3Processor's image token (processing_idefics3.py)
SAFETENSORS = "model.safetensors"


class Refused(Exception):
    """The pair holds something this converter does not map."""


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    return {name: metadata.version(name) for name in TOOLS}


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def to_bf16(tensor: Any):
    """One GGUF tensor as a torch bf16 tensor of its Hugging Face shape (the GGUF's dims reversed)."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, quants

    shape = tuple(int(d) for d in reversed(tensor.shape))
    kind = tensor.tensor_type
    if kind == GGMLQuantizationType.BF16:
        bits = np.ascontiguousarray(tensor.data).view(np.int16).reshape(shape)
        return torch.from_numpy(bits.copy()).view(torch.bfloat16)
    if kind == GGMLQuantizationType.F32:
        values = np.array(tensor.data, dtype=np.float32)  # a copy: the reader maps the file read-only
    else:  # F16 and the quantized types: llama.cpp's own dequantization, in float32
        values = quants.dequantize(tensor.data, kind).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(values).reshape(shape)).to(torch.bfloat16)


def convert(text_gguf: Path, mmproj_gguf: Path, out_dir: Path) -> dict[str, Any]:
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file

    from edgectl.contract.gguf_header import read_gguf
    from edgectl_runtime.tools.convert_gguf import gguf_tokenizer

    text, mmproj = GGUFReader(str(text_gguf)), GGUFReader(str(mmproj_gguf))
    n_heads = int(_field(text, "llama.attention.head_count"))
    heads = {"num_attention_heads": n_heads,
             "num_key_value_heads": int(_field(text, "llama.attention.head_count_kv") or n_heads)}
    tensors: dict[str, torch.Tensor] = {}
    types: dict[str, int] = {}
    for reader, name_of, what in ((text, text_hf_name, text_gguf.name), (mmproj, projector_hf_name, mmproj_gguf.name)):
        for t in reader.tensors:
            name = name_of(t.name)
            if name is None:
                raise Refused(f"{what}: tensor {t.name} is not one of the {'language' if reader is text else 'projector'} "
                              "tensors edgectl maps back")
            if name in tensors:
                raise Refused(f"{what}: {name} twice")
            value = to_bf16(t)
            permuted = heads_of("llama", t.name, heads) if reader is text else None
            if permuted is not None:
                value = value[unpermute_order(value.shape[0], permuted)]
            tensors[name] = value.contiguous()
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    save_file(tensors, str(out_dir / SAFETENSORS), metadata={"format": "pt"})
    tokenizer = gguf_tokenizer(text_gguf, read_gguf(text_gguf).metadata)
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if not isinstance(image_token_id, int) or image_token_id == tokenizer.unk_token_id:
        raise Refused(f"{text_gguf.name}: its tokenizer has no {IMAGE_TOKEN} token, which Idefics3's processor puts "
                      "in place of an image: not a SmolVLM / Idefics3 language model")
    tokenizer.save_pretrained(str(out_dir))
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    return {"files": files, "tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values()),
            "image_token_id": image_token_id, "gguf_types": types, "tools": tool_versions()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m edgectl_runtime.tools.convert_gguf_vlm TEXT_GGUF MMPROJ_GGUF OUT_DIR", file=sys.stderr)
        return 2
    text_gguf, mmproj_gguf, out_dir = Path(args[0]).resolve(), Path(args[1]).resolve(), Path(args[2])
    for p in (text_gguf, mmproj_gguf):
        if not p.is_file():
            print(f"error: {p} is not a file", file=sys.stderr)
            return 2
    if out_dir.exists() and any(out_dir.iterdir()):
        print(f"error: {out_dir} is not empty", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = convert(text_gguf, mmproj_gguf, out_dir)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
