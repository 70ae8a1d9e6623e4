"""What one speech pass measures, and the figures made of it (the same for every arm).

Through a server (the vLLM arms), from the client's side, as a deployed service is used:
``POST /v1/audio/transcriptions`` with ``response_format=json``, ``temperature=0``,
``language=en`` (``Client.transcribe``); a clip's wall seconds run from sending the request to
the whole answer read. The anchors (faster-whisper, whisper.cpp) time the same clips in their
own process (``edgectl_runtime.tools.speech_anchor``), from the audio file to the text.

- the clip set, one clip at a time: each clip's text and wall seconds; the word error rate of
  the whole set against the reference texts (one corpus score, ``score``: wer.py's corpus WER);
- real-time factor (RTF) of the set's ~5 s and ~30 s clip (``use: rtf``; the 30 s one within
  one window): wall / audio seconds, lower is faster;
- time to the whole transcript: the wall seconds of the set's longest clip, answered whole
  (json, not streamed);
- four clips at once: the ~30 s clip four times, as four requests (four entries for a driver),
  since the set holds one clip that long and a whole window is what throughput is quoted for;
  aggregate audio seconds per second = the four's audio seconds / (first request sent → last
  answer read). No engine caches one request's audio for another (vLLM turns prefix caching off
  for encoder-decoder models: docs/speech-research.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgectl.bench.measure import MeasurementFailed, at_once
from edgectl.client import Client
from edgectl.contract.speech_clips import read_clip_set

CONCURRENT_CLIPS = 4  # the "four clips at once"
SHORT_S, WINDOW_S = 5.0, 30.0  # the clips the real-time factors are quoted for
# [(clip id, reference, hypothesis)] -> {"wer": corpus word error rate (0.0: every word right), …}
Score = Callable[[list[tuple[str, str, str]]], dict[str, Any]]


@dataclass(frozen=True)
class Clip:
    id: str
    path: Path
    seconds: float
    text: str  # the reference: what the clip says
    use: str = "wer"  # wer | rtf (clips.json's ``use``)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "file": str(self.path), "seconds": self.seconds, "text": self.text}


def read_clips(clips_json: Path) -> list[Clip]:
    """The clips a clip set's ``clips.json`` lists to be measured (``contract.speech_clips``'s format;
    a warm-up clip is not one of them)."""
    clip_set = read_clip_set(clips_json)
    return [Clip(id=c.id, path=clip_set.path(c).resolve(), seconds=c.seconds, text=c.text, use=c.use)
            for c in clip_set.clips if c.use != "warmup"]


@dataclass(frozen=True)
class Choice:
    """Which clips the figures are read from."""

    short: Clip  # nearest SHORT_S: its RTF
    window: Clip  # nearest WINDOW_S and at most one window: its RTF
    longest: Clip  # the time to its whole transcript
    together: tuple[Clip, ...]  # CONCURRENT_CLIPS sent at once

    def to_dict(self) -> dict[str, Any]:
        return {"short": self.short.id, "window": self.window.id, "longest": self.longest.id,
                "together": [c.id for c in self.together]}


def choose(clips: Sequence[Clip]) -> Choice:
    """The clips of each figure: the ``rtf`` clips nearest 5 s and 30 s (any clip when the set has
    none), the longest, and the 30 s one four times (ties: the first in the set)."""
    if not clips:
        raise ValueError("the clip set is empty")
    timed = [c for c in clips if c.use == "rtf"] or list(clips)
    one_window = [c for c in timed if c.seconds <= WINDOW_S] or timed
    window = min(one_window, key=lambda c: abs(c.seconds - WINDOW_S))
    together = tuple(Clip(id=f"{window.id}#{i + 1}", path=window.path, seconds=window.seconds, text=window.text,
                          use=window.use) for i in range(CONCURRENT_CLIPS))
    return Choice(short=min(timed, key=lambda c: abs(c.seconds - SHORT_S)), window=window,
                  longest=max(clips, key=lambda c: c.seconds), together=together)


def figures(results: Sequence[dict[str, Any]], clips: Sequence[Clip], choice: Choice, score: Score) -> dict[str, Any]:
    """A pass's figures from its clip-by-clip results (``{id, text, wall_s}``, one per clip of the set)."""
    by_id = {r["id"]: r for r in results}
    missing = [c.id for c in clips if c.id not in by_id]
    if missing:
        raise MeasurementFailed(f"no result for {len(missing)} clip(s), e.g. {missing[0]}")
    scored = score([(c.id, c.text, str(by_id[c.id]["text"])) for c in clips])
    return {
        "wer": scored["wer"], "wer_detail": scored,
        "rtf_5s": by_id[choice.short.id]["wall_s"] / choice.short.seconds,
        "rtf_30s": by_id[choice.window.id]["wall_s"] / choice.window.seconds,
        "transcript_s": by_id[choice.longest.id]["wall_s"],
        "audio_s": sum(c.seconds for c in clips),
        "wall_s": sum(by_id[c.id]["wall_s"] for c in clips),
    }


def aggregate(clips: Sequence[Clip], first_sent: float, last_done: float) -> float | None:
    """Audio seconds per second of ``clips`` done together between the two readings."""
    span = last_done - first_sent
    return sum(c.seconds for c in clips) / span if span > 0 else None


# -- through a server ------------------------------------------------------------------------------


def transcribe(client: Client, model: str, clip: Clip, timeout_s: float = 900) -> dict[str, Any]:
    """One clip through the OpenAI API: ``{id, text, wall_s}`` (plus the clock readings, for together())."""
    audio = clip.path.read_bytes()
    t_sent = time.perf_counter()
    answer = client.transcribe(model, audio, clip.path.name, timeout=timeout_s)
    t_done = time.perf_counter()
    return {"id": clip.id, "text": answer["text"], "wall_s": t_done - t_sent, "t_sent": t_sent, "t_done": t_done}


def one_by_one(client: Client, model: str, clips: Sequence[Clip]) -> list[dict[str, Any]]:
    """Every clip of the set, one after another."""
    return [_without_clock(transcribe(client, model, c)) for c in clips]


def together(client: Client, model: str, clips: Sequence[Clip], timeout_s: float = 900) -> dict[str, Any]:
    """``clips`` sent at once from one thread each; the aggregate audio seconds per second."""
    done = at_once([lambda c=c: transcribe(client, model, c, timeout_s) for c in clips], timeout_s,
                   lambda i: f"clip {clips[i].id}", what="transcriptions")
    first, last = min(r["t_sent"] for r in done), max(r["t_done"] for r in done)
    return {"aggregate_audio_s_per_s": aggregate(clips, first, last), "clips": [_without_clock(r) for r in done],
            "wall_s": last - first, "mode": "requests",
            "method": f"{len(clips)} transcription requests sent at once, one thread each; audio seconds / (first sent → "
                      "last answer)"}


def _without_clock(r: dict[str, Any]) -> dict[str, Any]:
    """A result without its perf_counter readings (meaningless outside the process that took them)."""
    return {k: v for k, v in r.items() if k not in ("t_sent", "t_done")}
