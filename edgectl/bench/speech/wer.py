"""Word error rate of transcripts against the clips' reference texts.

WER = (substitutions + deletions + insertions) / reference words, from the minimum word-level
edit distance. Over a clip set it is the *corpus* WER: total edits over total reference words
(each word weighs the same; a mean of per-clip rates would give a short clip's one error the
weight of a long clip's many). Per-clip counts are kept for the report.

Both sides are normalized first, in the spirit of Whisper's English normalizer (openai/whisper,
``whisper/normalizers/english.py``) but written here and smaller, because the references are
known, plain sentences (``edgectl/data/speech/clipset.json``):

- Unicode compatibility form, accents dropped (``café`` → ``cafe``), lower case: case and accents
  are the writer's choice, not a recognition error;
- text in brackets or parentheses removed: Whisper's annotations (``[MUSIC]``, ``(laughs)``) are
  not words spoken;
- apostrophes removed inside words (``don't`` → ``dont``), on both sides, so "don't" and
  "dont" agree without a contraction table;
- hyphens, dashes and slashes split words (``well-known`` → ``well known``): engines differ in
  whether they hyphenate;
- ``%`` → ``percent``, ``&`` → ``and`` (a symbol for a word the speaker said);
- a thousands comma between digits removed (``1,000`` → ``1000``) and a decimal point between
  digits kept (``3.5``); every other punctuation mark removed.

Not done, unlike Whisper's normalizer: numbers are left as they are written, so "twelve" and
"12" differ (the clip set's sentences hold no numbers for that reason); British and American
spellings are not reconciled (the sentences avoid such words); filler words are not removed.
Pure Python.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

_BRACKETED = re.compile(r"\[[^\]]*\]|\([^)]*\)")
_APOSTROPHE = re.compile(r"(?<=\w)['\u2019\u2018`](?=\w)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_DECIMAL = re.compile(r"(?<=\d)\.(?=\d)")
_DECIMAL_MARK = "\x00"  # stands for a kept decimal point while other periods are removed
_NOT_WORD = re.compile(r"[^a-z0-9\x00]+")


def normalize(text: str) -> str:
    """``text`` as the word error rate compares it (see the module docstring)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = _BRACKETED.sub(" ", text)
    text = _APOSTROPHE.sub("", text)
    text = text.replace("%", " percent ").replace("&", " and ")
    text = _THOUSANDS.sub("", text)
    text = _DECIMAL.sub(_DECIMAL_MARK, text)
    text = _NOT_WORD.sub(" ", text)
    return " ".join(text.replace(_DECIMAL_MARK, ".").split())


def words(text: str) -> list[str]:
    return normalize(text).split()


@dataclass(frozen=True)
class WordErrors:
    reference_words: int
    substitutions: int
    deletions: int
    insertions: int

    @property
    def edits(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """Edits per reference word (can exceed 1 with many insertions)."""
        if self.reference_words == 0:
            raise ValueError("word error rate of an empty reference")
        return self.edits / self.reference_words

    def __add__(self, other: WordErrors) -> WordErrors:
        return WordErrors(self.reference_words + other.reference_words, self.substitutions + other.substitutions,
                          self.deletions + other.deletions, self.insertions + other.insertions)

    def to_dict(self) -> dict[str, float | int]:
        return {"reference_words": self.reference_words, "substitutions": self.substitutions,
                "deletions": self.deletions, "insertions": self.insertions, "edits": self.edits,
                "wer": self.wer}


def align(reference: list[str], hypothesis: list[str]) -> WordErrors:
    """The minimum number of word edits turning ``reference`` into ``hypothesis``, split by kind.

    Levenshtein distance by dynamic programming; among alignments of equal cost the backtrace
    prefers a match or substitution, then a deletion, then an insertion (the total is the same
    for every optimal alignment, the split may differ)."""
    n, m = len(reference), len(hypothesis)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        cost[i][0] = i
    for j in range(m + 1):
        cost[0][j] = j
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            diag = cost[i - 1][j - 1] + (reference[i - 1] != hypothesis[j - 1])
            cost[i][j] = min(diag, cost[i - 1][j] + 1, cost[i][j - 1] + 1)
    subs = dels = ins = 0
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0 and cost[i][j] == cost[i - 1][j - 1] + (reference[i - 1] != hypothesis[j - 1]):
            subs += reference[i - 1] != hypothesis[j - 1]
            i, j = i - 1, j - 1
        elif i > 0 and cost[i][j] == cost[i - 1][j] + 1:
            dels, i = dels + 1, i - 1
        else:
            ins, j = ins + 1, j - 1
    return WordErrors(n, subs, dels, ins)


def word_errors(reference: str, hypothesis: str) -> WordErrors:
    """The word errors of one transcript, both texts normalized."""
    return align(words(reference), words(hypothesis))


@dataclass(frozen=True)
class CorpusWer:
    per_clip: dict[str, WordErrors]  # clip id -> its errors
    total: WordErrors

    @property
    def wer(self) -> float:
        """Total edits / total reference words."""
        return self.total.wer

    def to_dict(self) -> dict[str, object]:
        return {"wer": self.wer, "total": self.total.to_dict(),
                "clips": {k: v.to_dict() for k, v in self.per_clip.items()}}


def corpus_wer(transcripts: Iterable[tuple[str, str, str]]) -> CorpusWer:
    """Corpus WER of ``(clip id, reference, hypothesis)`` triples."""
    per_clip: dict[str, WordErrors] = {}
    for clip_id, reference, hypothesis in transcripts:
        if clip_id in per_clip:
            raise ValueError(f"clip {clip_id!r} given twice")
        per_clip[clip_id] = word_errors(reference, hypothesis)
    total = sum(per_clip.values(), WordErrors(0, 0, 0, 0))
    if total.reference_words == 0:
        raise ValueError("no reference words: the word error rate is undefined")
    return CorpusWer(per_clip, total)
