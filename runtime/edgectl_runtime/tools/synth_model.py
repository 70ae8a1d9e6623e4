"""Make a synthetic Hugging Face model: a real architecture's shape, seeded random weights, a local tokenizer.

Run by ``edgectl models pull`` for a synthetic catalog entry (edgectl/models/synthetic.py), under the
runtime interpreter, in a subprocess::

    python -P .../edgectl_runtime/tools/synth_model.py SPEC_JSON OUT_DIR

``SPEC_JSON`` is one JSON object: ``config`` (the config.json keys of the shape, e.g. Llama-3.2-1B's),
``seed`` and ``tokenizer_pieces``. ``OUT_DIR`` must not exist or be empty. It receives:

- ``config.json``: ``LlamaForCausalLM`` with the given shape, bf16, tied embeddings as given;
- ``model.safetensors``: every weight drawn from N(0, 0.02²) (the norms are ones), each tensor from its
  own ``torch.Generator`` seeded from ``seed`` and the tensor's name, so the bytes do not depend on the
  order of the writes or the number of threads. The rows of the (tied) embedding table for the ids
  that are not ordinary text pieces — the 3 special tokens, the 256 byte-fallback pieces and the
  unused ids up to ``vocab_size`` — are zero: their logit is then exactly 0 against the random ones
  of the 32000 pieces, so greedy decoding never picks them. Otherwise most generated tokens would be
  unused ids, which llama.cpp streams as empty text (src/llama-vocab.cpp, ``token_to_piece``: an
  UNUSED token has no piece) and a byte piece may be half a UTF-8 character, both invisible to the
  bench's per-token timing (edgectl/bench/measure.py). A zero row costs the engines what any row
  costs: the kernels read every block whatever its values;
- ``tokenizer.model`` + ``tokenizer_config.json``: a SentencePiece BPE model with byte fallback
  (Llama 2's tokenizer family) trained here in about a second on the ASCII lines of this Python's own
  standard library sources (deterministic for a given Python version). The ids it does not use up to
  ``vocab_size`` become llama.cpp's ``[PAD<id>]`` tokens at conversion (conversion/base.py,
  ``_create_vocab_sentencepiece``), so the embedding table keeps the shape's full size.

Nothing is downloaded. Quality is not the point: the model answers nonsense; it exists so speed and
memory can be measured on a deployment-sized shape. On success the last line on stdout is one JSON
object (files, parameter count, tool versions). Exit codes: 0 done, 2 bad arguments, 1 failed.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import sysconfig
from pathlib import Path

TOOLS = ("torch", "safetensors", "sentencepiece")
INIT_STD = 0.02  # Llama's initializer_range
SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2, as Llama 2's tokenizer
FIRST_TEXT_PIECE = len(SPECIAL) + 256  # SentencePiece puts the byte-fallback pieces <0x00>..<0xFF> next


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    return {name: metadata.version(name) for name in TOOLS}


def training_lines() -> list[str]:
    """The ASCII, non-blank lines of the standard library's top-level modules, in file-name order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    lines = []
    for f in sorted(root.glob("*.py")):
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip() and line.isascii():
                lines.append(line)
    return lines


def train_tokenizer(pieces: int, out_dir: Path) -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    # BPE with byte fallback, digits split, whitespace kept as is: Llama 2's tokenizer settings; one thread
    # so the merges are the same on every machine.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()), model_writer=model, model_type="bpe", vocab_size=pieces,
        byte_fallback=True, split_digits=True, character_coverage=1.0, num_threads=1,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        max_sentence_length=1 << 16, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )
    (out_dir / "tokenizer.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": "LlamaTokenizer", "unk_token": SPECIAL[0], "bos_token": SPECIAL[1],
        "eos_token": SPECIAL[2], "add_bos_token": True, "add_eos_token": False, "legacy": False,
        "model_max_length": 1 << 30,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _generator(seed: int, name: str):
    import torch

    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def weight_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """LlamaForCausalLM's tensors for ``config`` (no lm_head when the embeddings are tied)."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or h // heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config["vocab_size"], h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (heads * head_dim, h),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, h),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, h),
            p + "self_attn.o_proj.weight": (h, heads * head_dim),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    shapes["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (config["vocab_size"], h)
    return shapes


def make(spec: dict, out_dir: Path) -> dict:
    import torch
    from safetensors.torch import save_file

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              **spec["config"]}
    pieces = int(spec["tokenizer_pieces"])
    if pieces > config["vocab_size"]:
        raise ValueError(f"tokenizer_pieces {pieces} > vocab_size {config['vocab_size']}")
    train_tokenizer(pieces, out_dir)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    tensors, params = {}, 0
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, generator=_generator(spec["seed"], name), dtype=torch.float32)
                 * INIT_STD).to(torch.bfloat16)
        if name == "model.embed_tokens.weight":
            t[:FIRST_TEXT_PIECE] = 0
            t[pieces:] = 0
        tensors[name] = t
        params += t.numel()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    files = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())
    return {"files": files, "parameters": params, "tools": tool_versions()}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python .../synth_model.py SPEC_JSON OUT_DIR", file=sys.stderr)
        return 2
    try:
        spec = json.loads(args[0])
        spec["config"]["vocab_size"], spec["seed"], spec["tokenizer_pieces"]  # noqa: B018 (presence)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"error: SPEC_JSON is not a synthetic model spec ({exc})", file=sys.stderr)
        return 2
    out_dir = Path(args[1])
    if out_dir.exists() and any(out_dir.iterdir()):
        print(f"error: {out_dir} is not empty", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    result = make(spec, out_dir)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
