"""The pull's short agreement check against llama-server on the same GGUF (edgectl/bench/agreement.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edgectl.bench import agreement
from edgectl.errors import EdgectlError
from edgectl.llamacpp import find_llama_server
from edgectl.models.cache import MANIFEST_NAME


def test_a_gross_disagreement_is_refused_and_a_close_one_is_not():
    assert agreement.verdict({"next_token_prompts": 6, "next_token_top1_agreement": 1 / 6,
                              "prompts_tokenized_differently": 0}).startswith(
        "edgectl's next token agrees with llama.cpp's on the same GGUF on 0.17 of 6 prompts")
    assert agreement.verdict({"next_token_prompts": 6, "next_token_top1_agreement": 5 / 6,
                              "prompts_tokenized_differently": 0}) is None
    assert agreement.verdict({"next_token_prompts": 6, "next_token_top1_agreement": agreement.REFUSE_BELOW,
                              "prompts_tokenized_differently": 0}) is None


def test_prompts_tokenized_differently_everywhere_are_refused():
    why = agreement.verdict({"next_token_prompts": 0, "next_token_top1_agreement": None,
                             "prompts_tokenized_differently": 6})
    assert why is not None and "tokenized 6 of the check's prompts differently" in why


def _gguf_of(model_dir: Path) -> Path:
    return Path(json.loads((model_dir / MANIFEST_NAME).read_text())["gguf"]["path"])


@pytest.mark.engine
def test_a_refused_gguf_of_ones_own_leaves_nothing(pulled_smollm2, tmp_path):
    """The check's verdict decides (a disagreeing record stands in for the servers, which the next
    test runs for real): one error, exit 2, no model directory, no copy of the file, no temporary
    directory; the servers' logs are named."""
    from edgectl.models.pull import pull_file

    compared = {"next_token_prompts": 6, "next_token_top1_agreement": 1 / 6, "prompts_tokenized_differently": 0}
    record = {"checked": True, "passed": False, "prompts": 6, "next_token_top1_agreement": 1 / 6,
              "prompts_tokenized_differently": 0, "seconds": 1.0, "refused": agreement.verdict(compared)}
    seen = []

    def disagreeing(model_dir, gguf, environ, progress, logs):
        seen.append((model_dir, gguf))
        assert (model_dir / "tokenizer.json").is_file() and (model_dir / "config.json").is_file()
        return record

    cache = tmp_path / "models"
    with pytest.raises(EdgectlError) as err:
        pull_file(_gguf_of(pulled_smollm2), {**os.environ, "EDGECTL_MODEL_CACHE": str(cache)},
                  check_agreement=disagreeing)
    assert err.value.exit_code == 2
    assert "refused: edgectl's next token agrees with llama.cpp's on the same GGUF on 0.17 of 6 prompts" in \
        err.value.message and "nothing was installed" in err.value.message
    assert seen and seen[0][0].name.startswith(".")  # checked before the directory took its place
    assert [p.name for p in cache.iterdir() if p.name not in (".locks", "gguf", "downloads")] == []
    assert list((cache / "gguf").iterdir()) == []


@pytest.mark.engine
def test_edgectl_and_llama_server_agree_on_smollm2(pulled_smollm2, tmp_path):
    """The real check: both servers on SmolLM2's GGUF, next tokens compared (needs a llama.cpp build:
    the test command makes one, scripts/llama_cpp.sh; else `edgectl bench --build-llama-cpp`)."""
    found = find_llama_server(dict(os.environ))
    if found.path is None:
        pytest.skip(found.origin)
    lines = []
    record = agreement.check(pulled_smollm2, _gguf_of(pulled_smollm2), dict(os.environ), lines.append, tmp_path)
    assert record["checked"] and record["passed"], record
    assert record["prompts"] >= agreement.PROMPTS - 1 and record["prompts_tokenized_differently"] == 0, record
    assert record["next_token_top1_agreement"] >= agreement.REFUSE_BELOW
    assert any("llama-server" in line for line in lines)


def test_a_llama_server_that_cannot_read_the_file_leaves_the_model_unchecked(pulled_smollm2, tmp_path):
    """llama.cpp is the reference: when it cannot serve the file (an architecture newer than the
    build), there is nothing to compare with, and the pull goes on saying so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "llama-server"  # stands in for a build that cannot read this GGUF
    fake.write_text("#!/bin/sh\necho 'error: unknown model architecture' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "EDGECTL_MODEL_CACHE": str(tmp_path / "models")}  # no cached llama.cpp build beside it
    record = agreement.check(pulled_smollm2, _gguf_of(pulled_smollm2), env, lambda _: None, tmp_path / "logs")
    assert record["checked"] is False and "llama-server exited with code 1" in record["why"], record
    assert "unknown model architecture" in record["why"]
