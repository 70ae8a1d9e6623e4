"""The speech bench's test audio (edgectl/bench/speech/clips.py, edgectl/contract/speech_clips.py).

The recipe and the arithmetic are checked everywhere; making clips needs espeak-ng and SoX
(Debian packages of the same names) and is skipped, saying so, without them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import wave
from array import array
from dataclasses import replace
from pathlib import Path

import pytest

from edgectl.bench.speech import clips as clipmaker
from edgectl.bench.speech.clips import (
    HEADROOM,
    WINDOW_S,
    check_voices,
    make_clip,
    make_clip_set,
    make_warmup,
    noise_gain,
    read_pcm16,
    read_recipe,
    rms,
    tool_versions,
)
from edgectl.contract.speech_clips import (
    SAMPLE_RATE,
    WARMUP_JSON,
    WARMUP_WAV,
    read_clip_set,
    warmup_clip,
)
from edgectl.errors import EdgectlError

HAVE_TOOLS = shutil.which("espeak-ng") is not None and shutil.which("sox") is not None
needs_tools = pytest.mark.skipif(not HAVE_TOOLS, reason="espeak-ng or sox is not installed "
                                 "(apt-get install espeak-ng sox)")


def test_the_recipe_is_a_fixed_varied_english_set() -> None:
    clips, warmup = read_recipe()
    wer = [c for c in clips if c.use == "wer"]
    assert len(wer) >= 20 and {c.use for c in clips} == {"wer", "rtf"}
    assert len({c.voice for c in clips}) >= 6 and len({c.speed_wpm for c in clips}) >= 4
    assert {(c.noise.color, c.noise.snr_db) for c in clips if c.noise} == {("white", 20.0), ("pink", 10.0)}
    assert sorted(c.id for c in clips if c.use == "rtf") == ["rtf-30s", "rtf-5s"]
    # the normalization leaves numbers as they are: the reference texts hold none
    assert not any(re.search(r"\d", c.text) for c in (*clips, warmup))
    assert warmup.use == "warmup" and warmup.noise is None


def test_noise_gain_gives_the_asked_snr() -> None:
    # speech rms 0.1, noise rms 0.5: 20 dB below the speech is rms 0.01, a gain of 0.02
    assert noise_gain(0.1, 0.5, 20.0) == pytest.approx(0.02)
    assert noise_gain(0.1, 0.1, 0.0) == pytest.approx(1.0)
    assert rms(array("h", [16384, -16384])) == pytest.approx(0.5)
    assert rms(array("h")) == 0.0


def test_a_missing_program_names_its_debian_package(monkeypatch) -> None:
    monkeypatch.setattr(clipmaker.shutil, "which", lambda name: None if name == "sox" else "/usr/bin/" + name)
    with pytest.raises(EdgectlError) as err:
        tool_versions()
    assert str(err.value).startswith("sox is not installed") and "apt-get install sox" in str(err.value)
    assert "\n" not in str(err.value)


def test_the_shipped_warmup_clip_is_16k_mono_and_matches_its_entry() -> None:
    clip = warmup_clip()
    data = WARMUP_WAV.read_bytes()
    assert hashlib.sha256(data).hexdigest() == clip.sha256 and clip.file == WARMUP_WAV.name
    with wave.open(str(WARMUP_WAV), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        assert w.getnframes() / SAMPLE_RATE == pytest.approx(clip.seconds, abs=1e-4)
    assert 2.0 <= clip.seconds <= 3.0 and clip.text


@needs_tools
def test_the_clip_set_is_made_16k_mono_indexed_and_the_same_bytes_twice(tmp_path: Path) -> None:
    first = make_clip_set(tmp_path / "a")
    again = make_clip_set(tmp_path / "b")
    assert [c.sha256 for c in first.clips] == [c.sha256 for c in again.clips]
    read = read_clip_set(tmp_path / "a")
    assert read.clips == first.clips and read.tools == tool_versions()
    for clip in read.clips:
        path = read.path(clip)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == clip.sha256
        with wave.open(str(path), "rb") as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        assert 2.0 < clip.seconds < WINDOW_S
    by_id = {c.id: c for c in read.clips}
    assert 4.0 < by_id["rtf-5s"].seconds < 6.0 and 25.0 < by_id["rtf-30s"].seconds < WINDOW_S
    doc = json.loads((tmp_path / "a" / "clips.json").read_text())
    assert set(doc["clips"][0]) == {"id", "file", "seconds", "text", "voice", "speed", "noise", "use", "sha256"}


@needs_tools
def test_a_noisy_clip_has_the_stated_snr(tmp_path: Path) -> None:
    recipe = next(c for c in read_recipe()[0] if c.noise and c.noise.snr_db == 10.0)
    clean_recipe = replace(recipe, id=recipe.id + "-x", noise=None)
    noisy = make_clip(recipe, tmp_path / "noisy.wav", tmp_path)
    make_clip(clean_recipe, tmp_path / "clean.wav", tmp_path)
    mix, _ = read_pcm16(tmp_path / "noisy.wav")
    clean, _ = read_pcm16(tmp_path / "clean.wav")
    speech = array("h", (round(HEADROOM * s) for s in clean))
    noise = array("h", (m - s for m, s in zip(mix, speech)))
    snr = 20 * math.log10(rms(speech) / rms(noise))
    assert snr == pytest.approx(noisy.noise.snr_db, abs=0.2)
    assert max(abs(s) for s in mix) < 32767  # nothing clipped


@needs_tools
def test_a_voice_espeak_ng_lacks_is_refused_not_replaced() -> None:
    recipes, _ = read_recipe()
    check_voices(recipes)
    for voice in ("en-xx", "en-us+nope"):
        with pytest.raises(EdgectlError, match=f"has no voice {re.escape(voice)}"):
            check_voices((replace(recipes[0], voice=voice),))


@needs_tools
def test_make_warmup_reproduces_the_shipped_clip(tmp_path: Path) -> None:
    recorded = json.loads(WARMUP_JSON.read_text())["tools"]
    if tool_versions() != recorded:
        pytest.skip(f"the warm-up clip was made by {recorded}, this host has {tool_versions()}")
    clip = make_warmup(tmp_path / "warmup.wav", tmp_path / "warmup.json")
    assert (tmp_path / "warmup.wav").read_bytes() == WARMUP_WAV.read_bytes()
    assert clip == warmup_clip()
