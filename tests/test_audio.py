"""Tests for oasr.audio: real speech from the shared set, every supported format, bad inputs."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from oasr.audio import SAMPLE_RATE, audio_duration, load_audio
from oasr.errors import AudioDecodeError
from speech_data import speech_data_dir

TONE_HZ = 440.0
TONE_SECONDS = 1.5
TONE_AMPLITUDE = 0.5


# --------------------------------------------------------------------------- helpers


def speech_manifest_params() -> list:
    """One pytest param per manifest entry, or a single skipped param when the data is absent."""
    manifest = speech_data_dir() / "manifest.jsonl"
    if not manifest.is_file():
        return [
            pytest.param(
                None,
                id="no-speech-data",
                marks=pytest.mark.skip(reason=f"shared speech data not found at {manifest} (set OASR_SPEECH_DATA)"),
            )
        ]
    with manifest.open(encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.strip()]
    return [pytest.param(entry, id=entry["id"]) for entry in entries]


def tone(sample_rate: int, seconds: float = TONE_SECONDS, hz: float = TONE_HZ) -> np.ndarray:
    """A float32 sine of `hz` at TONE_AMPLITUDE."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    return (TONE_AMPLITUDE * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def stereo_tone(sample_rate: int) -> np.ndarray:
    """(frames, 2): the same tone on both channels."""
    x = tone(sample_rate)
    return np.stack([x, x], axis=1)


def dominant_frequency(samples: np.ndarray, sample_rate: int) -> float:
    """Frequency of the FFT peak, ignoring the first and last 10% (codec priming and padding)."""
    cut = len(samples) // 10
    seg = samples[cut : len(samples) - cut].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(seg * np.hanning(len(seg))))
    return float(np.fft.rfftfreq(len(seg), 1.0 / sample_rate)[np.argmax(spectrum)])


def assert_mono_16k(x: np.ndarray) -> None:
    assert isinstance(x, np.ndarray)
    assert x.ndim == 1
    assert x.dtype == np.float32
    assert x.flags["C_CONTIGUOUS"]
    assert np.isfinite(x).all()


def write_with_soundfile(path: Path, frames: np.ndarray, rate: int, fmt: str, subtype: str) -> None:
    if not sf.check_format(fmt, subtype):
        pytest.skip(f"libsndfile cannot write {fmt}/{subtype}")
    sf.write(str(path), frames, rate, format=fmt, subtype=subtype)


def write_with_pyav(
    path: Path,
    frames: np.ndarray,
    rate: int,
    container: str,
    codec: str,
    codec_rate: int | None = None,
    options: dict[str, str] | None = None,
) -> None:
    """Encode (frames, channels) float32 with FFmpeg; skips when the encoder is not built in."""
    try:
        av.codec.Codec(codec, "w")
    except Exception as exc:  # UnknownCodecError and friends: an environment limit, not a bug
        pytest.skip(f"PyAV has no {codec!r} encoder: {exc}")
    layout = "stereo" if frames.shape[1] == 2 else "mono"
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=codec_rate or rate, layout=layout)
        if options:
            stream.codec_context.options = options
        planar = np.ascontiguousarray(frames.T, dtype=np.float32)
        # Feed codec-sized chunks with timestamps, as a real encoder loop does: one huge
        # frame makes FFmpeg's Ogg muxer write a wrong final granule position, and
        # libsndfile (rightly, per the Ogg spec) then trims the stream to 0.1 s.
        for start in range(0, planar.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(planar[:, start : start + 1024]), format="fltp", layout=layout
            )
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


Writer = Callable[[Path, np.ndarray, int], None]

# name -> (file suffix, writer). Writers receive (path, (frames, channels) float32, rate).
FORMATS: dict[str, tuple[str, Writer]] = {
    "sf-wav-pcm16": (".wav", lambda p, x, r: write_with_soundfile(p, x, r, "WAV", "PCM_16")),
    "sf-wav-pcm24": (".wav", lambda p, x, r: write_with_soundfile(p, x, r, "WAV", "PCM_24")),
    "sf-wav-float": (".wav", lambda p, x, r: write_with_soundfile(p, x, r, "WAV", "FLOAT")),
    "sf-flac": (".flac", lambda p, x, r: write_with_soundfile(p, x, r, "FLAC", "PCM_16")),
    "sf-ogg-vorbis": (".ogg", lambda p, x, r: write_with_soundfile(p, x, r, "OGG", "VORBIS")),
    "sf-mp3": (".mp3", lambda p, x, r: write_with_soundfile(p, x, r, "MP3", "MPEG_LAYER_III")),
    "av-wav-pcm16": (".wav", lambda p, x, r: write_with_pyav(p, x, r, "wav", "pcm_s16le")),
    "av-flac": (".flac", lambda p, x, r: write_with_pyav(p, x, r, "flac", "flac")),
    "av-mp3": (".mp3", lambda p, x, r: write_with_pyav(p, x, r, "mp3", "libmp3lame")),
    "av-ogg-vorbis": (
        ".ogg",
        lambda p, x, r: write_with_pyav(p, x, r, "ogg", "vorbis", options={"strict": "experimental"}),
    ),
    "av-ogg-opus": (".opus", lambda p, x, r: write_with_pyav(p, x, r, "ogg", "libopus", codec_rate=48_000)),
    "av-m4a-aac": (".m4a", lambda p, x, r: write_with_pyav(p, x, r, "ipod", "aac")),
    "av-webm-opus": (".webm", lambda p, x, r: write_with_pyav(p, x, r, "webm", "libopus", codec_rate=48_000)),
}


def encode(tmp_path: Path, fmt: str, frames: np.ndarray, rate: int, stem: str = "tone") -> Path:
    suffix, writer = FORMATS[fmt]
    path = tmp_path / f"{stem}-{fmt}{suffix}"
    writer(path, frames, rate)
    return path


def decode_error(source: object, **kwargs: object) -> AudioDecodeError:
    """Load `source`, assert it raises exactly AudioDecodeError, and return the error."""
    with pytest.raises(AudioDecodeError) as info:
        load_audio(source, **kwargs)  # type: ignore[arg-type]
    assert type(info.value) is AudioDecodeError
    assert info.value.reason, "the reason must say what went wrong"
    return info.value


# --------------------------------------------------------------------------- 1. shared real speech


@pytest.mark.parametrize("entry", speech_manifest_params())
def test_manifest_entry_decodes(entry: dict) -> None:
    path = speech_data_dir() / entry["audio"]
    x = load_audio(path, channel=entry.get("channel"))
    assert_mono_16k(x)
    assert np.abs(x).max() > 1e-3, "decoded speech is silent"
    assert np.abs(x).max() <= 1.0 + 1e-3
    assert audio_duration(x) == pytest.approx(entry["duration_s"], abs=0.06)


# --------------------------------------------------------------------------- 2. format coverage


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_format_decodes_to_16k_mono_tone(tmp_path: Path, fmt: str) -> None:
    path = encode(tmp_path, fmt, stereo_tone(44_100), 44_100)
    x = load_audio(path)
    assert_mono_16k(x)
    assert audio_duration(x) == pytest.approx(TONE_SECONDS, abs=0.1)
    assert dominant_frequency(x, SAMPLE_RATE) == pytest.approx(TONE_HZ, abs=5.0)
    # Identical channels average to the tone itself, not to a sum.
    assert 0.8 * TONE_AMPLITUDE < np.abs(x).max() < 1.3 * TONE_AMPLITUDE


# --------------------------------------------------------------------------- 3. rates and channels


@pytest.mark.parametrize("rate", [8_000, 16_000, 22_050, 44_100, 48_000])
def test_input_rates_resample_to_16k(tmp_path: Path, rate: int) -> None:
    source = tone(rate)
    path = tmp_path / f"tone-{rate}.wav"
    sf.write(str(path), source, rate, subtype="PCM_16")
    x = load_audio(path)
    assert_mono_16k(x)
    expected = len(source) * SAMPLE_RATE / rate
    assert abs(len(x) - expected) <= 1
    assert dominant_frequency(x, SAMPLE_RATE) == pytest.approx(TONE_HZ, abs=5.0)


def test_custom_output_rate(tmp_path: Path) -> None:
    path = tmp_path / "tone.wav"
    sf.write(str(path), tone(16_000), 16_000, subtype="FLOAT")
    x = load_audio(path, sample_rate=24_000)
    assert len(x) == int(TONE_SECONDS * 24_000)
    assert audio_duration(x, 24_000) == pytest.approx(TONE_SECONDS)
    assert dominant_frequency(x, 24_000) == pytest.approx(TONE_HZ, abs=5.0)


def left_tone_right_silence(rate: int) -> np.ndarray:
    left = tone(rate)
    return np.stack([left, np.zeros_like(left)], axis=1)


# One format per decoder path: soundfile reads the WAV, FFmpeg the M4A and WebM.
@pytest.mark.parametrize("fmt", ["sf-wav-pcm16", "av-m4a-aac", "av-webm-opus"])
def test_channel_selection(tmp_path: Path, fmt: str) -> None:
    path = encode(tmp_path, fmt, left_tone_right_silence(44_100), 44_100, stem="lr")
    left = load_audio(path, channel=0)
    right = load_audio(path, channel=1)
    mixed = load_audio(path)
    for x in (left, right, mixed):
        assert_mono_16k(x)
        assert len(x) == len(left)
    assert dominant_frequency(left, SAMPLE_RATE) == pytest.approx(TONE_HZ, abs=5.0)
    assert np.abs(left).max() > 0.8 * TONE_AMPLITUDE
    assert np.sqrt(np.mean(right**2)) < 1e-3, "the silent right channel came back with signal"
    # The mix averages the channels: half the tone.
    np.testing.assert_allclose(mixed, (left + right) / 2, atol=1e-4)


def test_channel_out_of_range(tmp_path: Path) -> None:
    stereo = tmp_path / "stereo.wav"
    sf.write(str(stereo), left_tone_right_silence(16_000), 16_000)
    err = decode_error(stereo, channel=2)
    assert str(stereo) in str(err)
    assert "channel 2" in err.reason and "2 channel" in err.reason
    decode_error(stereo, channel=-1)

    mono = tmp_path / "mono.wav"
    sf.write(str(mono), tone(16_000), 16_000)
    assert len(load_audio(mono, channel=0)) == int(TONE_SECONDS * SAMPLE_RATE)
    decode_error(mono, channel=1)


# --------------------------------------------------------------------------- 4. bad inputs


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "does-not-exist.wav"
    err = decode_error(path)
    assert str(path) in str(err)
    assert err.source == str(path)
    assert err.reason == "file not found"


def test_directory_is_not_audio(tmp_path: Path) -> None:
    err = decode_error(tmp_path)
    assert str(tmp_path) in str(err)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    err = decode_error(path)
    assert str(path) in str(err)
    assert err.reason == "file is empty"


def test_wav_with_zero_frames(tmp_path: Path) -> None:
    path = tmp_path / "zero-frames.wav"
    sf.write(str(path), np.zeros((0, 1), dtype=np.float32), 16_000, subtype="PCM_16")
    assert path.stat().st_size > 0, "the header must be there"
    err = decode_error(path)
    assert str(path) in str(err)
    assert err.reason == "decoded zero samples"


@pytest.mark.parametrize(
    ("fmt", "keep"),
    [("sf-wav-pcm16", 20), ("sf-flac", 100), ("av-mp3", 100), ("av-m4a-aac", 100), ("av-ogg-opus", 100)],
)
def test_truncated_file(tmp_path: Path, fmt: str, keep: int) -> None:
    whole = encode(tmp_path, fmt, stereo_tone(44_100), 44_100)
    cut = tmp_path / f"cut-{whole.name}"
    cut.write_bytes(whole.read_bytes()[:keep])
    err = decode_error(cut)
    assert str(cut) in str(err)


def test_text_file_named_wav(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("These are meeting notes, not a recording.\n" * 20, encoding="utf-8")
    err = decode_error(path)
    assert str(path) in str(err)
    assert err.reason.startswith("could not decode")
    assert "<none>" not in err.reason and "Errno" not in err.reason


def test_container_without_audio_stream(tmp_path: Path) -> None:
    try:
        av.codec.Codec("mpeg4", "w")
    except Exception as exc:
        pytest.skip(f"PyAV has no mpeg4 video encoder: {exc}")
    path = tmp_path / "video-only.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(5):
            image = np.full((48, 64, 3), i * 40, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    err = decode_error(path)
    assert str(path) in str(err)
    assert err.reason == "no audio stream found"


def test_garbage_bytes() -> None:
    garbage = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    err = decode_error(garbage)
    assert err.source == "<bytes>"
    assert "<bytes>" in str(err)
    err = decode_error(garbage, name="upload.wav")
    assert "upload.wav" in str(err)
    err = decode_error(io.BytesIO(garbage), name="stream-17")
    assert "stream-17" in str(err)


def test_empty_bytes() -> None:
    err = decode_error(b"")
    assert "<bytes>" in str(err)
    decode_error(io.BytesIO(b""))


def test_name_overrides_path_in_errors(tmp_path: Path) -> None:
    err = decode_error(tmp_path / "missing.flac", name="meeting.flac")
    assert err.source == "meeting.flac"


def test_text_file_object_is_a_caller_error(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_text("abc", encoding="utf-8")
    with path.open("r", encoding="utf-8") as f, pytest.raises(TypeError):
        load_audio(f)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- 5. bytes and file objects


@pytest.mark.parametrize("fmt", ["sf-wav-pcm24", "sf-flac", "av-mp3", "av-m4a-aac", "av-webm-opus"])
def test_bytes_and_file_object_match_path(tmp_path: Path, fmt: str) -> None:
    path = encode(tmp_path, fmt, stereo_tone(44_100), 44_100)
    from_path = load_audio(path)
    data = path.read_bytes()
    from_bytes = load_audio(data)
    from_bytearray = load_audio(bytearray(data))
    from_buffer = load_audio(io.BytesIO(data))
    with path.open("rb") as f:
        from_file = load_audio(f)
    for other in (from_bytes, from_bytearray, from_buffer, from_file):
        assert_mono_16k(other)
        np.testing.assert_array_equal(other, from_path)


def test_pathlike_and_str_paths_match(tmp_path: Path) -> None:
    path = tmp_path / "tone.flac"
    sf.write(str(path), stereo_tone(22_050), 22_050, format="FLAC")
    np.testing.assert_array_equal(load_audio(path), load_audio(str(path)))


def test_audio_duration() -> None:
    assert audio_duration(np.zeros(16_000, dtype=np.float32)) == 1.0
    assert audio_duration(np.zeros(12_000, dtype=np.float32), 24_000) == 0.5
    assert audio_duration(np.zeros(0, dtype=np.float32)) == 0.0
