"""The lean tokenizer (runtime/edgectl_runtime/vllm_plugin/lean.py, the plan's ``levers.tokenizer``): one load,
no construction inputs kept, and the same tokens, chat template and answers as vLLM's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "runtime"))

from edgectl_runtime.vllm_plugin import lean  # noqa: E402

RUNTIME_PYTHON = Path("/opt/edgectl/venv/bin/python")


class Built:
    """A stand-in for a transformers fast tokenizer: built from ``_vocab``/``_merges`` in ``__init__``."""

    def __init__(self, vocab, merges):
        self._vocab, self._merges = vocab, merges
        self._tokenizer = ("rust", len(vocab), len(merges))

    def save_vocabulary(self, path):  # saving to disk may read them: it is never called by a server
        return self._vocab, self._merges

    def encode(self, text):
        return [len(text)]


class ReadsVocabLater(Built):
    def token_id(self, token):
        return [self._vocab[t] for t in (token,)][0]  # inside a comprehension: a nested code object


class NotRustBacked:
    def __init__(self):
        self._vocab = {"a": 0}


def test_construction_inputs_nothing_reads_again_are_released():
    tok = Built({"a": 0, "b": 1}, [("a", "b")])
    assert lean.release_construction_inputs(tok) == ["_vocab", "_merges"]
    assert not hasattr(tok, "_vocab") and not hasattr(tok, "_merges")
    assert tok.encode("abc") == [3]


def test_an_input_a_method_reads_after_init_is_kept():
    assert lean.read_after_init(ReadsVocabLater, "_vocab")
    assert not lean.read_after_init(ReadsVocabLater, "_merges")
    tok = ReadsVocabLater({"a": 0}, [])
    assert lean.release_construction_inputs(tok) == ["_merges"]
    assert tok.token_id("a") == 0


def test_a_tokenizer_without_a_rust_backend_is_left_alone():
    tok = NotRustBacked()
    assert lean.release_construction_inputs(tok) == []
    assert tok._vocab == {"a": 0}


def test_processor_files_are_looked_for_in_a_local_directory(tmp_path):
    assert not lean.has_processor_files(str(tmp_path))
    (tmp_path / "preprocessor_config.json").write_text("{}")
    assert lean.has_processor_files(str(tmp_path))
    assert lean.has_processor_files("org/a-hub-name")  # not a directory: vLLM decides, as before
    assert lean.has_processor_files(None)


def _model_dirs(pulled_smollm2) -> list[Path]:
    dirs = [pulled_smollm2]
    gemma = pulled_smollm2.parent / "gemma3-270m"  # a 262144-token vocabulary, when pulled here
    if (gemma / "tokenizer.json").exists():
        dirs.append(gemma)
    return dirs


# In a fresh interpreter (the patch changes vLLM's modules): the tokenizer as vLLM loads it and the
# chat template vLLM resolves, with or without the lean tokenizer; which construction inputs remain;
# whether a processor was loaded.
PROBE = """
import json, sys
from edgectl_runtime.vllm_plugin import lean
if sys.argv[2] == "lean":
    lean.share_tokenizer()
from vllm.tokenizers.registry import cached_get_tokenizer
from vllm.renderers import hf as hf_renderer
from vllm.transformers_utils.processor import cached_get_processor
tok = cached_get_tokenizer(sys.argv[1], tokenizer_mode="auto", trust_remote_code=False)
processor_template = hf_renderer._try_get_processor_chat_template(tok, revision=None, code_revision=None,
                                                                  trust_remote_code=False)
text = "The capital of France is Paris. Ünïcödé, 東京, emoji 🙂 and code: def f(x): return x**2"
print(json.dumps({
    "ids": tok.encode(text), "decoded": tok.decode(tok.encode(text)), "vocab": len(tok.get_vocab()),
    "template": tok.chat_template, "processor_template": processor_template,
    "processor_loaded": cached_get_processor.cache_info().currsize > 0,
    "held": [n for n in lean.CONSTRUCTION_INPUTS if n in vars(tok)],
    "read_after_init": [n for n in lean.CONSTRUCTION_INPUTS if lean.read_after_init(type(tok), n)],
}))
"""


def _probe(model_dir: Path, mode: str) -> dict:
    out = subprocess.run([str(RUNTIME_PYTHON), "-c", PROBE, str(model_dir), mode], capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": f"{REPO}:{REPO / 'runtime'}", "PATH": "/usr/bin:/bin",
                                           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_the_lean_tokenizer_tokenizes_and_templates_as_vllms_own(pulled_smollm2):
    """On the catalog's real tokenizers: vLLM's own probe finds no processor chat template in the
    model directory (so skipping it changes no answer, and vLLM loaded the whole tokenizer again
    to find that out); the lean one loads nothing more; the tokens, the decoded text, the
    vocabulary and the chat template are the same; no construction input is left that its class
    does not read again."""
    for model_dir in _model_dirs(pulled_smollm2):
        stock, slim = _probe(model_dir, "vllm"), _probe(model_dir, "lean")
        assert stock["processor_template"] is None and stock["processor_loaded"], model_dir
        assert slim["processor_template"] is None and not slim["processor_loaded"], model_dir
        for key in ("ids", "decoded", "vocab", "template"):
            assert slim[key] == stock[key], (model_dir, key)
        assert set(slim["held"]) <= set(slim["read_after_init"]), (model_dir, slim)
