"""Audio made here for the upload tests: speech by espeak-ng, converted by sox, MP3 and M4A encoded by
PyAV (FFmpeg's libmp3lame and aac). Nothing is downloaded."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

SENTENCE = "The quick brown fox jumps over the lazy dog."


def need_tools() -> None:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian: apt-get install {tool})")


def speech_wav(folder: Path) -> Path:
    """About 3 s of speech, 22050 Hz mono 16-bit, as espeak-ng writes it."""
    need_tools()
    path = folder / "speech.wav"
    if not path.exists():
        subprocess.run(["espeak-ng", "-w", str(path), SENTENCE], check=True, capture_output=True)
    return path


def sox(source: Path, target: Path, *effects: str, options: tuple[str, ...] = ()) -> Path:
    """``sox [options] source target effects…``: another container, rate or channel count."""
    subprocess.run(["sox", str(source), *options, str(target), *effects], check=True, capture_output=True)
    return target


def tone_wav(target: Path, seconds: float, rate: int = 8000) -> Path:
    """A sine tone of ``seconds`` (cheap long audio: 8 kHz mono)."""
    need_tools()
    subprocess.run(["sox", "-n", "-r", str(rate), "-c", "1", "-b", "16", str(target), "synth", str(seconds),
                    "sine", "440"], check=True, capture_output=True)
    return target


def encode(wav: Path, fmt: str, codec: str, **options: str) -> bytes:
    """``wav`` encoded by PyAV into ``fmt`` (``options``: the muxer's, e.g. ``write_xing="0"``)."""
    import av
    import soundfile

    pcm, rate = soundfile.read(str(wav), dtype="int16", always_2d=True)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt, options=options) as out:
        layout = "mono" if pcm.shape[1] == 1 else "stereo"
        stream = out.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=layout)
        frame.rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def wav_header(sample_rate: int, channels: int, bits: int, data_bytes: int) -> bytes:
    """A canonical 44-byte PCM WAV header declaring ``data_bytes`` of audio."""
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", data_bytes))
