"""`edgectl models pull FILE.gguf --mmproj FILE`: llama.cpp's GGUF pair of a vision-language model turned
back into the Hugging Face directory it was converted from (edgectl/models/pull_pair.py,
runtime/edgectl_runtime/tools/convert_gguf_vlm.py).

A pair edgectl cannot turn back is refused with one line, exit 2, the cache untouched (small files written
with gguf-py's GGUFWriter, llama.cpp's own writer). The round trip writes a real pair with llama.cpp's
converter from a tiny directory made by the synthetic VLM maker (a 2-layer language model with SmolLM2's
tokenizer, a 2-layer tower on 64x64 tiles), pulls it back and compares every tensor and setting with the
directory it came from; it needs the runtime, a llama.cpp build (scripts/llama_cpp.sh) and the pulled
smollm2-135m's tokenizer, and is skipped, saying which is missing, without them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from models_helpers import run_cli
from test_models_gguf import write_tiny
from test_models_synthetic_vision import TINY, _make

from edgectl.errors import EdgectlError

gguf = pytest.importorskip("gguf")


def write_mmproj(path: Path, *, width: int = 64, projector: str = "idefics3", hidden: int = 32,
                 scale: int = 2, arch: str = "clip") -> Path:
    """A tiny vision projector as llama.cpp's converter writes one (MmprojModel.set_gguf_parameters,
    SmolVLMModel): its metadata and the connector's projection to ``width``."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", "mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_uint32("clip.vision.projection_dim", width)
    for key, value in (("image_size", 64), ("patch_size", 16), ("embedding_length", hidden),
                       ("feed_forward_length", 2 * hidden), ("block_count", 1), ("attention.head_count", 2),
                       ("projector.scale_factor", scale), ("preproc_image_size", 128)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_string("clip.projector_type", projector)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_tensor("mm.model.fc.weight", np.zeros((width, hidden * scale * scale), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_pair_edgectl_cannot_turn_back_is_refused_with_one_line_and_nothing_written(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    text = write_tiny(tmp_path / "text.gguf")  # llama, 64 wide
    mmproj = write_mmproj(tmp_path / "mmproj.gguf")
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a GGUF\n")
    cases = [
        ([str(text), "--mmproj", str(tmp_path / "absent.gguf")], "absent.gguf: no such file"),
        ([str(text), "--mmproj", str(not_gguf)], "not a GGUF file"),
        ([str(text), "--mmproj", str(write_mmproj(tmp_path / "gemma.gguf", projector="gemma3"))],
         "clip.projector_type is 'gemma3'; edgectl turns back idefics3 (with a llama language model) only"),
        ([str(text), "--mmproj", str(write_mmproj(tmp_path / "narrow.gguf", width=32))],
         "projects images to width 32, the language model"),
        ([str(write_tiny(tmp_path / "qwen.gguf", arch="qwen2")), "--mmproj", str(mmproj)],
         "a qwen2 language model; edgectl turns back llama.cpp pairs of idefics3 (with a llama language model) only"),
        ([str(mmproj), "--mmproj", str(text)], "is a vision projector (general.architecture 'clip')"),
        ([str(text), "--mmproj", str(text)], "general.architecture is 'llama', a vision projector's is 'clip'"),
        ([str(write_tiny(tmp_path / "bare.gguf", template=None)), "--mmproj", str(mmproj)], "no tokenizer.chat_template"),
        (["smollm2-135m", "--mmproj", str(mmproj)], "--mmproj goes with the language model's GGUF file"),
        ([str(text), "--name", "mine"], "--name names a llama.cpp pair pulled with --mmproj"),
        ([str(mmproj)], "is llama.cpp's vision projector of a vision-language model: pull it with its language model"),
        ([str(text), "--mmproj", str(mmproj), "--name", "My Model"], "--name 'My Model': a cache name is"),
        ([str(text), "--mmproj", str(mmproj), "--name", "smollm2-135m"], "smollm2-135m is a catalog model's name"),
    ]
    for args, needle in cases:
        done = run_cli(["models", "pull", *args], env={"EDGECTL_MODEL_CACHE": str(cache)}, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (args, done.stderr)
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        assert needle in done.stderr, (needle, done.stderr)
        assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file() and ".locks" not in p.parts]


def test_another_model_of_that_name_is_not_overwritten(tmp_path: Path) -> None:
    from edgectl.models.pull_pair import pull_pair

    cache = tmp_path / "cache"
    (cache / "text").mkdir(parents=True)
    (cache / "text" / "config.json").write_text("{}")
    with pytest.raises(EdgectlError, match="already holds another model: give the pair another name with --name"):
        pull_pair(write_tiny(tmp_path / "text.gguf"), write_mmproj(tmp_path / "m.gguf"),
                  {"EDGECTL_MODEL_CACHE": str(cache)})
    assert sorted(p.name for p in (cache / "text").iterdir()) == ["config.json"]


# --- the round trip, with llama.cpp's converter (needs the runtime and a llama.cpp build) ----------------


def _llama_converter() -> Path:
    from edgectl.llamacpp import find_llama_tools

    try:
        return find_llama_tools(os.environ).convert_script
    except EdgectlError as exc:
        pytest.skip(str(exc))


def _smollm2_tokenizer() -> Path:
    """The pulled smollm2-135m's directory: its tokenizer is SmolLM2's, whose pre-tokenizer llama.cpp's
    converter knows (the tests' 5-token stub is not one it converts)."""
    from edgectl.models.cache import model_dir
    from edgectl.models.catalog import CATALOG

    path = model_dir(CATALOG["smollm2-135m"], os.environ)
    if not (path / "tokenizer.json").is_file():
        pytest.skip("smollm2-135m is not pulled (`edgectl models pull smollm2-135m`): its tokenizer is the tiny model's")
    return path


def make_tiny_pair(root: Path, *, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                   outtypes: tuple[str, ...] = ("bf16", "q8_0")) -> dict[str, Path]:
    """A tiny Idefics3 directory (the maker's, SmolLM2's tokenizer and 49280 rows, as the shape model) and
    llama.cpp's pair of it: the language model in each of ``outtypes`` (``text`` for bf16, ``text_q8_0``...),
    the projector in bf16. Skipped, saying why, without llama.cpp's converter or SmolLM2's tokenizer."""
    torch = pytest.importorskip("torch")
    from installed import RUNTIME_PYTHON
    from safetensors.torch import save_file

    script, tokenizer = _llama_converter(), _smollm2_tokenizer()
    lm = root / "lm"
    lm.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (lm / f).write_bytes((tokenizer / f).read_bytes())
    h, i = 64, 128
    (lm / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "vocab_size": 49152, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "hidden_act": "silu"}))
    g = torch.Generator().manual_seed(0)
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = {"model.embed_tokens.weight": (49152, h), "model.norm.weight": (h,)}
    for n in range(2):
        p = f"model.layers.{n}."
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
                   p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    save_file({n: (torch.randn(s, generator=g) * 0.1).to(torch.bfloat16) for n, s in shapes.items()},
              str(lm / "model.safetensors"))
    vlm = root / "tiny-vlm"
    _make(vlm, lm, {**TINY.maker_spec(), "vocab_size": 49280})
    out = {"directory": vlm}
    runs = [("text" if t == "bf16" else f"text_{t}", ["--outtype", t]) for t in outtypes]
    for what, extra in [*runs, ("mmproj", ["--outtype", "bf16", "--mmproj"])]:
        out[what] = root / f"{what}.gguf"
        done = subprocess.run([RUNTIME_PYTHON, str(script), str(vlm), *extra, "--outfile", str(out[what])],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """4 query heads, 2 KV heads of 16: llama.cpp permutes both."""
    return make_tiny_pair(tmp_path_factory.mktemp("pair"))


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _same_float32(a: float, b: float) -> bool:
    return bool(np.float32(a) == np.float32(b))


@pytest.mark.runtime
def test_the_pair_comes_back_as_the_directory_it_was_converted_from(tmp_path: Path, tiny_pairs: dict[str, Path]) -> None:
    torch = pytest.importorskip("torch")
    from PIL import Image
    from transformers import AutoProcessor

    from edgectl.models import inspect_model
    from edgectl.models.cache import LAYOUT_HF, read_manifest, sha256_file
    from edgectl.models.config_json import rope
    from edgectl.models.pull_pair import pull_pair

    env = {**os.environ, "EDGECTL_MODEL_CACHE": str(tmp_path / "cache")}
    src = tiny_pairs["directory"]
    result = pull_pair(tiny_pairs["text"], tiny_pairs["mmproj"], env, name="tiny-pair")
    got = result.path
    assert result.action == "pulled" and got == tmp_path / "cache" / "tiny-pair"
    assert sorted(p.name for p in got.iterdir()) == [
        "chat_template.jinja", "config.json", "edgectl-model.json", "model.safetensors", "processor_config.json",
        "tokenizer.json", "tokenizer_config.json"]

    # every tensor, bit for bit (llama.cpp's q/k permutation undone; norms and embeddings widened to F32 and back)
    want, have = _tensors(src), _tensors(got)
    assert set(have) == set(want)
    for name, t in want.items():
        assert have[name].dtype == torch.bfloat16 and have[name].shape == t.shape, name
        assert torch.equal(have[name].view(torch.int16), t.view(torch.int16)), name

    # config.json: what vLLM and the planner read
    a, b = json.loads((src / "config.json").read_text()), json.loads((got / "config.json").read_text())
    for key in ("architectures", "model_type", "image_token_id", "scale_factor", "tie_word_embeddings", "pad_token_id"):
        assert b[key] == a[key], key
    assert b["vision_config"] == a["vision_config"]  # layer_norm_eps back as the float32 llama.cpp stored
    ta, tb = a["text_config"], b["text_config"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id"):
        assert tb[key] == ta[key], key
    assert _same_float32(tb["rms_norm_eps"], ta["rms_norm_eps"])  # GGUF keeps float32
    assert rope(tb)[0] == (rope(ta)[0] or 10000.0) and rope(tb)[1] is None  # LlamaConfig's default base when unset

    # the processor: the same settings, the same tokens and pixels for an image, the same chat template
    pa = json.loads((src / "processor_config.json").read_text())
    pb = json.loads((got / "processor_config.json").read_text())
    assert pb["image_seq_len"] == pa["image_seq_len"]
    for key, value in pb["image_processor"].items():
        assert pa["image_processor"][key] == value, key
    assert (got / "chat_template.jinja").read_text() == (src / "chat_template.jinja").read_text()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    image = Image.new("RGB", (300, 200), (200, 30, 30))
    inputs = []
    for d in (src, got):
        processor = AutoProcessor.from_pretrained(str(d))
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs.append(processor(text=prompt, images=[image], return_tensors="pt"))
    assert torch.equal(inputs[0]["input_ids"], inputs[1]["input_ids"])
    assert torch.equal(inputs[0]["pixel_values"], inputs[1]["pixel_values"])

    # pulled like a directory: inspected as one, its manifest naming both files
    facts = inspect_model(got)
    assert facts.vision is not None and facts.vision.image_token_id == a["image_token_id"]
    manifest = read_manifest(got)
    assert manifest is not None and manifest["layout"] == LAYOUT_HF
    assert manifest["source"]["kind"] == "llama.cpp pair"
    for what in ("text", "mmproj"):
        assert manifest["source"][what] == {"path": str(tiny_pairs[what]), "sha256": sha256_file(tiny_pairs[what]),
                                            "bytes": tiny_pairs[what].stat().st_size}
    assert pull_pair(tiny_pairs["text"], tiny_pairs["mmproj"], env, name="tiny-pair").action == "already pulled"


@pytest.mark.runtime
def test_a_q8_0_language_model_comes_back_within_one_quantization_step(tmp_path: Path,
                                                                        tiny_pairs: dict[str, Path]) -> None:
    """Q8_0 keeps each block of 32 weights as int8 times one fp16 scale (max |block| / 127): dequantized
    and rounded to bf16, each weight is within one step of the tensor's largest block of the original
    (measured: 0.5-0.75 of it), the RMS error about 0.6%; the tower (bf16 in its file) comes back bit for bit."""
    torch = pytest.importorskip("torch")
    from edgectl.models.pull_pair import pull_pair

    env = {**os.environ, "EDGECTL_MODEL_CACHE": str(tmp_path / "cache")}
    got = pull_pair(tiny_pairs["text_q8_0"], tiny_pairs["mmproj"], env, name="tiny-q8").path
    want, have = _tensors(tiny_pairs["directory"]), _tensors(got)
    assert set(have) == set(want)
    quantized = 0
    for name, t in want.items():
        a, b = t.float(), have[name].float()
        if torch.equal(a, b):
            continue
        assert name.startswith("model.text_model.") and t.dim() == 2, name
        quantized += 1
        assert float((a - b).abs().max()) <= float(a.abs().max()) / 127, name
        assert float((a - b).pow(2).mean().sqrt()) <= 0.01 * float(a.pow(2).mean().sqrt()), name
    assert quantized == 15  # the embedding table and the 7 linear layers of each of the 2 layers
