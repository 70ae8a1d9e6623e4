"""What a WAV, MP3 or Ogg file's own headers promise, read without decoding: a truncated upload is
one whose headers promise more bytes than arrived.

Stock vLLM transcribes the decoded part of a truncated WAV or MP3 and answers 200
(docs/speech-research.md, "Bad input"), and the decoders it uses say nothing: PyAV decodes an MP3
cut mid-frame, or cut by whole frames, without an error (tests/test_audio_upload.py makes both), so
the promise is read here and compared with the bytes present.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# -- WAV -------------------------------------------------------------------------------------------

# A writer that streams to a pipe cannot go back to fill in the sizes: it leaves 0 or 0xFFFFFFFF
# (libsndfile and FFmpeg do), and the data runs to the end of the file.
_WAV_STREAMED_SIZES = (0, 0xFFFFFFFF)


@dataclass(frozen=True)
class WavLayout:
    """A RIFF/WAVE file's format chunk and its data chunk as the header declares them."""

    format_tag: int  # 1 PCM, 3 float, 0xFFFE extensible, 0x55 MP3 inside a WAV…
    channels: int
    sample_rate: int
    block_align: int  # bytes per sample frame, all channels
    data_bytes: int  # what the data chunk declares (or, streamed, what is present)
    data_present_bytes: int
    streamed: bool  # the sizes were left unset: the data runs to the end of the file

    @property
    def seconds(self) -> float:
        return self.data_bytes / self.block_align / self.sample_rate if self.block_align and self.sample_rate else 0.0


class WavHeaderError(ValueError):
    """A RIFF/WAVE header that is cut short (``truncated``) or malformed."""

    def __init__(self, message: str, truncated: bool) -> None:
        super().__init__(message)
        self.truncated = truncated


def is_wav(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == b"RIFF" and (len(data) < 12 or bytes(data[8:12]) == b"WAVE")


def read_wav_layout(data: bytes | memoryview) -> WavLayout:
    """The format and data chunks of a RIFF/WAVE file (``is_wav``), or WavHeaderError.

    Chunks are walked as the RIFF layout has them: a 4-byte id, a little-endian 4-byte size, the
    body, a pad byte after an odd size. Truncated: the header stops before the data chunk, or the
    data chunk declares more bytes than follow it.
    """
    size = len(data)
    if size < 12:
        raise WavHeaderError(f"its RIFF header is cut off ({size} of 12 bytes)", truncated=True)
    pos, fmt = 12, None
    while True:
        if pos + 8 > size:
            raise WavHeaderError(f"its header ends after {size} bytes, before the audio data chunk", truncated=True)
        chunk_id = bytes(data[pos:pos + 4])
        (chunk_bytes,) = struct.unpack_from("<I", data, pos + 4)
        body = pos + 8
        if chunk_id == b"fmt ":
            if chunk_bytes < 16:
                raise WavHeaderError(f"its format chunk is {chunk_bytes} bytes, under the 16 a WAV needs",
                                     truncated=False)
            if body + 16 > size:
                raise WavHeaderError(f"its format chunk is cut off after {size} bytes", truncated=True)
            fmt = struct.unpack_from("<HHIIH", data, body)
        elif chunk_id == b"data":
            if fmt is None:
                raise WavHeaderError("its audio data comes before any format chunk", truncated=False)
            format_tag, channels, sample_rate, _byte_rate, block_align = fmt
            present = size - body
            streamed = chunk_bytes in _WAV_STREAMED_SIZES
            if not streamed and chunk_bytes > present:
                raise WavHeaderError(_wav_cut_message(chunk_bytes, present, block_align, sample_rate), truncated=True)
            return WavLayout(format_tag, channels, sample_rate, block_align,
                             present if streamed else chunk_bytes, present, streamed)
        pos = body + chunk_bytes + (chunk_bytes & 1)


def _wav_cut_message(declared: int, present: int, block_align: int, sample_rate: int) -> str:
    if block_align and sample_rate:
        per_s = block_align * sample_rate
        return (f"its header promises {declared / per_s:.2f} s of audio ({declared} bytes) "
                f"but only {present / per_s:.2f} s ({present} bytes) arrived")
    return f"its header promises {declared} bytes of audio but only {present} arrived"


# -- MP3 -------------------------------------------------------------------------------------------
#
# MPEG-1/2/2.5 audio frame headers (ISO/IEC 11172-3 and 13818-3): 11 sync bits, version, layer,
# bit-rate index, sample-rate index, padding. Kbit/s by (MPEG-1 or not, layer); index 0 is the
# "free format" (no length in the header), 15 is invalid.
_KBPS = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES_HZ = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # by version bits
_RESYNC_WINDOW_BYTES = 64 * 1024  # how far past junk (or a tag) the walk looks for the next frame


@dataclass(frozen=True)
class Mp3Frame:
    length_bytes: int
    samples: int
    sample_rate: int
    mpeg1: bool
    mono: bool


def mp3_frame_at(data: bytes | memoryview, pos: int) -> Mp3Frame | None:
    """The MPEG audio frame whose header starts at ``pos``, or None (no header there, or a free-format one)."""
    if pos + 4 > len(data):
        return None
    b0, b1, b2, b3 = data[pos], data[pos + 1], data[pos + 2], data[pos + 3]
    if b0 != 0xFF or b1 & 0xE0 != 0xE0:
        return None
    version, layer_bits = (b1 >> 3) & 3, (b1 >> 1) & 3
    rate_index, kbps_index = (b2 >> 2) & 3, b2 >> 4
    if version == 1 or layer_bits == 0 or rate_index == 3 or kbps_index in (0, 15):
        return None
    layer, mpeg1 = 4 - layer_bits, version == 3
    bits_per_s = _KBPS[(mpeg1, layer)][kbps_index] * 1000
    rate = _RATES_HZ[version][rate_index]
    padding = (b2 >> 1) & 1
    if layer == 1:
        return Mp3Frame((12 * bits_per_s // rate + padding) * 4, 384, rate, mpeg1, b3 >> 6 == 3)
    if layer == 3 and not mpeg1:
        return Mp3Frame(72 * bits_per_s // rate + padding, 576, rate, mpeg1, b3 >> 6 == 3)
    return Mp3Frame(144 * bits_per_s // rate + padding, 1152, rate, mpeg1, b3 >> 6 == 3)


def id3v2_end(data: bytes | memoryview) -> int:
    """Where the audio starts after any ID3v2 tags (10-byte header, sync-safe size, optional footer)."""
    pos = 0
    while bytes(data[pos:pos + 3]) == b"ID3" and pos + 10 <= len(data):
        s = data[pos + 6:pos + 10]
        footer = 10 if data[pos + 5] & 0x10 else 0
        pos += 10 + ((s[0] & 0x7F) << 21 | (s[1] & 0x7F) << 14 | (s[2] & 0x7F) << 7 | (s[3] & 0x7F)) + footer
    return pos


def _synced_frame_at(data: bytes | memoryview, pos: int) -> Mp3Frame | None:
    """A frame at ``pos`` that the next header confirms (or that ends the file exactly)."""
    frame = mp3_frame_at(data, pos)
    if frame is None:
        return None
    after = pos + frame.length_bytes
    if after == len(data) or mp3_frame_at(data, after) is not None:
        return frame
    return None


def _find_frame(data: bytes | memoryview, start: int) -> int | None:
    """The first confirmed frame header at or after ``start``, within the resync window."""
    window = bytes(data[start:start + _RESYNC_WINDOW_BYTES + 3])
    at = window.find(b"\xff")
    while 0 <= at < len(window) - 3:
        if _synced_frame_at(data, start + at) is not None:
            return start + at
        at = window.find(b"\xff", at + 1)
    return None


@dataclass(frozen=True)
class Mp3Layout:
    """An MPEG audio stream as its frame headers and its Xing/Info/VBRI tag describe it."""

    frames: int  # whole frames, the tag's frame included
    samples: int  # samples per channel in the whole frames (encoder delay and padding included)
    sample_rate: int
    stream_bytes: int  # from the first frame to the end of the last whole frame, gaps included
    cut_frame: tuple[int, int] | None  # the last frame's (bytes present, bytes it needs), if cut
    tag: str | None  # "Xing", "Info" or "VBRI"
    tag_frames: int | None  # audio frames the tag promises (Xing/Info: the tag's own frame not counted)
    tag_bytes: int | None  # bytes the tag promises, from the tag's frame on (Xing/Info)


def read_mp3_layout(data: bytes | memoryview) -> Mp3Layout | None:
    """Walk every frame header of an MPEG audio stream; None if no frame is found near the start."""
    first = _find_frame(data, id3v2_end(data))
    if first is None:
        return None
    tag, tag_frames, tag_bytes = _vbr_tag(data, first)
    pos, frames, samples, rate, cut = first, 0, 0, 0, None
    size = len(data)
    while True:
        frame = mp3_frame_at(data, pos)
        if frame is None and 0 < size - pos < 4 and data[pos] == 0xFF:
            cut = (size - pos, 4)  # the file ends inside the next frame's 4-byte header
            break
        if frame is None:
            nxt = _find_frame(data, pos)  # junk or a tag between frames, or the end
            if nxt is None:
                break
            pos, frame = nxt, mp3_frame_at(data, nxt)
            assert frame is not None
        if pos + frame.length_bytes > size:
            cut = (size - pos, frame.length_bytes)
            break
        frames += 1
        samples += frame.samples
        rate = frame.sample_rate
        pos += frame.length_bytes
    return Mp3Layout(frames, samples, rate, pos - first, cut, tag, tag_frames, tag_bytes)


def _vbr_tag(data: bytes | memoryview, first: int) -> tuple[str | None, int | None, int | None]:
    """The Xing/Info or VBRI tag in the first frame: (name, frames, bytes).

    Xing/Info sits after the side information (MPEG-1: 17 bytes mono, 32 otherwise; MPEG-2/2.5: 9
    and 17): flags, then frames if flag 1, bytes if flag 2. LAME writes the frames not counting the
    tag's own and "total audio stream size, including Xing/LAME Header" (libmp3lame/VbrTag.c,
    lame_get_lametag_frame); FFmpeg's mp3 muxer writes the same
    (tests/test_audio_upload.py, test_ffmpeg_writes_the_info_tag_as_lame_does). VBRI sits 32 bytes
    after the header: version, delay, quality, bytes, frames (only its frames are used).
    """
    frame = mp3_frame_at(data, first)
    if frame is None:
        return None, None, None
    side = (17 if frame.mono else 32) if frame.mpeg1 else (9 if frame.mono else 17)
    at = first + 4 + side
    name = bytes(data[at:at + 4])
    if name in (b"Xing", b"Info") and at + 8 <= len(data):
        (flags,) = struct.unpack_from(">I", data, at + 4)
        field, frames, size = at + 8, None, None
        if flags & 1 and field + 4 <= len(data):
            (frames,) = struct.unpack_from(">I", data, field)
            field += 4
        if flags & 2 and field + 4 <= len(data):
            (size,) = struct.unpack_from(">I", data, field)
        return name.decode(), frames, size
    at = first + 4 + 32
    if bytes(data[at:at + 4]) == b"VBRI" and at + 18 <= len(data):
        size, frames = struct.unpack_from(">II", data, at + 10)
        return "VBRI", frames, None
    return None, None, None


def mp3_truncation(layout: Mp3Layout) -> str | None:
    """Why an MPEG audio stream looks cut short, or None.

    Cut: the last frame's header needs more bytes than follow it, or the Xing/Info tag promises
    more bytes (from its frame on) than the whole frames hold, or more frames than were found. The
    frame count is given one frame of slack (an encoder that counts the tag's own frame); a stream
    without a tag that was cut exactly between frames cannot be told from a shorter file.
    """
    if layout.cut_frame is not None:
        present, needed = layout.cut_frame
        return f"its last MPEG audio frame is cut off ({present} of its {needed} bytes arrived)"
    if layout.tag_bytes is not None and layout.tag_bytes > layout.stream_bytes:
        return (f"its {layout.tag} header promises {layout.tag_bytes} bytes of audio frames "
                f"but only {layout.stream_bytes} arrived")
    if layout.tag_frames is not None and layout.tag_frames > layout.frames:
        return f"its {layout.tag} header promises {layout.tag_frames} audio frames but only {layout.frames} arrived"
    return None


# -- Ogg -------------------------------------------------------------------------------------------

_OGG_PAGE_HEADER_BYTES = 27
_OGG_FIRST_PAGE, _OGG_LAST_PAGE = 0x02, 0x04  # header_type flags: beginning / end of a logical stream


def is_ogg(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == b"OggS"


def ogg_truncation(data: bytes | memoryview) -> str | None:
    """Why an Ogg file looks cut short, or None.

    Ogg pages (RFC 3533, section 6): "OggS", version, header_type, granule position (8 bytes),
    serial number, sequence number, CRC (4 each), the segment count, the segment table, then the
    segments. Every logical stream opens with a page flagged first and closes with one flagged last
    (header_type 0x04), which an encoder writes when it finishes. Cut: a page runs past the end of
    the file, or a stream has no last page. libsndfile decodes a cut Ogg Vorbis file to its last
    whole page without an error (tests/test_audio_upload.py).
    """
    size, pos = len(data), 0
    open_streams: set[int] = set()
    while pos < size:
        if bytes(data[pos:pos + 4]) != b"OggS":
            return None  # not a page: leave it to the decoder
        if pos + _OGG_PAGE_HEADER_BYTES > size:
            return f"its last Ogg page header is cut off ({size - pos} of {_OGG_PAGE_HEADER_BYTES} bytes arrived)"
        flags = data[pos + 5]
        (serial,) = struct.unpack_from("<I", data, pos + 14)
        segments = data[pos + 26]
        table = pos + _OGG_PAGE_HEADER_BYTES
        if table + segments > size:
            return "its last Ogg page header is cut off"
        page_bytes = _OGG_PAGE_HEADER_BYTES + segments + sum(data[table:table + segments])
        if pos + page_bytes > size:
            return f"its last Ogg page is cut off ({size - pos} of its {page_bytes} bytes arrived)"
        if flags & _OGG_FIRST_PAGE:
            open_streams.add(serial)
        if flags & _OGG_LAST_PAGE:
            open_streams.discard(serial)
        pos += page_bytes
    if open_streams:
        return "its last Ogg page does not end the stream (the file stops before the encoder finished it)"
    return None
