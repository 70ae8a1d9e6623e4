"""The synthetic vision-language catalog model (synth-smolvlm-256m): SmolVLM-256M's shape around the real
SmolLM2-135M, listed as synthetic, refused by `deploy`, and made by the maker into a directory transformers
loads with no missing or unexpected key and whose processor expands an image into its tokens.

The maker's tests run a *tiny* shape of the same spec (a 2-layer language model with SmolLM2's tokenizer,
a 2-layer vision tower on 64x64 tiles) through the same code; they need the runtime (torch, transformers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from models_helpers import SHAPES, run_cli

from edgectl import launch
from edgectl.errors import EdgectlError
from edgectl.models import CATALOG, inspect_model
from edgectl.models.pull import pull_entry

ENTRY = CATALOG["synth-smolvlm-256m"]
SPEC = ENTRY.synthetic
TINY_VISION = {**SPEC.config["vision_config"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "image_size": 64, "patch_size": 16}
TINY = dataclasses.replace(SPEC, config={**SPEC.config, "scale_factor": 2, "vision_config": TINY_VISION},
                           processor={**SPEC.processor, "image_seq_len": 4, "size": {"longest_edge": 128},
                                      "max_image_size": {"longest_edge": 64}})
TINY_TEXT = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "vocab_size": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
             "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "hidden_act": "silu"}


def _python() -> str:
    return os.environ.get("EDGECTL_RUNTIME_PYTHON", "/opt/edgectl/venv/bin/python")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_spec_is_smolvlm_256m_shape() -> None:
    v = SPEC.config["vision_config"]
    assert SPEC.config["architectures"] == ["Idefics3ForConditionalGeneration"] and SPEC.language_model == "smollm2-135m"
    assert (v["hidden_size"], v["num_hidden_layers"], v["num_attention_heads"], v["patch_size"], v["image_size"],
            SPEC.config["scale_factor"]) == (768, 12, 12, 16, 512, 4)
    # 32x32 patches per 512x512 tile, pixel-shuffled by 4x4: the processor's image_seq_len
    assert (512 // 16) ** 2 // 4 ** 2 == SPEC.processor["image_seq_len"] == 64
    # the parameter count the catalog states: the tower and connector, then SmolLM2-135M with 49280 rows
    h, i, patches = 768, 3072, 1024
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
    tower = 3 * 16 * 16 * h + h + patches * h + 12 * layer + 2 * h + (h * 16) * 576
    t, ti, kv = 576, 1536, 3 * 64
    text = 49280 * t + 30 * (2 * t * t + 2 * kv * t + 3 * t * ti + 2 * t) + t
    assert SPEC.parameters == tower + text == 228_099_648
    assert ENTRY.modality == "vision" and ENTRY.source_format == "safetensors" and ENTRY.gguf_sha256 is None


def test_list_says_it_is_synthetic(tmp_path: Path) -> None:
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path)}
    done = run_cli(["models", "list"], env=env)
    assert done.returncode == 0, done.stderr
    assert "synth-smolvlm-256m  [not pulled]  vision, SYNTHETIC: random weights" in done.stdout
    assert "edgectl models pull synth-smolvlm-256m" in done.stdout
    data = json.loads(run_cli(["models", "list", "--json"], env=env).stdout)
    (synth,) = [m for m in data["models"] if m["name"] == "synth-smolvlm-256m"]
    assert synth["kind"] == "synthetic" and synth["modality"] == "vision" and synth["source_format"] == "safetensors"
    assert synth["synthetic"]["language_model"] == "smollm2-135m" and "gguf_path" not in synth


def test_deploy_refuses_it(tmp_path: Path) -> None:
    done = run_cli(["deploy", "synth-smolvlm-256m", "--dry-run"], env={"EDGECTL_MODEL_CACHE": str(tmp_path / "m")})
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "synth-smolvlm-256m is synthetic" in line
    assert "Traceback" not in done.stderr and not (tmp_path / "m").exists()
    assert "or pass --allow-synthetic to deploy it knowingly" in line


def test_deploy_takes_it_only_with_the_flag_that_says_it_is_synthetic(tmp_path: Path) -> None:
    """By name, and its directory by path (its manifest says a synthetic pull made it)."""
    from vision_helpers import make_vlm

    from edgectl.models.cache import MANIFEST_NAME, MANIFEST_SCHEMA
    from edgectl.models.synthetic import is_synthetic, refuse_deploy

    done = run_cli(["deploy", "synth-smolvlm-256m", "--dry-run", "--allow-synthetic"],
                   env={"EDGECTL_MODEL_CACHE": str(tmp_path / "m")})
    assert "synth-smolvlm-256m is synthetic (random weights: its answers are nonsense), deployed as " \
           "--allow-synthetic asks" in done.stderr
    # past the refusal: the plan needs its files
    assert done.returncode == 2 and "is not pulled yet: run `edgectl models pull synth-smolvlm-256m`" in done.stderr
    d = make_vlm(tmp_path / "synth-smolvlm-256m")
    assert not is_synthetic(str(d))  # a directory without a manifest: the user's
    (d / MANIFEST_NAME).write_text(json.dumps({"schema": MANIFEST_SCHEMA, "name": ENTRY.name, "files": {},
                                               "source": {"kind": "synthetic"}}))
    assert is_synthetic(str(d)) and is_synthetic("synth-llama-1b") and not is_synthetic("smollm2-135m")
    with pytest.raises(EdgectlError, match=f"{d} is synthetic: .* or pass --allow-synthetic to deploy it knowingly"):
        refuse_deploy(str(d))
    assert refuse_deploy(str(d), allow_synthetic=True) is True
    assert refuse_deploy("smollm2-135m") is False


def test_pull_without_its_language_model_writes_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    with pytest.raises(EdgectlError, match=r"made from smollm2-135m's weights, which are not pulled: run "
                                           r"`edgectl models pull smollm2-135m` first"):
        pull_entry(ENTRY, {"EDGECTL_MODEL_CACHE": str(cache)}, lambda _: None, check_agreement=None)  # type: ignore[arg-type]
    assert not cache.exists()
    done = run_cli(["models", "pull", "synth-smolvlm-256m"], env={"EDGECTL_MODEL_CACHE": str(cache)})
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert not cache.exists()


# --- the maker, on a tiny shape (needs the runtime) ------------------------------------------


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer LlamaForCausalLM with seeded weights and the tests' 5-token stub of SmolLM2's tokenizer
    (tests/model_shapes/smollm2-135m: its special tokens, ChatML's), a 64-row embedding table."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    out = tmp_path_factory.mktemp("lm")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out / f).write_bytes((SHAPES / "smollm2-135m" / f).read_bytes())
    (out / "config.json").write_text(json.dumps(TINY_TEXT))
    g = torch.Generator().manual_seed(0)
    h, i, hd = 64, 128, 16
    shapes = {"model.embed_tokens.weight": (64, h), "model.norm.weight": (h,)}
    for n in range(2):
        p = f"model.layers.{n}."
        shapes |= {p + "self_attn.q_proj.weight": (4 * hd, h), p + "self_attn.k_proj.weight": (2 * hd, h),
                   p + "self_attn.v_proj.weight": (2 * hd, h), p + "self_attn.o_proj.weight": (h, 4 * hd),
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
                   p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    tensors = {n: (torch.randn(s, generator=g) * 0.1).to(torch.bfloat16) for n, s in shapes.items()}
    save_file(tensors, str(out / "model.safetensors"))
    return out


def _make(tmp: Path, lm: Path, spec: dict) -> dict:
    done = subprocess.run(launch.command(_python(), launch.SYNTH_VLM, [json.dumps(spec), str(lm), str(tmp)]),
                          env=launch.environment(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.runtime
def test_the_maker_writes_what_transformers_and_its_processor_load(tmp_path: Path, tiny_lm: Path) -> None:
    torch = pytest.importorskip("torch")
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    spec = {**TINY.maker_spec(), "vocab_size": 128}
    made = _make(tmp_path / "a", tiny_lm, spec)
    assert made["tokens"] == 5 + 40 and made["image_token_id"] == 6  # the image tokens follow the stub's 5
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    # SmolVLM's names: the top-level class vLLM loads, the text model's class llama.cpp's converter reads
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert config["text_config"]["architectures"] == ["VLlama3ForCausalLM"] and config["text_config"]["vocab_size"] == 128
    model, info = Idefics3ForConditionalGeneration.from_pretrained(str(tmp_path / "a"), output_loading_info=True,
                                                                   dtype=torch.float32)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    # the language model's weights as they are, its embedding table grown by zero rows
    written, lm = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tiny_lm / "model.safetensors"))
    assert torch.equal(written["model.text_model.layers.1.mlp.down_proj.weight"], lm["model.layers.1.mlp.down_proj.weight"])
    emb = written["model.text_model.embed_tokens.weight"]
    assert tuple(emb.shape) == (128, 64) and torch.equal(emb[:64], lm["model.embed_tokens.weight"])
    assert not emb[64:].any()
    # the image's tokens: a 64x64 image is one tile at max_image_size 64 resized to 128: 2x2 tiles + the global view
    processor = AutoProcessor.from_pretrained(str(tmp_path / "a"))
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
        add_generation_prompt=True)
    assert prompt == "<|im_start|>user\n<image>What is it?<|im_end|>\n<|im_start|>assistant\n"
    inputs = processor(text=prompt, images=[Image.new("RGB", (64, 64), (200, 30, 30))], return_tensors="pt")
    assert int((inputs["input_ids"] == 6).sum()) == 5 * 4
    vision = inspect_model(tmp_path / "a").vision  # edgectl reads the same count from the files
    assert vision is not None and (vision.tiles_512, vision.image_tokens_512, vision.image_token_id) == (5, 20, 6)
    with torch.no_grad():
        tower = model.model.vision_model(pixel_values=inputs["pixel_values"][0]).last_hidden_state
        image_embeds = model.model.connector(tower)
    # the connector's stated scale: an image token's embedding has about a text token's RMS
    text_rms = float(lm["model.embed_tokens.weight"].float().pow(2).mean().sqrt())
    assert 0.5 < float(image_embeds.pow(2).mean().sqrt()) / text_rms < 2.0
    # seeded: the same spec makes the same bytes, another seed another vision tower
    _make(tmp_path / "b", tiny_lm, spec)
    for f in ("model.safetensors", "config.json", "tokenizer.json", "processor_config.json", "chat_template.jinja"):
        assert _sha(tmp_path / "a" / f) == _sha(tmp_path / "b" / f), f
    _make(tmp_path / "c", tiny_lm, {**spec, "seed": spec["seed"] + 1})
    assert _sha(tmp_path / "c" / "model.safetensors") != _sha(tmp_path / "a" / "model.safetensors")


def test_the_maker_refuses_bad_arguments(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    spec = json.dumps(TINY.maker_spec())
    for args in (["{}", str(tmp_path), str(tmp_path / "o")], [spec, str(tmp_path / "nolm"), str(tmp_path / "o")],
                 [spec, str(tmp_path), str(tmp_path / "full")], []):
        done = subprocess.run(launch.command(_python(), launch.SYNTH_VLM, args), env=launch.environment(os.environ),
                              capture_output=True, text=True)
        assert done.returncode == 2, (args, done.stderr)
    assert not (tmp_path / "o").exists()
