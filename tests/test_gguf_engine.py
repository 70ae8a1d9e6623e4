"""A GGUF served as it is: edgectl's load format ``edgectl_gguf`` (runtime/edgectl_runtime/
gguf_loader.py) inside a real vLLM engine, on the catalog's real SmolLM2 GGUF.

The directory is the one ``edgectl models pull`` writes (config.json from the metadata, the
tokenizer from the GGUF, the GGUF itself). The engine runs in a subprocess
executing this file as a script; it prints the read-back, a greedy answer, and dumps the weights
edgectl's kernels multiply by for a few layers, which the test compares with the GGUF's own
values (formats/ggml.py, checked against gguf-py in test_formats_ggml.py): Q4_1 and Q8_0 blocks
must arrive bit for bit, q/k rows in Hugging Face order (llama.cpp permuted them per head).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

LAYERS = ["model.layers.0.self_attn.qkv_proj", "model.layers.7.mlp.gate_up_proj",
          "model.layers.29.self_attn.o_proj", "model.embed_tokens"]


def _engine_main(argv: list[str]) -> int:
    from vllm import LLM, SamplingParams

    model, dump = argv
    llm = LLM(model=model, load_format="edgectl_gguf", quantization="cpu_int4", max_model_len=256,
              max_num_seqs=1, kv_cache_memory_bytes=32 << 20, enforce_eager=True, dtype="bfloat16", seed=0,
              worker_extension_cls="int4_extension.Int4TestExtension")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=6, temperature=0))
    result = {"answer": out[0].outputs[0].text,
              "readback": llm.collective_rpc("edgectl_describe")[0],
              "dumped": llm.collective_rpc("edgectl_dump_dequantized", args=(dump, LAYERS))[0]}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(_engine_main(sys.argv[1:]))

import pytest  # noqa: E402
from int4_helpers import read_json_line, run_runtime  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.isa_avx2]


@pytest.fixture(scope="module")
def smollm2_gguf(pulled_smollm2) -> Path:
    from edgectl.models.cache import gguf_path
    from edgectl.models.catalog import CATALOG

    path = gguf_path(CATALOG["smollm2-135m"], {})
    assert path.is_file(), f"the pull keeps the GGUF at {path}"
    return path


@pytest.fixture(scope="module")
def direct_dir(pulled_smollm2) -> Path:
    # What `edgectl models pull` writes now: no bf16 copy, the GGUF hard-linked.
    assert sorted(p.name for p in pulled_smollm2.iterdir()) == [
        "chat_template.jinja", "config.json", "edgectl-model.json", "model.gguf", "tokenizer.json",
        "tokenizer_config.json"]
    return pulled_smollm2


@pytest.fixture(scope="module")
def served(direct_dir, tmp_path_factory) -> dict:
    dump = tmp_path_factory.mktemp("gguf-dump") / "w.safetensors"
    done = run_runtime([str(Path(__file__).resolve()), str(direct_dir), str(dump)],
                       extra_env={"EDGECTL_INT4_KERNEL": "edgectl", "EDGECTL_LM_HEAD": "int8",
                                  "EDGECTL_LAYERWISE_REPACK": "1"}, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = read_json_line(done.stdout)
    result["dump"] = str(dump)
    return result


def test_answers_from_the_gguf(served) -> None:
    assert "Paris" in served["answer"]


def test_layers_read_back_as_gguf_blocks(served) -> None:
    layers = {layer["name"]: layer for layer in served["readback"]["layers"]}
    qkv = layers["model.layers.0.self_attn.qkv_proj"]
    assert qkv["format"] == "w4a8/b32" and qkv["reason"] == "Q4_1 as W4 (exact)", qkv
    embed = layers["model.embed_tokens"]
    assert embed["format"] == "w8a8/b32" and embed["reason"] == "Q8_0 as W8 (exact)", embed
    assert not [n for n, layer in layers.items() if layer.get("format") == "pending"]


def test_weights_are_the_files_blocks_bit_for_bit(served, smollm2_gguf) -> None:
    import torch
    from safetensors.torch import load_file

    from edgectl.contract import gguf_names
    from edgectl_runtime.formats import ggml
    from edgectl_runtime.vllm_plugin.gguf_loader import GGUFFile

    class Config:  # the two fields the q/k permutation needs (SmolLM2: 9 heads, 3 KV heads)
        num_attention_heads, num_key_value_heads = 9, 3

    dumped = load_file(served["dump"])
    f = GGUFFile(smollm2_gguf)
    try:
        for name in LAYERS:
            parent, _, leaf = name.rpartition(".")
            subs = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}.get(leaf, [leaf])
            want = []
            for sub in subs:
                t = f.tensors[gguf_names.gguf_name("llama", f"{parent}.{sub}.weight")]
                want.append(ggml.dequantize(f.rows_in_order(t, Config), t.type.name, t.dims[0]))
            want = torch.cat(want)
            got = dumped[name][: want.shape[0]]
            assert torch.equal(got, want), f"{name}: max diff {(got - want).abs().max()}"
        # Undoing the permutation mattered: the file's own row order is not what the engine holds.
        t = f.tensors["blk.0.attn_q.weight"]
        raw = ggml.dequantize(f.raw(t), t.type.name, t.dims[0])
        assert not torch.equal(dumped[LAYERS[0]][: raw.shape[0]], raw)
    finally:
        f.close()
