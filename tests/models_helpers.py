"""Helpers for the model tests: real safetensors files written without torch, model
directories built from the config-only shapes, and the CLI run as a user runs it."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = Path(__file__).resolve().parent / "model_shapes"

# bytes per element for the dtypes the tests write
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "I8": 1}


def write_safetensors(path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> None:
    """A valid safetensors file (the format of safetensors' README) whose tensors are all zero.

    The data is written as a sparse region (seek + one byte), so a multi-GB layout costs no disk.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        nbytes = math.prod(shape) * _ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes with spaces
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        if offset:
            f.seek(offset - 1, os.SEEK_CUR)
            f.write(b"\0")


def llama_tensors(*, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
                  vocab: int, head_dim: int | None = None, tied: bool = True,
                  dtype: str = "BF16") -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensor names and shapes transformers' LlamaForCausalLM saves."""
    hd = head_dim or hidden // heads
    t: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": (dtype, (vocab, hidden))}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.q_proj.weight"] = (dtype, (heads * hd, hidden))
        t[f"{p}.self_attn.k_proj.weight"] = (dtype, (kv_heads * hd, hidden))
        t[f"{p}.self_attn.v_proj.weight"] = (dtype, (kv_heads * hd, hidden))
        t[f"{p}.self_attn.o_proj.weight"] = (dtype, (hidden, heads * hd))
        t[f"{p}.mlp.gate_proj.weight"] = (dtype, (intermediate, hidden))
        t[f"{p}.mlp.up_proj.weight"] = (dtype, (intermediate, hidden))
        t[f"{p}.mlp.down_proj.weight"] = (dtype, (hidden, intermediate))
        t[f"{p}.input_layernorm.weight"] = (dtype, (hidden,))
        t[f"{p}.post_attention_layernorm.weight"] = (dtype, (hidden,))
    t["model.norm.weight"] = (dtype, (hidden,))
    if not tied:
        t["lm_head.weight"] = (dtype, (vocab, hidden))
    return t


# A small Llama, big enough to have every kind of tensor: 2 layers, hidden 64, 4 heads of 16,
# 2 KV heads, intermediate 128, vocab 256.
TINY = {"layers": 2, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2, "vocab": 256}


def tiny_config(**overrides: object) -> dict[str, object]:
    config: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": TINY["hidden"],
        "intermediate_size": TINY["intermediate"], "num_hidden_layers": TINY["layers"],
        "num_attention_heads": TINY["heads"], "num_key_value_heads": TINY["kv_heads"],
        "vocab_size": TINY["vocab"], "max_position_embeddings": 2048, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def make_model(root: Path, config: Mapping[str, object] | None = None,
               tensors: Mapping[str, tuple[str, tuple[int, ...]]] | None = None,
               *, tokenizer: bool = True) -> Path:
    """A model directory: config.json, model.safetensors and the stub tokenizer of the shapes."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config if config is not None else tiny_config()))
    write_safetensors(root / "model.safetensors", tensors if tensors is not None else llama_tensors(**TINY))
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(SHAPES / "smollm2-135m" / name, root / name)
    return root


def copy_shape(name: str, dest: Path) -> Path:
    shutil.copytree(SHAPES / name, dest)
    return dest


def run_cli(args: list[str], env: Mapping[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m edgectl ARGS`` from this checkout, as a user runs it (real exit code and stderr)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "runtime"), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "edgectl", *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
