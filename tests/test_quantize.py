"""`edgectl quantize`: the portable cpu_int4 checkpoint, its round trip and its refusals."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from int4_helpers import REPO, RUNTIME_PYTHON, build_tiny_llama, python_has, runtime_env

needs_runtime = pytest.mark.skipif(not python_has("transformers"), reason="the runtime interpreter lacks transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


def edgectl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, with this checkout's control plane and runtime."""
    environ = runtime_env({"EDGECTL_RUNTIME_PYTHON": RUNTIME_PYTHON, **(env or {})})
    return subprocess.run([sys.executable, "-m", "edgectl.cli", *args], env=environ, capture_output=True,
                          text=True, timeout=600, cwd=str(REPO))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_runtime
def test_quantize_writes_a_portable_checkpoint_that_round_trips(tiny, tmp_path):
    import torch
    from safetensors import safe_open

    from edgectl_runtime.formats.groups import (
        dequantize_int4,
        quantize_int4,
        unpack_nibbles,
    )

    out = tmp_path / "q4"
    done = edgectl("quantize", str(tiny), str(out), "--group-size", "128", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["schema"] == "edgectl.quantize/1"
    assert result["group_sizes_used"] == {"64": 12, "128": 2}  # hidden 192: q/k/v/o/gate/up get 64
    assert result["quantized_weights"] == 14
    assert result["sha256"]["model.safetensors"] == sha256(out / "model.safetensors")
    assert "%" in done.stderr  # progress on stderr

    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    assert qc["quant_method"] == "cpu_int4" and qc["format"] == "edgectl.cpu_int4/1" and qc["group_size"] == 128
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (tiny / name).read_bytes()
    assert oct((out / "model.safetensors").stat().st_mode & 0o777) == "0o644"
    assert not list(tmp_path.glob(".q4.tmp-*"))

    with safe_open(str(tiny / "model.safetensors"), framework="pt") as src, \
            safe_open(str(out / "model.safetensors"), framework="pt") as dst:
        names = set(dst.keys())
        for name in src.keys():
            w = src.get_tensor(name)
            module = name[: -len(".weight")]
            if f"{module}.qweight" in names:
                g = 64 if w.shape[1] % 128 else 128
                q, s, z = quantize_int4(w, g, w.dtype)
                got_q = unpack_nibbles(dst.get_tensor(f"{module}.qweight"))
                assert torch.equal(got_q, q), name
                assert torch.equal(dst.get_tensor(f"{module}.scales"), s)
                assert torch.equal(dst.get_tensor(f"{module}.zeros"), z)
                deq = dequantize_int4(got_q, dst.get_tensor(f"{module}.scales"), dst.get_tensor(f"{module}.zeros"))
                assert float((deq - w.float()).abs().max()) < 0.1 * float(w.float().abs().max())
            else:
                assert torch.equal(dst.get_tensor(name), w), name  # embedding, norms: unchanged
        assert "model.embed_tokens.weight" in names and "model.layers.0.self_attn.q_proj.weight" not in names


@needs_runtime
def test_quantize_is_deterministic(tiny, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        done = edgectl("quantize", str(tiny), str(out), "--group-size", "32")
        assert done.returncode == 0, done.stderr
    for name in ("model.safetensors", "config.json"):
        assert sha256(a / name) == sha256(b / name)


@needs_runtime
def test_portable_bytes_do_not_depend_on_the_cpu_it_was_written_on(tiny, tmp_path):
    # "Portable": the same checkpoint whatever kernels torch dispatches to (here: forced to its
    # scalar kernels vs the native ISA), unlike the kernel's packed layout.
    from int4_helpers import run_runtime

    outs = []
    for name, env in (("native", {}), ("scalar", {"ATEN_CPU_CAPABILITY": "default"})):
        out = tmp_path / name
        done = run_runtime(["-m", "edgectl_runtime.tools.quantize", str(tiny), str(out), "--group-size", "32"], env)
        assert done.returncode == 0, done.stderr
        outs.append(sha256(out / "model.safetensors"))
    assert outs[0] == outs[1]


@needs_runtime
def test_group_size_changes_the_bytes(tiny, tmp_path):
    sizes = {}
    for g in ("32", "128"):
        done = edgectl("quantize", str(tiny), str(tmp_path / g), "--group-size", g)
        assert done.returncode == 0, done.stderr
        sizes[g] = (tmp_path / g / "model.safetensors").stat().st_size
    assert sizes["32"] > sizes["128"]  # four times the scales and zeros


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        (None, ["--group-size", "16"], "--group-size 16 is not supported"),
        ("missing", [], "is not a directory"),
        ("no-config", [], "has no config.json"),
        ("bad-config", [], "is not readable JSON"),
        ("quantized", [], "is already quantized (quant_method gptq)"),
        ("no-weights", [], "has no *.safetensors files"),
        ("out-exists", [], "already exists"),
        ("no-parent", [], "does not exist: create it first"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, make, args, message):
    src = tmp_path / "src"
    out = tmp_path / "out"
    src.mkdir()
    (src / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (src / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    if make == "missing":
        src = tmp_path / "nope"
    elif make == "no-config":
        (src / "config.json").unlink()
    elif make == "bad-config":
        (src / "config.json").write_text("{")
    elif make == "quantized":
        (src / "config.json").write_text('{"quantization_config": {"quant_method": "gptq", "bits": 4}}')
    elif make == "no-weights":
        (src / "model.safetensors").unlink()
    elif make == "out-exists":
        out.mkdir()
        (out / "keep").write_text("mine")
    elif make == "no-parent":
        out = tmp_path / "a" / "b"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = edgectl("quantize", str(src), str(out), *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_missing_runtime_interpreter_is_a_clear_error(tmp_path, tiny):
    done = edgectl("quantize", str(tiny), str(tmp_path / "out"), env={"EDGECTL_RUNTIME_PYTHON": "/nonexistent/python"})
    assert done.returncode == 2
    assert "EDGECTL_RUNTIME_PYTHON" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_failing_quantizer_leaves_nothing_behind(tmp_path):
    # A header that promises a tensor the file does not hold: the runtime fails mid-way.
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    header = json.dumps({"model.layers.0.mlp.down_proj.weight":
                         {"dtype": "BF16", "shape": [64, 64], "data_offsets": [0, 8192]}}).encode()
    header += b" " * (-len(header) % 8)
    (src / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    done = edgectl("quantize", str(src), str(tmp_path / "out"))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: quantizing")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_control_plane_command_does_not_import_torch():
    code = ("import sys; import edgectl.cli; import edgectl.commands.quantize; "
            "assert not {'torch', 'vllm', 'safetensors'} & set(sys.modules), sorted(sys.modules)")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(REPO))
