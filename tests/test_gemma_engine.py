"""The second catalog architecture: Gemma-3-270M's Q4_K_M GGUF (five PyPI packages assembled, the
Gemma terms accepted), served as it is by edgectl's loader in a real vLLM engine.

Its file mixes Q5_0 (q/k/gate/up: Gemma's 640-wide rows are not a multiple of the K-quants' 256),
Q8_0, Q4_K and Q6_K; the engine must hold each layer as docs/gguf.md says (Q5_0 in edgectl's W5 blocks)
and answer sense. The
older transformers path produced a model that answered "енененен"; the tokenizer made from this
GGUF must also add Gemma's <bos> (tokenizer.ggml.add_bos_token), as llama.cpp does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _engine_main(argv: list[str]) -> int:
    from vllm import LLM, SamplingParams

    (model,) = argv
    llm = LLM(model=model, load_format="edgectl_gguf", quantization="cpu_int4", max_model_len=512,
              max_num_seqs=1, kv_cache_memory_bytes=32 << 20, enforce_eager=True, dtype="bfloat16", seed=0,
              worker_extension_cls="edgectl_runtime.service.readback.ReadbackExtension")
    prompts = ["The capital of France is the city of", "The capital of France is"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
    result = {"answers": [o.outputs[0].text for o in outs],
              "prompt_ids": [list(o.prompt_token_ids) for o in outs],
              "readback": llm.collective_rpc("edgectl_describe")[0]}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(_engine_main(sys.argv[1:]))

import subprocess  # noqa: E402

import pytest  # noqa: E402
from installed import EDGECTL  # noqa: E402
from int4_helpers import read_json_line, run_runtime  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma() -> Path:
    if not EDGECTL.exists():
        pytest.skip(f"edgectl is not installed at {EDGECTL}: run scripts/setup.sh")
    r = subprocess.run([str(EDGECTL), "models", "pull", "gemma3-270m", "--accept-terms", "gemma", "--json"],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"pulling gemma3-270m failed:\n{r.stdout}\n{r.stderr}"
    return Path(json.loads(r.stdout)["path"])


def test_the_pull_assembles_the_file_and_records_the_terms(gemma: Path) -> None:
    manifest = json.loads((gemma / "edgectl-model.json").read_text())
    assert manifest["gguf"]["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    terms = manifest["terms"]
    assert terms["accepted_with"] == "--accept-terms gemma" and terms["url"] == "https://ai.google.dev/gemma/terms"
    assert "Gemma Terms of Use" in Path(terms["text"]).read_text(errors="replace")
    assert (gemma / "model.gguf").samefile(manifest["gguf"]["path"])
    assert not (gemma / "chat_template.jinja").exists()  # a base model


@pytest.fixture(scope="module")
def served(gemma: Path) -> dict:
    done = run_runtime([str(Path(__file__).resolve()), str(gemma)],
                       extra_env={"EDGECTL_INT4_KERNEL": "edgectl", "EDGECTL_LM_HEAD": "int8"}, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return read_json_line(done.stdout)


def test_gemma_answers_with_its_bos(served) -> None:
    assert all(ids[0] == 2 for ids in served["prompt_ids"])  # <bos>, as llama.cpp tokenizes it
    assert "Paris" in served["answers"][0], served["answers"]
    # greedy on the bare prompt this base model (llama.cpp too, on the same file) continues
    # " the capital of the country of France. It is ...": sense, not a repeated token
    words = served["answers"][1].split()
    assert "France" in " ".join(words[:8]) and len(set(words)) > 3, served["answers"]


def test_each_layer_is_held_as_its_gguf_type_says(served) -> None:
    layers = {layer["name"]: layer for layer in served["readback"]["layers"]}
    qkv = layers["model.layers.0.self_attn.qkv_proj"]  # Q5_0 q/k, Q8_0 v
    assert qkv["format"] == "w8a8/b32" and qkv["reason"] == "Q5_0 as W8 (exact); Q8_0 as W8 (exact)", qkv
    o = layers["model.layers.0.self_attn.o_proj"]  # Q4_K
    assert o["format"] == "w4a8/b32" and "Q4_K as W4" in o["reason"], o
    down = layers["model.layers.0.mlp.down_proj"]  # Q6_K
    assert down["format"] == "w8a8/b32" and down["reason"] == "Q6_K re-quantized to W8", down
    assert layers["model.embed_tokens"]["reason"] == "Q8_0 as W8 (exact)"
    gate_up = layers["model.layers.0.mlp.gate_up_proj"]  # Q5_0 gate and up: Q5_0's own 5.5 bits a weight
    assert gate_up["format"] == "w5a8/b32" and gate_up["reason"] == "Q5_0 as W5 (exact)", gate_up
    # the rule the planner sizes by (gguf_types.layer_bits): W5 exactly where every part is Q5_0 (or Q4_0)
    for name, layer in layers.items():
        if layer.get("source") == "gguf" and name != "model.embed_tokens":
            assert (layer["format"] == "w5a8/b32") == (layer["reason"] == "Q5_0 as W5 (exact)"), layer
