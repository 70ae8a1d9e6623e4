"""A speech clip set on disk: the ``clips.json`` both sides read, and the shipped warm-up clip.

The control plane writes a clip set (``edgectl/bench/speech/clips.py`` makes the audio); the
runtime's anchor driver (``edgectl_runtime.tools.speech_anchor``) and the bench read it; the
service transcribes the warm-up clip (:data:`WARMUP_WAV`) before it says READY. Pure Python.

``clips.json``::

    {"schema": "edgectl.speech-clips/1", "sample_rate": 16000,
     "tools": {"espeak-ng": "1.51", "sox": "14.4.2"},
     "clips": [{"id", "file", "seconds", "text", "voice", "speed", "noise", "use", "sha256"}, ...]}

``file`` is relative to the directory holding ``clips.json``; ``speed`` is espeak-ng's ``-s``
in words per minute; ``noise`` is null or ``{"color": "white"|"pink", "snr_db": float}``;
``use`` is ``wer`` (scored for word error rate), ``rtf`` (the ~5 s and ~30 s real-time-factor
clips, also scored) or ``warmup``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = "edgectl.speech-clips/1"
CLIPS_JSON = "clips.json"  # the index file's name inside a clip set's directory
SAMPLE_RATE = 16000  # every clip: 16 kHz mono 16-bit PCM WAV (Whisper's input rate)
USES = ("wer", "rtf", "warmup")
NOISE_COLORS = ("white", "pink")

_SPEECH_DATA = Path(__file__).resolve().parents[1] / "data" / "speech"
# The short clip the service transcribes before READY, and its clips.json-style entry.
WARMUP_WAV = _SPEECH_DATA / "warmup.wav"
WARMUP_JSON = _SPEECH_DATA / "warmup.json"


@dataclass(frozen=True)
class Noise:
    color: str  # sox synth's noise type: "white" or "pink"
    snr_db: float  # 20*log10(rms(speech clip) / rms(noise)), both over the whole clip


@dataclass(frozen=True)
class Clip:
    id: str
    file: str  # relative to the clip set's directory
    seconds: float
    text: str  # the reference transcript
    voice: str  # espeak-ng voice (+variant), e.g. "en-gb+f3"
    speed_wpm: int  # espeak-ng -s
    noise: Noise | None
    use: str  # one of USES
    sha256: str  # of the WAV file's bytes

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "file": self.file, "seconds": self.seconds, "text": self.text,
                "voice": self.voice, "speed": self.speed_wpm,
                "noise": None if self.noise is None else {"color": self.noise.color, "snr_db": self.noise.snr_db},
                "use": self.use, "sha256": self.sha256}


def noise_and_use(d: dict[str, Any]) -> tuple[Noise | None, str]:
    """A clip entry's (or recipe's) ``noise`` and ``use``, checked; raises KeyError, TypeError or ValueError."""
    noise = d["noise"]
    if noise is not None:
        if noise["color"] not in NOISE_COLORS:
            raise ValueError(f"clip {d['id']!r}: noise color {noise['color']!r} is not one of {NOISE_COLORS}")
        noise = Noise(str(noise["color"]), float(noise["snr_db"]))
    if d["use"] not in USES:
        raise ValueError(f"clip {d['id']!r}: use {d['use']!r} is not one of {USES}")
    return noise, str(d["use"])


def clip_from_dict(d: dict[str, Any]) -> Clip:
    """One clip entry; raises KeyError, TypeError or ValueError when it is malformed."""
    noise, use = noise_and_use(d)
    return Clip(str(d["id"]), str(d["file"]), float(d["seconds"]), str(d["text"]), str(d["voice"]),
                int(d["speed"]), noise, use, str(d["sha256"]))


@dataclass(frozen=True)
class ClipSet:
    directory: Path
    clips: tuple[Clip, ...]
    tools: dict[str, str]  # program -> version that made the audio

    def path(self, clip: Clip) -> Path:
        return self.directory / clip.file

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "sample_rate": SAMPLE_RATE, "tools": dict(self.tools),
                "clips": [c.to_dict() for c in self.clips]}


def write_clip_set(clip_set: ClipSet) -> Path:
    """Write ``clips.json`` into the set's directory; returns its path."""
    path = clip_set.directory / CLIPS_JSON
    path.write_text(json.dumps(clip_set.to_dict(), indent=1) + "\n", encoding="utf-8")
    return path


def read_clip_set(path: Path) -> ClipSet:
    """The clip set of ``path`` (a ``clips.json``, or the directory holding one); raises OSError,
    KeyError, TypeError or ValueError when it cannot be read."""
    if path.is_dir():
        path = path / CLIPS_JSON
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    if data.get("sample_rate") != SAMPLE_RATE:
        raise ValueError(f"{path}: sample_rate {data.get('sample_rate')!r}, expected {SAMPLE_RATE}")
    clips = tuple(clip_from_dict(c) for c in data["clips"])
    ids = [c.id for c in clips]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: clip ids repeat")
    return ClipSet(path.parent, clips, {str(k): str(v) for k, v in data.get("tools", {}).items()})


def warmup_clip() -> Clip:
    """The shipped warm-up clip's entry (its ``file`` is :data:`WARMUP_WAV`'s name)."""
    return clip_from_dict(json.loads(WARMUP_JSON.read_text(encoding="utf-8")))
