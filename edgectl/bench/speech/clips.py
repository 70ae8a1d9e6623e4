"""The speech bench's test audio, made on this machine, never downloaded.

The recipe is data (``edgectl/data/speech/clipset.json``): sentences written for edgectl, and per
clip which sentences, which espeak-ng voice, which speed and which noise. Each clip is made by

1. ``espeak-ng -v VOICE -s SPEED -w raw.wav TEXT`` (22.05 kHz mono);
2. ``sox -R -D raw.wav -r 16000 -c 1 -b 16 clean.wav``: resampled to Whisper's 16 kHz mono
   16-bit. ``-D``: no dither. SoX dithers by default whenever it requantizes, with random noise,
   so two runs gave different bytes; ``-R``: SoX's random generator seeded the same every run;
3. for a noisy clip, ``sox -R -D clean.wav noise.wav synth COLOR`` (full-scale noise of the same
   length), then ``sox -R -D -m -v A clean.wav -v B noise.wav clip.wav`` with ``B/A`` chosen so
   that ``20 log10(rms(clean) / (B/A * rms(noise)))`` is the recipe's SNR, both RMS over the whole
   clip (pauses included). With ``-v`` on every input, ``-m`` does not rescale by 1/n.
   ``A = HEADROOM`` keeps the sum below full scale.

With these options espeak-ng 1.51 and SoX 14.4.2 give the same bytes on every run (checked:
each clip's sha256 is in ``clips.json``; ``tests/test_speech_clips.py`` makes a clip twice).

The ``rtf-30s`` clip (several sentences spoken as one text) must stay under one 30 s Whisper
window, so that every engine transcribes it in one pass; the maker refuses a set where it does
not (another espeak-ng version could speak slower).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import tempfile
import wave
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.contract.speech_clips import (
    SAMPLE_RATE,
    WARMUP_JSON,
    WARMUP_WAV,
    Clip,
    ClipSet,
    Noise,
    noise_and_use,
    write_clip_set,
)
from edgectl.errors import EdgectlError
from edgectl.paths import data_dir

RECIPE_JSON = data_dir() / "speech" / "clipset.json"
RECIPE_SCHEMA = "edgectl.speech-clipset/1"
WINDOW_S = 30.0  # one Whisper window: the longest clip every engine transcribes in one pass
HEADROOM = 0.8  # the clean speech's gain in a noisy mix (espeak-ng peaks reach about -1 dBFS)
# Debian package of each program the maker runs (what to install when it is missing).
_PROGRAMS = {"espeak-ng": "espeak-ng", "sox": "sox"}


@dataclass(frozen=True)
class ClipRecipe:
    id: str
    text: str  # the sentences joined by one space
    voice: str
    speed_wpm: int
    noise: Noise | None
    use: str


def read_recipe(path: Path = RECIPE_JSON) -> tuple[tuple[ClipRecipe, ...], ClipRecipe]:
    """The clip set's recipes and the warm-up clip's recipe."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != RECIPE_SCHEMA:
            raise ValueError(f"schema {data.get('schema')!r}, expected {RECIPE_SCHEMA!r}")
        sentences = {str(k): str(v) for k, v in data["sentences"].items()}
        clips = tuple(_recipe(c, sentences) for c in data["clips"])
        warmup = _recipe(data["warmup"], sentences)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgectlError(f"{path}: the shipped clip recipe cannot be read ({exc}): reinstall edgectl") from None
    ids = [c.id for c in clips]
    if len(set(ids)) != len(ids):
        raise EdgectlError(f"{path}: clip ids repeat: reinstall edgectl")
    return clips, warmup


def _recipe(d: dict[str, Any], sentences: dict[str, str]) -> ClipRecipe:
    noise, use = noise_and_use(d)
    text = " ".join(sentences[s] for s in d["sentences"])
    return ClipRecipe(str(d["id"]), text, str(d["voice"]), int(d["speed"]), noise, use)


# -- the programs ----------------------------------------------------------------------------------


def _program(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EdgectlError(f"{name} is not installed (the speech bench makes its test audio with it): "
                           f"apt-get install {_PROGRAMS[name]}")
    return path


def tool_versions() -> dict[str, str]:
    """The version of each program that makes the audio, as it reports it."""
    espeak = _run([_program("espeak-ng"), "--version"]).split()  # "eSpeak NG text-to-speech: 1.51  Data at: …"
    sox = _run([_program("sox"), "--version"]).split()  # "sox:      SoX v14.4.2"
    return {"espeak-ng": espeak[espeak.index("text-to-speech:") + 1] if "text-to-speech:" in espeak else "?",
            "sox": sox[-1].lstrip("v")}


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EdgectlError(f"{Path(cmd[0]).name} failed (exit {done.returncode}): {last[0]}")
    return done.stdout


def check_voices(recipes: tuple[ClipRecipe, ...]) -> None:
    """Refuse a voice espeak-ng does not have: given one, it speaks with its default voice and
    exits 0 (checked with espeak-ng 1.51), which would make a different clip silently."""
    espeak = _program("espeak-ng")
    languages = {line.split()[1] for line in _run([espeak, "--voices"]).splitlines()[1:] if line.split()}
    variants = {line.split()[4].rsplit("/", 1)[-1] for line in _run([espeak, "--voices=variant"]).splitlines()[1:]
                if len(line.split()) > 4}
    for r in recipes:
        language, _, variant = r.voice.partition("+")
        if language not in languages or (variant and variant not in variants):
            raise EdgectlError(f"espeak-ng {tool_versions()['espeak-ng']} has no voice {r.voice} (clip {r.id}; "
                               f"espeak-ng --voices and --voices=variant list them): the recipe was written for 1.51")


# -- audio arithmetic (stdlib only: the control plane has no numpy) ---------------------------------


def read_pcm16(path: Path) -> tuple[array[int], int]:
    """The samples of a 16-bit mono WAV and its sample rate."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: not 16-bit mono")
        samples = array("h", w.readframes(w.getnframes()))
        return samples, w.getframerate()


def rms(samples: array[int]) -> float:
    """Root mean square, in full-scale units (1.0 = 32768)."""
    if not samples:
        return 0.0
    return math.sqrt(math.fsum(float(s) * s for s in samples) / len(samples)) / 32768.0


def noise_gain(speech_rms: float, noise_rms: float, snr_db: float) -> float:
    """The gain on the noise, relative to the speech's, that gives ``snr_db``."""
    return speech_rms / (noise_rms * 10 ** (snr_db / 20))


# -- making clips ---------------------------------------------------------------------------------


def make_clip(recipe: ClipRecipe, out: Path, work: Path) -> Clip:
    """Make one clip at ``out`` (``work``: a scratch directory); its entry, ``file`` = out's name."""
    espeak, sox = _program("espeak-ng"), _program("sox")
    raw, clean = work / f"{recipe.id}.raw.wav", work / f"{recipe.id}.clean.wav"
    _run([espeak, "-v", recipe.voice, "-s", str(recipe.speed_wpm), "-w", str(raw), recipe.text])
    _run([sox, "-R", "-D", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(clean)])
    if recipe.noise is None:
        shutil.copyfile(clean, out)
    else:
        noise = work / f"{recipe.id}.noise.wav"
        _run([sox, "-R", "-D", str(clean), str(noise), "synth", recipe.noise.color + "noise"])
        gain = noise_gain(rms(read_pcm16(clean)[0]), rms(read_pcm16(noise)[0]), recipe.noise.snr_db)
        _run([sox, "-R", "-D", "-m", "-v", f"{HEADROOM:.6f}", str(clean), "-v", f"{HEADROOM * gain:.6f}",
              str(noise), str(out)])
    samples, rate = read_pcm16(out)
    if rate != SAMPLE_RATE:
        raise EdgectlError(f"{out}: sox wrote {rate} Hz, expected {SAMPLE_RATE}")
    return Clip(recipe.id, out.name, round(len(samples) / SAMPLE_RATE, 4), recipe.text, recipe.voice,
                recipe.speed_wpm, recipe.noise, recipe.use, hashlib.sha256(out.read_bytes()).hexdigest())


def make_clip_set(directory: Path, recipe_path: Path = RECIPE_JSON) -> ClipSet:
    """Make every clip of the recipe into ``directory`` (created) and write its ``clips.json``."""
    recipes, _warmup = read_recipe(recipe_path)
    tools = tool_versions()
    check_voices(recipes)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgectl-clips-") as tmp:
        clips = tuple(make_clip(r, directory / f"{r.id}.wav", Path(tmp)) for r in recipes)
    for clip in clips:
        if clip.use == "rtf" and clip.seconds >= WINDOW_S:
            raise EdgectlError(f"clip {clip.id} is {clip.seconds:.2f} s, not under one {WINDOW_S:.0f} s window "
                               f"(espeak-ng {tools['espeak-ng']} speaks slower than 1.51): shorten it in {recipe_path}")
    clip_set = ClipSet(directory, clips, tools)
    write_clip_set(clip_set)
    return clip_set


def make_warmup(wav: Path = WARMUP_WAV, entry: Path = WARMUP_JSON, recipe_path: Path = RECIPE_JSON) -> Clip:
    """Make the warm-up clip the package ships (run once by hand; the result is committed)."""
    _recipes, recipe = read_recipe(recipe_path)
    check_voices((recipe,))
    with tempfile.TemporaryDirectory(prefix="edgectl-clips-") as tmp:
        clip = make_clip(recipe, wav, Path(tmp))
    entry.write_text(json.dumps({**clip.to_dict(), "tools": tool_versions()}, indent=1) + "\n", encoding="utf-8")
    return clip
