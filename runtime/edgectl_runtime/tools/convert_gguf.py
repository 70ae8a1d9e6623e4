"""Convert a GGUF file into a Hugging Face model directory, offline.

Run by ``edgectl models pull`` under the runtime interpreter, in a subprocess::

    python -m edgectl_runtime.tools.convert_gguf [--direct CONFIG_JSON] GGUF OUT_DIR

With ``--direct`` the weights stay in the GGUF: the directory gets ``config.json`` made from the
GGUF metadata (CONFIG_JSON: ``model_type`` and the keyword arguments the control plane derived,
``edgectl/models/gguf_hf.py``, completed by transformers' config class of that model type), the
tokenizer and chat template made from the GGUF's, and the GGUF itself as ``model.gguf`` (a hard
link; a copy across file systems), which edgectl's load format ``edgectl_gguf`` reads
(``gguf_loader.py``). Without it (``edgectl.models.convert.bf16_copy``: for stock vLLM, which cannot
read a GGUF) the weights are dequantized to bfloat16 by transformers (a GGUF Q4_1 file becomes a
plain bf16 checkpoint), and the tokenizer and chat template embedded in the GGUF are written
beside them. ``OUT_DIR`` must not exist or be empty; the caller
writes into a temporary directory and renames it into place.

On success the last line on stdout is one JSON object: the files written and the versions
of the tools that wrote them (the caller records them in its manifest). Exit codes:
0 done, 2 bad arguments, 1 the conversion failed (the traceback is on stderr).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Nothing here may reach a model hub: the GGUF holds the weights, the config and the tokenizer.
# Set before transformers / huggingface_hub are imported (they read these at import time).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

TOOLS = ("transformers", "torch", "gguf", "safetensors", "tokenizers", "accelerate")


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def gguf_tokenizer(gguf_path: Path, metadata: dict):
    """The GGUF's tokenizer as transformers builds it, with ``tokenizer.ggml.add_bos_token`` /
    ``add_eos_token`` honoured: transformers' GGUF tokenizer drops them (Gemma-3's add_bos is true,
    and without its <bos> the model answers "France of France of ..."); llama.cpp honours them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    for key in ("add_bos_token", "add_eos_token"):
        value = metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(value, bool) and hasattr(tokenizer, key):
            setattr(tokenizer, key, value)
    return tokenizer


def convert(gguf_path: Path, out_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    pkg_dir, name = str(gguf_path.parent), gguf_path.name
    # Without GgufConfig(dequantize=True) save_pretrained refuses a GGUF-loaded model
    # (docs/facts.md, "The catalog model"); with it the written config has no quantization_config.
    model = AutoModelForCausalLM.from_pretrained(
        pkg_dir,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    model.save_pretrained(out_dir)
    del model
    from edgectl.contract.gguf_header import read_gguf

    gguf_tokenizer(gguf_path, read_gguf(gguf_path).metadata).save_pretrained(out_dir)
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    return {"files": files, "tools": tool_versions()}


def write_direct(gguf_path: Path, out_dir: Path, fields: dict) -> dict:
    """The small directory of a GGUF served as it is (see the module docstring)."""
    import shutil

    from transformers import AutoConfig

    from edgectl.contract.gguf_header import read_gguf
    from edgectl.contract.gguf_names import DIRECT_GGUF

    header = read_gguf(gguf_path)
    fields = dict(fields)
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    config.save_pretrained(out_dir)
    gguf_tokenizer(gguf_path, header.metadata).save_pretrained(out_dir)
    target = out_dir / DIRECT_GGUF
    try:
        os.link(gguf_path, target)
    except OSError:
        shutil.copyfile(gguf_path, target)
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    return {"files": files, "tools": tool_versions(), "direct": True}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fields = None
    if len(args) >= 2 and args[0] == "--direct":
        try:
            fields = json.loads(args[1])
        except ValueError:
            fields = None
        if not isinstance(fields, dict) or "model_type" not in fields:
            print("error: --direct takes the config as a JSON object with model_type", file=sys.stderr)
            return 2
        args = args[2:]
    if len(args) != 2:
        print("usage: python -m edgectl_runtime.tools.convert_gguf [--direct CONFIG_JSON] GGUF OUT_DIR", file=sys.stderr)
        return 2
    gguf_path, out_dir = Path(args[0]).resolve(), Path(args[1])
    if not gguf_path.is_file():
        print(f"error: {gguf_path} is not a file", file=sys.stderr)
        return 2
    if out_dir.exists() and any(out_dir.iterdir()):
        print(f"error: {out_dir} is not empty", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    result = write_direct(gguf_path, out_dir, fields) if fields is not None else convert(gguf_path, out_dir)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
