"""Helpers shared by the int4/quantize/rope engine tests (no tests here).

A tiny random-weight Llama written with transformers' ``save_pretrained`` plus a byte-level BPE
tokenizer trained in a second with ``tokenizers``: it loads in vLLM in seconds and has the
shapes the int4 rules care about (hidden 192 is not a multiple of 128, so q/k/v/o/gate/up get
group 64 for a preferred 128; down_proj has K = 384 and keeps 128).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNTIME_PYTHON = os.environ.get("EDGECTL_RUNTIME_PYTHON") or "/opt/edgectl/venv/bin/python"

TEXT = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "A small CPU box serves a language model with the least memory and the most speed.",
    "Quantized weights use four bits; scales and zeros are stored per group of columns.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
] * 20


def runtime_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a runtime subprocess: this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "runtime")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    # Each test states its levers. Kept: the interpreter, and the ISA level of edgectl's kernels,
    # a setting of the whole run (the suite is run once more with EDGECTL_KERNEL_ISA=avx2, next
    # to ATEN_CPU_CAPABILITY=avx2, to exercise the AVX2 paths on an AVX-512 machine).
    for key in [k for k in env if k.startswith("EDGECTL_") and k not in ("EDGECTL_RUNTIME_PYTHON", "EDGECTL_KERNEL_ISA")]:
        del env[key]
    env.update(extra or {})
    return env


def run_runtime(args: list[str], extra_env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([RUNTIME_PYTHON, *args], env=runtime_env(extra_env), capture_output=True, text=True,
                          timeout=timeout, cwd=str(REPO))


def build_tiny_llama(out: Path, *, tie: bool = True, vocab_pad: int = 0, seed: int = 0, max_pos: int = 4096,
                     rope_scaling: dict | None = None, layers: int = 2, dtype: str = "bfloat16") -> Path:
    """Write a tiny random Llama (safetensors + tokenizer) to ``out`` (runs in this process;
    needs torch and transformers, i.e. the runtime interpreter)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(out)
    vocab = len(fast) + vocab_pad
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=192, intermediate_size=384, num_hidden_layers=layers,
        num_attention_heads=3, num_key_value_heads=1, head_dim=64, max_position_embeddings=max_pos,
        tie_word_embeddings=tie, rms_norm_eps=1e-5, initializer_range=0.08,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        rope_scaling=rope_scaling,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out)
    for item in out.iterdir():
        item.chmod(0o644)
    return out


def write_gptq_checkpoint(src: Path, out: Path, group_size: int = 64) -> dict:
    """A symmetric 4-bit GPTQ (v1 format, desc_act=false) checkpoint of ``src``'s linear weights,
    quantized round-to-nearest, as AutoGPTQ lays it out: ``qweight`` int32 [K/8, N] packed along K,
    ``qzeros`` int32 [K/g, N/8] holding zp - 1 = 7, fp16 ``scales`` [K/g, N]. Returns, per linear
    weight, the (q [N, K], scales [N, K/g]) it stored."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from edgectl_runtime.formats.gptq_awq import pack_int32

    out.mkdir(parents=True)
    tensors = load_file(str(src / "model.safetensors"))
    written, stored = {}, {}
    for name, w in tensors.items():
        module = name[: -len(".weight")]
        if not (name.endswith("_proj.weight") and w.dim() == 2):
            written[name] = w
            continue
        n, k = w.shape
        groups = w.float().reshape(n, k // group_size, group_size)
        s = (groups.abs().amax(-1) / 7.0).clamp_min(1e-8).to(torch.float16)  # [N, G]
        q = (torch.round(groups / s.float().unsqueeze(-1)) + 8).clamp(0, 15).to(torch.uint8).reshape(n, k)
        written[f"{module}.qweight"] = pack_int32(q.t().contiguous(), 0)
        written[f"{module}.qzeros"] = pack_int32(torch.full((k // group_size, n), 7, dtype=torch.uint8), 1)
        written[f"{module}.scales"] = s.t().contiguous()
        written[f"{module}.g_idx"] = torch.arange(k, dtype=torch.int32) // group_size
        stored[module] = (q, s)
    save_file(written, str(out / "model.safetensors"), metadata={"format": "pt"})
    for item in src.iterdir():
        if item.name not in ("model.safetensors", "config.json"):
            shutil.copyfile(item, out / item.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False,
                                     "sym": True, "checkpoint_format": "gptq"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return stored


def read_json_line(stdout: str) -> dict:
    """The last line of a runtime script's stdout that parses as a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise AssertionError(f"no JSON result in output:\n{stdout[-2000:]}")


def python_has(module: str) -> bool:
    """Whether the runtime interpreter can import ``module``."""
    try:
        r = subprocess.run([RUNTIME_PYTHON, "-c", f"import {module}"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


if __name__ == "__main__":  # python tests/int4_helpers.py OUT_DIR [--untied] [--vocab-pad N]
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--untied", action="store_true")
    p.add_argument("--vocab-pad", type=int, default=0)
    p.add_argument("--max-pos", type=int, default=4096)
    p.add_argument("--rope-scaling", default=None)
    a = p.parse_args()
    build_tiny_llama(a.out, tie=not a.untied, vocab_pad=a.vocab_pad, max_pos=a.max_pos,
                     rope_scaling=json.loads(a.rope_scaling) if a.rope_scaling else None)
    print(json.dumps({"out": str(a.out)}))
    sys.exit(0)
