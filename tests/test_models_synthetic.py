"""The synthetic catalog model (synth-llama-1b): listed as random weights, made by `models pull`,
refused by `deploy`, and round-tripped through llama.cpp's converter and quantizer to the same weights.

The fast tests use a *tiny* shape of the same spec (hidden 64, 2 layers) through the same code; the
end-to-end pull needs the llama.cpp build of `edgectl bench --build-llama-cpp` (llama-quantize and
convert_hf_to_gguf.py beside llama-server) and is marked ``slow``; it is skipped, saying why, without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from models_helpers import run_cli

from edgectl import launch
from edgectl.bench import agreement
from edgectl.errors import EdgectlError
from edgectl.models import CATALOG, list_models, read_manifest
from edgectl.models.pull import pull_entry

ENTRY = CATALOG["synth-llama-1b"]
TINY_CONFIG = {**ENTRY.synthetic.config, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024,
               "max_position_embeddings": 4096}
TINY = dataclasses.replace(
    ENTRY, name="synth-tiny", member="synth-tiny.Q4_1.gguf", gguf_bytes=200_000, converted_bytes=300_000,
    synthetic=dataclasses.replace(ENTRY.synthetic, config=TINY_CONFIG, tokenizer_pieces=512, parameters=139_584))


def _python() -> str:
    return os.environ.get("EDGECTL_RUNTIME_PYTHON", "/opt/edgectl/venv/bin/python")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".locks" not in p.parts)


def test_the_spec_is_llama_3_2_1b_shape() -> None:
    c = ENTRY.synthetic.config
    assert (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
            c["intermediate_size"], c["vocab_size"], c["tie_word_embeddings"]) == (2048, 16, 32, 8, 8192, 128256, True)
    # the parameter count the catalog states is the one of the shape's tensors
    h, i, v, L, kv = 2048, 8192, 128256, 16, 8 * 64
    assert ENTRY.synthetic.parameters == v * h + L * (2 * h * h + 2 * kv * h + 3 * h * i + 2 * h) + h


def test_list_says_it_is_random_weights(tmp_path: Path) -> None:
    env = {"EDGECTL_MODEL_CACHE": str(tmp_path)}
    done = run_cli(["models", "list"], env=env)
    assert done.returncode == 0, done.stderr
    assert "synth-llama-1b  [not pulled]  SYNTHETIC: random weights" in done.stdout
    assert "never deploy it" in done.stdout and "edgectl models pull synth-llama-1b" in done.stdout
    data = json.loads(run_cli(["models", "list", "--json"], env=env).stdout)
    (synth,) = [m for m in data["models"] if m["name"] == "synth-llama-1b"]
    assert synth["kind"] == "synthetic" and synth["state"] == "not pulled"
    assert synth["synthetic"]["shape_of"] == "meta-llama/Llama-3.2-1B" and "speed and memory" in synth["purpose"]
    assert list_models(env).models  # the library call agrees


def test_deploy_refuses_a_synthetic_model(tmp_path: Path) -> None:
    done = run_cli(["deploy", "synth-llama-1b", "--dry-run"], env={"EDGECTL_MODEL_CACHE": str(tmp_path / "m")})
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "synth-llama-1b is synthetic" in line and "edgectl bench synth-llama-1b" in line
    assert "Traceback" not in done.stderr and not (tmp_path / "m").exists()


def test_pull_without_the_llama_cpp_tools_writes_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "models"  # the tools are looked for in tmp_path/llama.cpp: there are none
    old = tmp_path / "llama.cpp" / "0.3.36" / "bin"  # a build from before llama-quantize was kept
    old.mkdir(parents=True)
    (old / "llama-server").write_text("#!/bin/sh\n")
    done = run_cli(["models", "pull", "synth-llama-1b"], env={"EDGECTL_MODEL_CACHE": str(cache)})
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "llama-quantize" in line and "edgectl bench --build-llama-cpp" in line
    assert not (cache / "synth-llama-1b").exists() and _files(cache) == []


def _fake_tools(root: Path, quantize_exit: int) -> None:
    """A llama.cpp build whose converter writes a file and whose llama-quantize fails (or not)."""
    build = root / "llama.cpp" / "9.9.9"
    (build / "bin").mkdir(parents=True)
    (build / "convert").mkdir()
    (build / "CPU_FLAGS").write_text("\n")
    (build / "bin" / "llama-server").write_text("#!/bin/sh\nexit 0\n")
    (build / "bin" / "llama-quantize").write_text(f"#!/bin/sh\necho quantize failed >&2\nexit {quantize_exit}\n")
    (build / "convert" / "convert_hf_to_gguf.py").write_text(
        "import sys\nout = sys.argv[sys.argv.index('--outfile') + 1]\nopen(out, 'wb').write(b'GGUF')\n")
    for b in ("llama-server", "llama-quantize"):
        os.chmod(build / "bin" / b, 0o755)


@pytest.mark.runtime
def test_a_failing_step_leaves_nothing_behind(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    _fake_tools(tmp_path, quantize_exit=1)
    env = {**os.environ, "EDGECTL_MODEL_CACHE": str(cache), "EDGECTL_RUNTIME_PYTHON": _python()}
    seen: list[str] = []
    with pytest.raises(EdgectlError, match=r"llama-quantize failed \(exit 1\): quantize failed"):
        pull_entry(TINY, env, seen.append, check_agreement=agreement.check)
    assert any(s.startswith("make: done") for s in seen) and any(s.startswith("gguf: done") for s in seen)
    assert not (cache / "synth-tiny").exists() and _files(cache) == []  # no temporary directory either
    assert [p.name for p in cache.iterdir() if p.name.startswith(".synth-tiny")] == []


@pytest.mark.runtime
def test_the_maker_is_seeded_and_writes_the_shape(tmp_path: Path) -> None:
    spec = json.dumps(TINY.synthetic.maker_spec())
    outs = []
    for run in ("a", "b"):
        done = subprocess.run(launch.command(_python(), launch.SYNTH_MODEL, [spec, str(tmp_path / run)]),
                              env=launch.environment(os.environ), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert outs[0]["parameters"] == TINY.synthetic.parameters
    for f in ("model.safetensors", "tokenizer.model", "config.json"):
        assert _sha(tmp_path / "a" / f) == _sha(tmp_path / "b" / f), f  # same seed, same bytes
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 1024
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a" / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied, as Llama-3.2-1B
        emb = f.get_tensor("model.embed_tokens.weight")
        q = f.get_tensor("model.layers.1.self_attn.q_proj.weight")
    assert tuple(emb.shape) == (1024, 64) and tuple(q.shape) == (64, 64)
    assert 0.015 < float(emb[259:512].float().std()) < 0.025  # N(0, 0.02²) for the text pieces
    # zero for the specials, the byte pieces and the ids the tokenizer does not use: never picked
    assert not emb[:259].any() and not emb[512:].any()
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "a" / "tokenizer.model"))
    assert sp.vocab_size() == 512 and [sp.id_to_piece(i) for i in (0, 1, 2)] == ["<unk>", "<s>", "</s>"]
    assert all(sp.is_byte(i) for i in range(3, 259)) and not sp.is_byte(259)
    assert not bool((emb[:, :32] == q[:, :32].repeat(16, 1)).all())  # each tensor its own stream
    # a different seed makes different weights
    other = {**TINY.synthetic.maker_spec(), "seed": TINY.synthetic.seed + 1}
    done = subprocess.run(launch.command(_python(), launch.SYNTH_MODEL, [json.dumps(other), str(tmp_path / "c")]),
                          env=launch.environment(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _sha(tmp_path / "c" / "model.safetensors") != _sha(tmp_path / "a" / "model.safetensors")
    assert _sha(tmp_path / "c" / "tokenizer.model") == _sha(tmp_path / "a" / "tokenizer.model")


def test_the_maker_refuses_bad_arguments(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args in (["{}", str(tmp_path / "o")], [json.dumps(TINY.synthetic.maker_spec()), str(tmp_path / "full")], []):
        done = subprocess.run(launch.command(_python(), launch.SYNTH_MODEL, args), env=launch.environment(os.environ),
                              capture_output=True, text=True)
        assert done.returncode == 2, (args, done.stderr)
    assert not (tmp_path / "o").exists()


# --- end to end, with the real llama.cpp tools ----------------------------------------------


def _real_tools():
    from edgectl.llamacpp import find_llama_tools

    try:
        return find_llama_tools(os.environ)
    except EdgectlError as exc:
        pytest.skip(str(exc))


def _served_weights(model_dir: Path) -> dict:
    """The pulled directory's GGUF as edgectl's loader reads it (runtime/edgectl_runtime/
    gguf_loader.py): Hugging Face names, q/k rows un-permuted, dequantized to fp32."""
    import torch

    from edgectl.contract import gguf_names
    from edgectl.contract.gguf_header import read_gguf
    from edgectl_runtime.formats import ggml

    header = read_gguf(model_dir / "model.gguf")
    config = json.loads((model_dir / "config.json").read_text())
    out = {}
    with (model_dir / "model.gguf").open("rb") as f:
        for t in header.tensors:
            f.seek(header.data_offset + t.offset)
            raw = torch.frombuffer(bytearray(f.read(t.nbytes)), dtype=torch.uint8).reshape(t.numel // t.dims[0], -1)
            heads = gguf_names.heads_of("llama", t.name, config)
            if heads is not None:
                raw = raw[torch.tensor(gguf_names.unpermute_order(raw.shape[0], heads))]
            out[gguf_names.hf_name("llama", t.name)] = ggml.dequantize(raw, t.type.name, t.dims[0]).reshape(t.shape)
    return out


@pytest.mark.slow
@pytest.mark.runtime
def test_tiny_pull_round_trips_the_weights_through_llama_cpp(tmp_path: Path) -> None:
    """make -> convert_hf_to_gguf -> llama-quantize Q4_1 -> the directory serving that GGUF: the
    weights edgectl's loader reads from it are the random ones within Q4_1's (layers) and Q8_0's
    (tied head) rounding, q/k un-permuted, and a second pull makes nothing."""
    tools = _real_tools()
    cache = tmp_path / "models"
    (tmp_path / "llama.cpp").symlink_to(tools.build.parent)  # the real build, seen from this cache
    env = {**os.environ, "EDGECTL_MODEL_CACHE": str(cache), "EDGECTL_RUNTIME_PYTHON": _python()}
    result = pull_entry(TINY, env, lambda _: None, check_agreement=agreement.check)
    assert result.action == "pulled"
    manifest = read_manifest(result.path)
    assert manifest["source"]["kind"] == "synthetic" and manifest["gguf"]["sha256"] == _sha(result.gguf_path)
    assert manifest["synthetic"]["llama_cpp"]["version"] == tools.version

    from gguf import GGUFReader

    tensors = GGUFReader(str(result.gguf_path)).tensors
    types = {t.name: t.tensor_type.name for t in tensors}
    assert types["token_embd.weight"] == "Q8_0" and "output.weight" not in types  # tied, 8-bit
    assert {t.tensor_type.name for t in tensors if len(t.shape) == 2 and t.name != "token_embd.weight"} == {"Q4_1"}

    # The same seed made again, to compare with.
    done = subprocess.run(launch.command(_python(), launch.SYNTH_MODEL, [json.dumps(TINY.synthetic.maker_spec()),
                           str(tmp_path / "orig")]), env=launch.environment(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import torch
    from safetensors.torch import load_file

    orig = load_file(str(tmp_path / "orig" / "model.safetensors"))
    final = _served_weights(result.path)
    assert set(final) - {"lm_head.weight"} == set(orig)
    for name, w in orig.items():
        got = final[name].float()
        w = w.float()
        assert got.shape == w.shape, name
        if w.dim() == 1:
            assert torch.equal(got, w), name
            continue
        blocks, err = w.reshape(-1, 32), (got - w).reshape(-1, 32).abs()
        if name == "model.embed_tokens.weight":  # Q8_0: a scale per 32, round to nearest
            step = blocks.abs().amax(dim=1, keepdim=True) / 127
        else:  # Q4_1: a scale and a minimum per 32
            step = (blocks.amax(dim=1, keepdim=True) - blocks.amin(dim=1, keepdim=True)) / 15
        # half a step, plus fp16 scales (and slack for the bf16 the random weights were made in)
        assert bool((err <= 0.55 * step + blocks.abs() * 2 ** -7 + 1e-6).all()), name

    again = pull_entry(TINY, env, lambda _: None, check_agreement=agreement.check)
    assert again.action == "already pulled"
