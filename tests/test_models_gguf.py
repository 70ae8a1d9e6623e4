"""Reading a GGUF file's header (edgectl/contract/gguf_header.py) and its facts
(edgectl/models/gguf_inspect.py) without loading a tensor.

Small files are written by the ``gguf`` package's GGUFWriter — the writer llama.cpp's own
converter uses — so the layout under test is the real one; the real SmolLM2 GGUF of the catalog
is checked against its converted directory when it is pulled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from models_helpers import run_cli

from edgectl.contract.gguf_header import GGML_TYPES, SkippedArray, read_gguf
from edgectl.errors import EdgectlError
from edgectl.models.gguf_inspect import inspect_gguf

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def _raw(qtype: Q, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes of a [rows, cols] tensor of ``qtype`` (the header only reads its size)."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    return np.random.default_rng(seed).integers(0, 256, size=(rows, cols // block * block_bytes), dtype=np.uint8)


def write_tiny(path: Path, *, arch: str = "llama", layers: int = 2, hidden: int = 64, ffn: int = 96,
               heads: int = 4, kv_heads: int = 2, vocab: int = 128, linear: Q = Q.Q4_1, embed: Q = Q.Q8_0,
               tied: bool = True, window: int | None = None, template: str | None = "{{ messages }}",
               tokens: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if window:
        w.add_sliding_window(window)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(tokens or vocab)])
    if template:
        w.add_chat_template(template)
    seed = 0
    w.add_tensor("token_embd.weight", _raw(embed, vocab, hidden, seed), raw_dtype=embed)
    if not tied:
        w.add_tensor("output.weight", _raw(embed, vocab, hidden, seed + 1), raw_dtype=embed)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    head_dim = hidden // heads
    shapes = {"attn_q": (heads * head_dim, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, heads * head_dim),
              "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, (rows, cols) in shapes.items():
            seed += 1
            w.add_tensor(f"blk.{i}.{name}.weight", _raw(linear, rows, cols, seed), raw_dtype=linear)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_type_table_is_ggmls():
    # every type edgectl knows has the block size and bytes the gguf package (llama.cpp's) gives it
    for type_id, t in GGML_TYPES.items():
        assert gguf.GGML_QUANT_SIZES[Q(type_id)] == (t.block, t.block_bytes), t.name
        assert Q(type_id).name == t.name


def test_a_tiny_llama_reads_back_as_written(tmp_path):
    path = write_tiny(tmp_path / "tiny.gguf")
    h = read_gguf(path)
    assert h.version == 3 and h.architecture == "llama" and h.arch_key("block_count") == 2
    assert h.metadata["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(128)]  # short arrays are kept
    by_name = {t.name: t for t in h.tensors}
    q = by_name["blk.1.ffn_down.weight"]
    assert q.type.name == "Q4_1" and q.dims == (96, 64) and q.shape == (64, 96)
    assert q.nbytes == 64 * 96 // 32 * 20
    assert by_name["token_embd.weight"].nbytes == 128 * 64 // 32 * 34
    assert h.data_offset % 32 == 0
    # the tensors fill the data area exactly as GGUFWriter laid them out
    assert max(h.data_offset + t.offset + t.nbytes for t in h.tensors) <= h.file_bytes


def test_long_arrays_are_skipped_not_loaded(tmp_path):
    h = read_gguf(write_tiny(tmp_path / "v.gguf", vocab=2048))
    assert h.metadata["tokenizer.ggml.tokens"] == SkippedArray("string", 2048)


def test_facts_of_a_tiny_llama(tmp_path):
    facts = inspect_gguf(write_tiny(tmp_path / "tiny.gguf"))
    assert facts.architecture == "LlamaForCausalLM" and facts.model_type == "llama"
    assert (facts.num_layers, facts.hidden_size, facts.intermediate_size) == (2, 64, 96)
    assert (facts.num_attention_heads, facts.num_kv_heads, facts.head_dim, facts.vocab_size) == (4, 2, 16, 128)
    assert facts.tie_word_embeddings and facts.max_position_embeddings == 2048 and facts.rope_theta == 10000.0
    assert facts.layer_types == ("full_attention",) * 2 and facts.sliding_window is None
    assert facts.weights_dtype == "Q4_1" and facts.param_source == "gguf"
    # sized by the ggml types: 2 layers × (q 64×64 + k, v 32×64 + o 64×64 + gate, up 96×64 + down 64×96)
    linear_elems = 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 96 * 64)
    assert facts.param_bytes.linear == linear_elems // 32 * 20
    assert facts.param_bytes.embedding == 128 * 64 // 32 * 34 and facts.param_bytes.lm_head == 0
    assert facts.param_bytes.other == (2 * 2 + 1) * 64 * 4
    assert facts.num_params == linear_elems + 128 * 64 + 5 * 64
    assert [x.name for x in facts.linear_layers[:7]] == [  # in the order a directory's facts list them
        "model.layers.0.mlp.down_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
        "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj"]
    down = facts.linear_layers[0]
    assert (down.out_features, down.in_features) == (64, 96)
    assert facts.tokenizer and facts.chat_template
    assert facts.quantization_config["tensor_types"] == {"F32": 5, "Q4_1": 14, "Q8_0": 1}


def test_untied_head_and_no_template(tmp_path):
    facts = inspect_gguf(write_tiny(tmp_path / "u.gguf", tied=False, template=None))
    assert not facts.tie_word_embeddings and facts.param_bytes.lm_head == 128 * 64 // 32 * 34
    assert not facts.chat_template


def test_gemma3_slides_five_layers_in_six(tmp_path):
    facts = inspect_gguf(write_tiny(tmp_path / "g.gguf", arch="gemma3", layers=12, window=512, linear=Q.Q4_K,
                                    hidden=256, ffn=512, embed=Q.Q6_K))
    assert facts.architecture == "Gemma3ForCausalLM" and facts.sliding_window == 512
    assert facts.layer_types == (("sliding_attention",) * 5 + ("full_attention",)) * 2
    assert facts.weights_dtype == "Q4_K"


@pytest.mark.parametrize("cut", [3, 30, 200, 2000, -1])
def test_a_truncated_file_is_one_clear_error(tmp_path, cut):
    whole = write_tiny(tmp_path / "tiny.gguf").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(whole[:cut])
    with pytest.raises(EdgectlError) as err:
        read_gguf(bad)
    msg = err.value.message
    assert "\n" not in msg and str(bad) in msg
    assert ("truncated" in msg) or (cut == 3 and "not a GGUF file" in msg), msg


def test_not_gguf_and_old_versions_are_refused(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(EdgectlError, match="not a GGUF file"):
        read_gguf(junk)
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(100))
    with pytest.raises(EdgectlError, match="GGUF version 1"):
        read_gguf(v1)


def test_an_architecture_edgectl_does_not_map_is_refused(tmp_path):
    with pytest.raises(EdgectlError, match="GGUF architecture 'mamba' is not one edgectl maps"):
        inspect_gguf(write_tiny(tmp_path / "m.gguf", arch="mamba"))


def test_tensor_types_the_kernels_do_not_take_are_refused(tmp_path):
    with pytest.raises(EdgectlError) as err:
        inspect_gguf(write_tiny(tmp_path / "iq.gguf", linear=Q.IQ2_XXS, hidden=256, ffn=512))
    assert "14 × IQ2_XXS" in err.value.message and "\n" not in err.value.message


def test_inspect_cli_reads_a_gguf_and_refuses_damage(tmp_path):
    path = write_tiny(tmp_path / "tiny.gguf")
    ok = run_cli(["models", "inspect", str(path), "--json"], timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert '"param_source": "gguf"' in ok.stdout
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    bad = run_cli(["models", "inspect", str(cut)], timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1 and "truncated" in bad.stderr
    # deploying the file itself says to pull it first, with one line, nothing written
    env = {"EDGECTL_UNIT_DIR": str(tmp_path / "units"), "EDGECTL_CONFIG_DIR": str(tmp_path / "etc")}
    plan = run_cli(["deploy", str(path), "--dry-run"], env=env, timeout=60)
    assert plan.returncode == 2 and plan.stderr.count("\n") == 1, plan.stderr
    assert f"is a GGUF file: pull it first with `edgectl models pull {path}`" in plan.stderr
    assert not (tmp_path / "units").exists() and not (tmp_path / "etc").exists()


def test_the_catalog_gguf_agrees_with_its_converted_directory():
    from edgectl.models import inspect_model, read_manifest, resolve_model

    try:
        directory = resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")
    gguf_file = Path(read_manifest(directory)["gguf"]["path"])
    g, d = inspect_gguf(gguf_file), inspect_model(directory)
    same = ("architecture", "model_type", "num_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_kv_heads", "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
            "rope_theta", "layer_types", "num_params", "linear_layers", "tokenizer", "chat_template")
    assert {k: getattr(g, k) for k in same} == {k: getattr(d, k) for k in same}
    # the file's own types: 210 Q4_1 layers, the tied table in Q8_0 (docs/facts.md, "The catalog model")
    assert g.quantization_config["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert g.param_bytes.linear == sum(x.out_features * x.in_features for x in g.linear_layers) // 32 * 20


def test_the_catalogs_shipped_header_is_the_real_files():
    import json

    from edgectl import paths
    from edgectl.contract.gguf_header import header_to_json
    from edgectl.models import read_manifest, resolve_model

    try:
        directory = resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")
    shipped = json.loads((paths.data_dir() / "catalog" / "smollm2-135m" / "gguf-header.json").read_text())
    real = json.loads(json.dumps(header_to_json(read_gguf(read_manifest(directory)["gguf"]["path"]))))
    assert shipped == real


def test_a_plan_before_the_pull_sizes_the_gguf_as_after(tmp_path):
    # the shipped header gives the same facts the pulled file will (bar the path)
    import dataclasses

    from edgectl.inputs import model_facts
    from edgectl.models import resolve_model

    try:
        resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")
    before, pulled_before = model_facts("smollm2-135m", {**os.environ, "EDGECTL_MODEL_CACHE": str(tmp_path)})
    after, pulled_after = model_facts("smollm2-135m", os.environ)
    assert (pulled_before, pulled_after) == (False, True)
    # the tokenizer's cost is a measurement: the catalog ships one, the pull makes its own
    assert after.tokenizer_bytes is not None and abs(before.tokenizer_bytes - after.tokenizer_bytes) < 0.02 * after.tokenizer_bytes
    assert dataclasses.replace(before, path=after.path, tokenizer_bytes=after.tokenizer_bytes) == after


def test_pulling_a_gguf_file_refuses_what_cannot_be_served(tmp_path):
    cache = tmp_path / "cache"
    env = {"EDGECTL_MODEL_CACHE": str(cache)}
    good = write_tiny(tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:-100])
    cases = {
        cut: "truncated",
        write_tiny(tmp_path / "phi.gguf", arch="phi3"): "'phi3' is not one edgectl maps",
        write_tiny(tmp_path / "iq.gguf", linear=Q.IQ2_XXS, hidden=256, ffn=512): "IQ2_XXS",
    }
    for path, needle in cases.items():
        done = run_cli(["models", "pull", str(path)], env=env, timeout=120)
        assert done.returncode == 2 and done.stdout == "", (path, done.stderr)
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
        assert not cache.exists() or not [p for p in cache.rglob("*") if p.is_file() and ".locks" not in p.parts]


def test_a_gguf_file_is_pulled_like_a_catalog_model(tmp_path):
    from edgectl.models import read_manifest, resolve_model

    try:
        directory = resolve_model("smollm2-135m", os.environ)
    except EdgectlError as exc:
        pytest.skip(f"SmolLM2 is not pulled ({exc.message})")
    mine = tmp_path / "My SmolLM2.Q4_1.gguf"
    mine.write_bytes(Path(read_manifest(directory)["gguf"]["path"]).read_bytes())
    cache = tmp_path / "cache"
    env = {"EDGECTL_MODEL_CACHE": str(cache)}
    done = run_cli(["models", "pull", str(mine), "--json"], env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    model = cache / "my-smollm2-q4-1"
    assert out["path"] == str(model) and out["action"] == "pulled"
    manifest = read_manifest(model)
    assert manifest["source"] == {"kind": "file", "path": str(mine)} and manifest["layout"] == "gguf-direct"
    assert (model / "model.gguf").samefile(cache / "gguf" / mine.name)
    again = run_cli(["models", "pull", str(mine), "--json"], env=env, timeout=600)
    assert again.returncode == 0 and json.loads(again.stdout)["action"] == "already pulled", again.stderr
    # the directory deploys like the catalog's: a GGUF checkpoint, loaded by edgectl's loader
    units = {"EDGECTL_UNIT_DIR": str(tmp_path / "units"), "EDGECTL_CONFIG_DIR": str(tmp_path / "etc"), **env}
    plan = run_cli(["plan", str(model), "--json"], env=units, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["model"]["checkpoint_format"] == "gguf"


def test_a_q4_k_m_files_q5_0_layers_are_planned_at_their_own_size(tmp_path):
    """Gemma-3-270M's Q4_K_M file (the catalog's, from its shipped header: no pull) holds most of its layers in
    Q5_0 (640 columns are no multiple of 256): those become edgectl's W5 blocks at the file's 22 bytes per 32
    values, not W8's 34; a merged layer with a part in another type takes the block its widest part needs."""
    import json
    from collections import defaultdict

    from edgectl import paths
    from edgectl.contract import int4_layout
    from edgectl.inputs import model_facts

    facts, pulled = model_facts("gemma3-270m", {**os.environ, "EDGECTL_MODEL_CACHE": str(tmp_path)})
    assert not pulled
    header = json.loads((paths.data_dir() / "catalog" / "gemma3-270m" / "gguf-header.json").read_text())
    merged = {"attn_q": "qkv", "attn_k": "qkv", "attn_v": "qkv", "ffn_gate": "gate_up", "ffn_up": "gate_up"}
    parts: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)  # (block, layer) -> (type, bytes)
    for name, _, kind, _, nbytes in header["tensors"]:
        bits = name.split(".")
        if bits[0] == "blk" and bits[2] in (*merged, "attn_output", "ffn_down"):
            parts[(bits[1], merged.get(bits[2], bits[2]))].append((kind, nbytes))
    by_name = {layer.name: layer for layer in facts.linear_layers}
    vllm = {"attn_q": "self_attn.q_proj", "ffn_gate": "mlp.gate_proj", "attn_output": "self_attn.o_proj",
            "ffn_down": "mlp.down_proj"}
    first = {"qkv": "attn_q", "gate_up": "ffn_gate", "attn_output": "attn_output", "ffn_down": "ffn_down"}
    all_q5 = 0
    for (block, layer), types in parts.items():
        planned = by_name[f"model.layers.{block}.{vllm[first[layer]]}"].gguf_bits
        kinds = {k for k, _ in types}
        if kinds == {"Q5_0"}:
            all_q5 += 1
            assert planned == 5, (block, layer)
        elif kinds & {"Q8_0", "Q6_K"} or "Q5_0" in kinds:
            assert planned == 8, (block, layer, kinds)
        else:
            assert planned == 4, (block, layer, kinds)
    assert all_q5 >= 18  # every block's gate_up at least
    q5 = [layer for layer in facts.linear_layers if layer.gguf_bits == 5]
    file_q5 = sum(nbytes for name, _, kind, _, nbytes in header["tensors"] if kind == "Q5_0"
                  and any(name == f"blk.{layer.name.split('.')[2]}.{g}.weight" for layer in q5
                          for g, v in vllm.items() | {("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                                                      ("ffn_up", "mlp.up_proj")} if layer.name.endswith(v)))
    planned_q5 = sum(int4_layout.block_packed_bytes(x.out_features, x.in_features, 5) for x in q5)
    assert planned_q5 == file_q5  # 352 bytes per 16 x 32 values: Q5_0's 22 per 32
