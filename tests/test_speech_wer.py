"""Word error rate and its text normalization (edgectl/bench/speech/wer.py), on cases counted by hand."""

from __future__ import annotations

import pytest

from edgectl.bench.speech.wer import (
    WordErrors,
    align,
    corpus_wer,
    normalize,
    word_errors,
)


@pytest.mark.parametrize(("text", "normalized"), [
    (" The quick brown fox jumps, over the lazy dog.", "the quick brown fox jumps over the lazy dog"),
    ("Don't STOP!  It’s fine?", "dont stop its fine"),
    ("A well-known café — near the river/bank", "a well known cafe near the river bank"),
    ("[MUSIC] Hello (laughs) there", "hello there"),
    ("Sales grew by 12% & 1,000,000 units; pi is 3.14.", "sales grew by 12 percent and 1000000 units pi is 3.14"),
    ("twelve percent, Mr. Smith", "twelve percent mr smith"),  # numbers and abbreviations stay as written
    ("", ""),
    ("...!?", ""),
])
def test_normalize(text: str, normalized: str) -> None:
    assert normalize(text) == normalized


def test_identical_after_normalization_is_no_error() -> None:
    e = word_errors("The quick brown fox jumps over the lazy dog near the river bank.",
                    " the quick brown fox jumps over the lazy dog, near the river bank")
    assert (e.reference_words, e.edits, e.wer) == (13, 0, 0.0)


def test_each_kind_of_edit_counted_by_hand() -> None:
    # "round" for "brown", "so" for "jumps": 2 substitutions (not a deletion plus an insertion, 3 edits)
    e = align("the quick brown fox jumps over the lazy dog".split(),
              "the quick round fox so over the lazy dog".split())
    assert (e.substitutions, e.deletions, e.insertions, e.edits) == (2, 0, 0, 2)
    e = align("a b c d".split(), "a c d e".split())  # b deleted, e inserted
    assert (e.substitutions, e.deletions, e.insertions) == (0, 1, 1)
    assert e.wer == pytest.approx(2 / 4)
    assert align("a b".split(), []) == WordErrors(2, 0, 2, 0)
    assert align([], "a b".split()) == WordErrors(0, 0, 0, 2)
    assert align("a".split(), "x y z".split()).wer == pytest.approx(3.0)  # insertions can exceed 1


def test_a_real_transcript_difference() -> None:
    # the reference of the prior study's short clip against faster-whisper's answer on it
    e = word_errors("The quick brown fox jumps over the lazy dog near the river bank.",
                    "The quick round fox jump, Sover the lazy dog near the river bank.")
    # round/brown, jump/jumps, sover/over: 3 substitutions of 13 words
    assert (e.substitutions, e.deletions, e.insertions, e.reference_words) == (3, 0, 0, 13)


def test_corpus_wer_weighs_every_word_the_same() -> None:
    c = corpus_wer([("short", "hello there", "hello"),  # 1 deletion of 2 words: 50 %
                    ("long", "one two three four five six seven eight", "one two three four five six seven eight")])
    assert c.per_clip["short"].wer == pytest.approx(0.5) and c.per_clip["long"].wer == 0.0
    assert c.wer == pytest.approx(1 / 10)  # not the mean of per-clip rates (25 %)
    assert c.to_dict()["total"] == {"reference_words": 10, "substitutions": 0, "deletions": 1, "insertions": 0,
                                    "edits": 1, "wer": pytest.approx(0.1)}


def test_undefined_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        _ = WordErrors(0, 0, 0, 1).wer
    with pytest.raises(ValueError):
        corpus_wer([("a", "", "x")])
    with pytest.raises(ValueError):
        corpus_wer([("a", "x", "x"), ("a", "y", "y")])
