"""The tokenizer of a model directory: whether there is one vLLM can load, whether it has a chat
template, and what it was measured to cost the worker."""

from __future__ import annotations

import json
from pathlib import Path

from edgectl.errors import EdgectlError
from edgectl.models.cache import MANIFEST_NAME

# Any one of these makes a tokenizer transformers/vLLM can load (fast tokenizer, SentencePiece,
# GPT-2 style BPE vocab, Mistral tekken); tokenizer_config.json alone carries no vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tekken.json")


def has_tokenizer(path: Path) -> bool:
    found = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if "tokenizer.json" in found:
        try:
            json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EdgectlError(f"{path / 'tokenizer.json'}: not a valid tokenizer file ({exc}); "
                               "copy the model's tokenizer again") from None
    return bool(found) or any(path.glob("*.tiktoken"))


def has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        tok_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(tok_config, dict) and bool(tok_config.get("chat_template"))


# The measured cost of a model's tokenizer in the worker: in a pulled directory, its manifest's
# "tokenizer_cost" (edgectl/models/convert.py); in the catalog's shipped copy, this file.
TOKENIZER_COST_JSON = "tokenizer-cost.json"


def tokenizer_cost(path: Path) -> int | None:
    """The tokenizer's measured bytes recorded in ``path`` (a pulled directory or a shipped one), or None."""
    for name, key in ((MANIFEST_NAME, "tokenizer_cost"), (TOKENIZER_COST_JSON, None)):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        record = data.get(key) if key and isinstance(data, dict) else data
        value = record.get("bytes") if isinstance(record, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None
