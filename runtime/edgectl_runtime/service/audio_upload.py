"""One upload to ``/v1/audio/*``, checked by decoding it for real: what it is (seconds, sample
rate, channels, container, codec), or why the server refuses it (an HTTP status and one sentence
saying what was wrong and what to do).

Refused: an empty upload; bytes that are not audio; a WAV, MP3 or Ogg file cut short (its headers promise
more than arrived: ``audio_headers.py``; stock vLLM transcribes the part that decodes and answers
200, docs/speech-research.md); a decode that fails part-way; audio longer than the plan's
``max_audio_s`` or an upload bigger than its ``max_upload_bytes`` (413). Any sample rate and any
number of channels is accepted: vLLM resamples and downmixes (docs/speech-research.md).

WAV, FLAC and Ogg are decoded by libsndfile (soundfile), the rest (MP3, M4A, WebM, …) by FFmpeg
(PyAV), one block at a time and counted, never kept: the upload's bytes are read in place and no
decoded copy outlives its block. Decoding stops as soon as the audio runs over ``max_audio_s``.
It takes CPU time (tens of milliseconds for a minute of MP3 on this class): call it from a thread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from edgectl_runtime.service.audio_headers import (
    WavHeaderError,
    is_ogg,
    is_wav,
    mp3_frame_at,
    mp3_truncation,
    ogg_truncation,
    read_mp3_layout,
    read_wav_layout,
)
from edgectl_runtime.service.guarded_request import BAD_REQUEST, TOO_LARGE, Refusal

_SOUNDFILE_BLOCK_FRAMES = 64 * 1024
_UPLOAD_AGAIN = "upload the whole file again"
_FORMATS = "WAV, FLAC, Ogg, MP3, M4A or WebM audio"
_STATES_ITS_LENGTH = ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm")  # FFmpeg's demuxers: a header holds the duration


@dataclass(frozen=True)
class AudioUpload:
    """An upload that decoded whole."""

    seconds: float
    sample_rate: int
    channels: int
    container: str  # "WAV", "FLAC", "OGG" (libsndfile's names) or FFmpeg's demuxer ("mp3", "mov,mp4,…")
    codec: str  # libsndfile's subtype ("PCM_16", "VORBIS") or FFmpeg's decoder ("mp3float", "aac")


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def check_upload(data: bytes | memoryview, filename: str | None = None, content_type: str | None = None, *,
                 max_audio_s: float, max_upload_bytes: int) -> AudioUpload | Refusal:
    """Decode one upload whole and say what it is, or why it is refused."""
    what = f"the uploaded file {filename!r}" if filename else "the uploaded file"
    size = len(data)
    if size == 0:
        return Refusal(BAD_REQUEST, "empty", f"{what} is empty: send the audio's bytes in the form's `file` field")
    if size > max_upload_bytes:
        return Refusal(TOO_LARGE, "too_big",
                       f"{what} is {size / 1e6:.1f} MB, over this server's limit of {max_upload_bytes / 1e6:.1f} MB: "
                       "send a shorter or more compressed recording")
    view = memoryview(data)
    try:
        if is_wav(view) or _soundfile_magic(view):
            return _decode_soundfile(view, what, content_type, max_audio_s)
        return _decode_ffmpeg(view, what, content_type, max_audio_s)
    except _Refused as exc:
        return exc.refusal


# -- libsndfile: WAV, FLAC, Ogg ---------------------------------------------------------------------

def _soundfile_magic(view: memoryview) -> bool:
    return bytes(view[:4]) == b"fLaC" or is_ogg(view)


def _decode_soundfile(view: memoryview, what: str, content_type: str | None, max_audio_s: float) -> AudioUpload:
    import soundfile

    if is_wav(view):
        try:
            layout = read_wav_layout(view)
        except WavHeaderError as exc:
            if exc.truncated:
                raise _Refused(Refusal(BAD_REQUEST, "truncated",
                                       f"{what} is a truncated WAV: {exc}; {_UPLOAD_AGAIN}")) from None
            raise _Refused(_not_audio(what, content_type, f"a malformed WAV: {exc}")) from None
        _check_length(layout.seconds, what, max_audio_s)  # exact: the data is all there
    elif is_ogg(view):
        why = ogg_truncation(view)
        if why is not None:
            raise _Refused(Refusal(BAD_REQUEST, "truncated", f"{what} is a truncated Ogg file: {why}; {_UPLOAD_AGAIN}"))
    try:
        sound = soundfile.SoundFile(_ViewReader(view))
    except (soundfile.LibsndfileError, RuntimeError, TypeError):
        # a codec this libsndfile lacks (MP3 inside a WAV, Opus in an older one): FFmpeg may read it
        return _decode_ffmpeg(view, what, content_type, max_audio_s)
    with sound:
        rate, declared = sound.samplerate, sound.frames
        frames = 0
        try:
            for block in sound.blocks(blocksize=_SOUNDFILE_BLOCK_FRAMES, dtype="int16"):
                frames += len(block)
                _check_length(frames / rate, what, max_audio_s)
        except (soundfile.LibsndfileError, RuntimeError) as exc:
            raise _Refused(_damaged(what, frames / rate, declared / rate, str(exc))) from None
        if frames < declared:
            raise _Refused(_damaged(what, frames / rate, declared / rate, "the data ends early"))
        return _decoded(frames / rate, rate, sound.channels, sound.format, sound.subtype, what)


class _ViewReader(io.RawIOBase):
    """A read-only, seekable file over the upload's bytes, so libsndfile and FFmpeg read them in place
    (``io.BytesIO`` would copy anything but a ``bytes`` object)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self._view[self._pos:self._pos + len(buffer)]
        n = len(chunk)
        memoryview(buffer).cast("B")[:n] = chunk
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


# -- FFmpeg: MP3, M4A, WebM, … ---------------------------------------------------------------------

def _decode_ffmpeg(view: memoryview, what: str, content_type: str | None, max_audio_s: float) -> AudioUpload:
    import av

    layout = read_mp3_layout(view) if _mp3_start(view) else None
    why = mp3_truncation(layout) if layout is not None else None
    if why is not None:
        raise _Refused(Refusal(BAD_REQUEST, "truncated", f"{what} is a truncated MP3: {why}; {_UPLOAD_AGAIN}"))
    try:
        container = av.open(_ViewReader(view), mode="r")
    except av.error.FFmpegError as exc:
        raise _Refused(_not_audio(what, content_type, f"FFmpeg could not open it ({_said(exc)})")) from None
    with container:
        if not container.streams.audio:
            raise _Refused(_not_audio(what, content_type, "it holds no audio stream"))
        stream = container.streams.audio[0]
        rate = stream.rate or stream.codec_context.sample_rate
        declared_s = float(container.duration) / 1e6 if container.duration else None
        samples = 0
        try:
            for packet in container.demux(stream):
                for frame in packet.decode():
                    samples += frame.samples
                    rate = frame.sample_rate or rate
                if rate:
                    _check_length(samples / rate, what, max_audio_s)
        except av.error.FFmpegError as exc:
            raise _Refused(_damaged(what, samples / rate if rate else 0.0, declared_s, _said(exc))) from None
        if not rate:
            raise _Refused(_not_audio(what, content_type, "its audio stream has no sample rate"))
        seconds = samples / rate
        # A container that stores its length and decodes to less by more than its codec's priming
        # and padding: cut short. (FFmpeg estimates the others' lengths from the bit rate and the
        # size, far off for a variable bit rate: an MP3 is checked by its headers instead.)
        stated = container.format.name in _STATES_ITS_LENGTH
        if stated and declared_s is not None and seconds < declared_s - max(0.5, 0.02 * declared_s):
            raise _Refused(_damaged(what, seconds, declared_s, "the data ends early"))
        return _decoded(seconds, rate, stream.codec_context.channels, container.format.name,
                        stream.codec_context.name, what)


def _said(exc: Exception) -> str:
    """FFmpeg's words for an error, without its errno and function name."""
    return getattr(exc, "strerror", None) or str(exc)


def _mp3_start(view: memoryview) -> bool:
    """An ID3v2 tag or an MPEG audio frame header at the start: walk it as MP3."""
    return bytes(view[:3]) == b"ID3" or mp3_frame_at(view, 0) is not None


# -- verdicts --------------------------------------------------------------------------------------

def _check_length(seconds: float, what: str, max_audio_s: float) -> None:
    if seconds > max_audio_s:
        raise _Refused(Refusal(TOO_LARGE, "too_long",
                               f"{what} holds more than {max_audio_s:g} s of audio, this server's limit "
                               f"(at least {seconds:.1f} s): split it into pieces of at most {max_audio_s:g} s"))


def _decoded(seconds: float, rate: int, channels: int, container: str, codec: str, what: str) -> AudioUpload:
    if seconds <= 0:
        raise _Refused(Refusal(BAD_REQUEST, "empty", f"{what} holds no audio samples: send a recording that has some"))
    return AudioUpload(seconds, rate, channels, container, codec)


def _not_audio(what: str, content_type: str | None, why: str) -> Refusal:
    said = f" (sent as {content_type})" if content_type else ""
    return Refusal(BAD_REQUEST, "not_audio", f"{what}{said} is not audio this server can decode: {why}; send {_FORMATS}")


def _damaged(what: str, decoded_s: float, declared_s: float | None, why: str) -> Refusal:
    of = f" of the {declared_s:.1f} s its header states" if declared_s else ""
    return Refusal(BAD_REQUEST, "damaged", f"{what} stops decoding after {decoded_s:.1f} s{of} ({why}): it is "
                                           f"truncated or damaged; {_UPLOAD_AGAIN}")
