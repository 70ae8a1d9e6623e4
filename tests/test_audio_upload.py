"""One upload's check (runtime/edgectl_runtime/service/audio_upload.py): each bad upload made here for
real (espeak-ng, sox, PyAV: tests/audio_clips.py) and refused with its status and a sentence that
says what was wrong; good audio at any rate and channel count accepted and described."""

from __future__ import annotations

from pathlib import Path

import pytest
from audio_clips import encode, sox, speech_wav, tone_wav, wav_header

from edgectl_runtime.service.audio_headers import id3v2_end, mp3_frame_at
from edgectl_runtime.service.audio_upload import AudioUpload, check_upload
from edgectl_runtime.service.guarded_request import Refusal

pytest.importorskip("av")
pytest.importorskip("soundfile")

LIMIT_S = 10.0
MAX_BYTES = 25_000_000


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("clips")


@pytest.fixture(scope="module")
def wav(clips) -> bytes:
    return speech_wav(clips).read_bytes()


@pytest.fixture(scope="module")
def mp3(clips) -> bytes:
    """With FFmpeg's Xing/Info tag, as LAME writes it (frame count and byte count)."""
    return encode(speech_wav(clips), "mp3", "libmp3lame")


@pytest.fixture(scope="module")
def bare_mp3(clips) -> bytes:
    """Frames only, no Xing/Info tag: nothing says how long the stream should be."""
    return encode(speech_wav(clips), "mp3", "libmp3lame", write_xing="0")


def check(data: bytes, name: str = "clip", **limits) -> AudioUpload | Refusal:
    return check_upload(data, name, max_audio_s=limits.get("max_audio_s", LIMIT_S),
                        max_upload_bytes=limits.get("max_upload_bytes", MAX_BYTES))


def refused(data: bytes, status: int, reason: str, *words: str, **limits) -> Refusal:
    got = check(data, **limits)
    assert isinstance(got, Refusal), got
    assert (got.status, got.reason) == (status, reason), got
    for word in words:
        assert word in got.message, got.message
    assert got.message.count(". ") == 0 and "clip" in got.message  # one sentence, naming the file
    return got


def frame_ends(mp3: bytes) -> list[int]:
    """Where each MPEG frame of ``mp3`` ends."""
    pos, ends = id3v2_end(mp3), []
    while pos < len(mp3):
        frame = mp3_frame_at(mp3, pos)
        assert frame is not None
        pos += frame.length_bytes
        ends.append(pos)
    return ends


# -- accepted --------------------------------------------------------------------------------------

def test_speech_as_wav_flac_ogg_mp3_and_m4a_is_accepted_and_described(clips, wav, mp3):
    source = speech_wav(clips)
    for data, container, codec in [
        (wav, "WAV", "PCM_16"),
        (sox(source, clips / "s.flac").read_bytes(), "FLAC", "PCM_16"),
        (sox(source, clips / "s.ogg").read_bytes(), "OGG", "VORBIS"),
        (mp3, "mp3", "mp3float"),
        (encode(source, "ipod", "aac"), "mov,mp4,m4a,3gp,3g2,mj2", "aac"),
    ]:
        got = check(data)
        assert isinstance(got, AudioUpload), got
        assert (got.container, got.codec, got.sample_rate, got.channels) == (container, codec, 22050, 1)
        assert got.seconds == pytest.approx(2.78, abs=0.1)  # espeak-ng's sentence; the M4A's priming


def test_8_khz_48_khz_and_stereo_are_accepted_with_their_rate_and_channels(clips):
    source = speech_wav(clips)
    for effects, rate, channels in [(("rate", "8000"), 8000, 1), (("rate", "48000"), 48000, 1),
                                    (("channels", "2"), 22050, 2), (("rate", "48000", "channels", "2"), 48000, 2)]:
        path = sox(source, clips / f"{rate}-{channels}.wav", *effects)
        got = check(path.read_bytes())
        assert isinstance(got, AudioUpload), got
        assert (got.sample_rate, got.channels) == (rate, channels)
        assert got.seconds == pytest.approx(2.78, abs=0.05)
        got = check(encode(path, "mp3", "libmp3lame"))
        assert isinstance(got, AudioUpload) and (got.sample_rate, got.channels) == (rate, channels), got


def test_a_memoryview_is_read_in_place(wav):
    got = check_upload(memoryview(b"--" + wav + b"--")[2:-2], max_audio_s=LIMIT_S, max_upload_bytes=MAX_BYTES)
    assert isinstance(got, AudioUpload)


# -- refused ---------------------------------------------------------------------------------------

def test_an_empty_upload():
    refused(b"", 400, "empty", "empty")


def test_text_is_not_audio():
    refused(b"this is a text file, not a recording\n" * 40, 400, "not_audio", "not audio", "send WAV")


def test_a_wav_cut_in_its_data(wav):
    got = refused(wav[: len(wav) // 2], 400, "truncated", "truncated WAV", "promises 2.78 s", "upload the whole file")
    assert "1.39 s" in got.message


def test_a_wav_cut_in_its_header(wav):
    for cut in (8, 20, 30, 40, 44):
        refused(wav[:cut], 400, "truncated", "truncated WAV")


def test_a_header_promising_two_hours_with_a_second_of_data_is_a_truncation():
    data = wav_header(8000, 1, 8, 8000 * 7200) + b"\x80" * 8000
    refused(data, 400, "truncated", "promises 7200.00 s", "only 1.00 s")


def test_an_mp3_cut_mid_frame_with_or_without_its_tag(mp3, bare_mp3):
    for data in (mp3, bare_mp3):
        ends = frame_ends(data)
        for end in (ends[len(ends) // 2], ends[-1]):
            for inside in (1, 3, 50):  # in the next header, or in the frame's body
                refused(data[: end - inside] if end == ends[-1] else data[: end + inside], 400, "truncated",
                        "truncated MP3", "frame is cut off")


def test_an_mp3_cut_between_frames_is_caught_by_its_info_tag(mp3):
    ends = frame_ends(mp3)
    for end in (ends[1], ends[len(ends) // 2], ends[-2]):
        refused(mp3[:end], 400, "truncated", "Info header promises")


def test_pyav_alone_does_not_see_the_cut(mp3):
    """Why the headers are read: FFmpeg decodes a cut MP3 to its end without an error."""
    import io

    import av

    for cut in (mp3[:-1], mp3[: len(mp3) // 2], mp3[: frame_ends(mp3)[-2]]):
        with av.open(io.BytesIO(cut)) as container:
            decoded = sum(f.samples for p in container.demux(container.streams.audio[0]) for f in p.decode())
        assert decoded > 0


def test_an_ogg_cut_short(clips):
    ogg = sox(speech_wav(clips), clips / "cut.ogg").read_bytes()
    refused(ogg[: len(ogg) // 2], 400, "truncated", "truncated Ogg file", "page is cut off")
    pages = [i for i in range(len(ogg)) if ogg.startswith(b"OggS", i)]
    refused(ogg[: pages[-1]], 400, "truncated", "does not end the stream")  # cut between pages


def test_a_flac_or_m4a_cut_short(clips):
    source = speech_wav(clips)
    flac = sox(source, clips / "cut.flac").read_bytes()
    refused(flac[: len(flac) // 2], 400, "damaged", "truncated or damaged")
    m4a = encode(source, "ipod", "aac")  # its index (moov) is written last: half a file does not open
    refused(m4a[: len(m4a) // 2], 400, "not_audio", "not audio")


def test_longer_than_the_plan_allows_is_413_naming_the_limit(clips):
    tone = tone_wav(clips / "12s.wav", 12)
    refused(tone.read_bytes(), 413, "too_long", "10 s", "12.0 s")
    refused(encode(tone, "mp3", "libmp3lame"), 413, "too_long", "more than 10 s")
    refused(sox(tone, clips / "12s.flac").read_bytes(), 413, "too_long", "more than 10 s")
    assert isinstance(check(tone.read_bytes(), max_audio_s=12.5), AudioUpload)


def test_bigger_than_the_plan_allows_is_413(wav):
    refused(wav, 413, "too_big", "over this server's limit of 0.1 MB", max_upload_bytes=100_000)


def test_what_cannot_be_seen_a_tagless_mp3_cut_between_frames_is_a_shorter_mp3(bare_mp3):
    """Without a Xing/Info tag nothing states the stream's length: a cut between frames leaves a
    valid, shorter MP3 (stated so the limit of the check is known)."""
    ends = frame_ends(bare_mp3)
    got = check(bare_mp3[: ends[len(ends) // 2]])
    assert isinstance(got, AudioUpload) and got.seconds < 2.0


def test_a_wav_streamed_to_a_pipe_has_no_sizes_and_is_read_to_its_end(wav):
    """FFmpeg and libsndfile writing to a pipe leave the RIFF and data sizes at 0xFFFFFFFF."""
    data_at = wav.index(b"data")
    streamed = (wav[:4] + b"\xff\xff\xff\xff" + wav[8:data_at + 4] + b"\xff\xff\xff\xff" + wav[data_at + 8:])
    got = check(streamed)
    assert isinstance(got, AudioUpload) and got.seconds == pytest.approx(2.78, abs=0.05)


def test_an_mp3_with_junk_between_its_frames_is_damaged(mp3):
    """FFmpeg stops at the junk with an error; vLLM's PyAV loader refuses such a file too
    (vllm/multimodal/media/audio.py, load_audio_pyav: an FFmpegError while decoding is a ValueError)."""
    end = frame_ends(mp3)[50]
    refused(mp3[:end] + b"\0" * 37 + b"junk" + mp3[end:], 400, "damaged", "stops decoding after 1.3 s")


def test_ffmpeg_writes_the_info_tag_as_lame_does(mp3):
    """The rule's premise (audio_headers._vbr_tag): the tag's frames do not count its own frame, its
    bytes run from its own frame to the end."""
    from edgectl_runtime.service.audio_headers import read_mp3_layout

    layout = read_mp3_layout(mp3)
    assert layout is not None and layout.tag == "Info"
    assert layout.tag_frames == layout.frames - 1 and layout.tag_bytes == len(mp3) - id3v2_end(mp3)
