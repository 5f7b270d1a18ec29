"""Hostile uploads: headers that lie about their rate, length or channels must cost no more memory than the limit.

Each file is built here, small, the way an attacker would: a WAV whose header claims 1 Hz, a FLAC that declares
hours, a FLAC that declares no length at all, an ADTS AAC stream of hours of silence in a few MB. Peak memory is
what numpy allocates while decoding, measured with ``tracemalloc``.
"""

from __future__ import annotations

import io
import struct
import tracemalloc
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import soundfile as sf

import oasr
from oasr.audio import SAMPLE_RATE, load_audio
from oasr.audio.bounded import MAX_CHANNELS, MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, MonoCollector
from oasr.errors import AudioDecodeError, AudioTooLongError
from oasr.serving.app import build_app
from oasr.serving.settings import ServerSettings
from serving_harness import WAIT_S, running_server, small_engine

LIMIT_S = 60.0
MIB = 1 << 20
JFK = Path(oasr.__file__).parent / "assets" / "jfk.flac"


# --------------------------------------------------------------------------- hostile files


def wav(samples: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def flac_silence(seconds: float, rate: int, channels: int) -> bytes:
    """Silence compresses to a few bytes per FLAC frame: hours fit in a few hundred KB."""
    out = io.BytesIO()
    minute = np.zeros((60 * rate, channels), dtype=np.int16)
    with sf.SoundFile(out, "w", rate, channels, format="FLAC", subtype="PCM_16") as f:
        for _ in range(int(seconds // 60)):
            f.write(minute)
        f.write(minute[: int(seconds % 60 * rate)])
    return out.getvalue()


def flac_declaring(data: bytes, num_frames: int) -> bytes:
    """``data`` (a FLAC file) with STREAMINFO's total sample count set to ``num_frames`` (0: unknown) and its MD5
    cleared (0: not given), as a hostile encoder may write them."""
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0, "STREAMINFO must be the first metadata block"
    out = bytearray(data)
    # STREAMINFO's bytes 10-17 (file bytes 18-25): rate (20 bits), channels, bits per sample, total (36 bits).
    fields = int.from_bytes(out[18:26], "big") & ~((1 << 36) - 1)
    out[18:26] = (fields | num_frames).to_bytes(8, "big")
    out[26:42] = bytes(16)
    return bytes(out)


def wav_with_data_size(data: bytes, num_bytes: int) -> bytes:
    """``data`` (a WAV file) whose data chunk claims ``num_bytes``."""
    out = bytearray(data)
    struct.pack_into("<I", out, out.find(b"data") + 4, num_bytes)
    return bytes(out)


def aac_silence(container_format: str, seconds: int) -> bytes:
    """48 kHz stereo AAC silence, encoded by FFmpeg into ``container_format``."""
    out = io.BytesIO()
    with av.open(out, "w", format=container_format) as container:
        stream = container.add_stream("aac", rate=48_000, layout="stereo")
        for start in range(0, seconds * 48_000, 1024):
            frame = av.AudioFrame.from_ndarray(np.zeros((2, 1024), dtype=np.float32), format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = 48_000, start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def adts_silence(seconds: int) -> bytes:
    """One second of AAC silence in ADTS frames, repeated: every frame carries its own header, so the repeats
    are one valid stream that FFmpeg estimates the length of from its size and bitrate."""
    return aac_silence("adts", 1) * seconds


def m4a_declaring(data: bytes, seconds: float) -> bytes:
    """``data`` (an MP4 file) with its movie and media headers saying ``seconds``; the packets stay as they are."""
    out = bytearray(data)
    for box in (b"mvhd", b"mdhd"):
        at = out.find(box)
        assert out[at + 4] == 0, "a version 0 header (32-bit times)"
        timescale = struct.unpack_from(">I", out, at + 16)[0]
        struct.pack_into(">I", out, at + 20, int(seconds * timescale))
    return bytes(out)


def refusal(data: bytes, **kwargs) -> tuple[AudioDecodeError, int]:
    """Decode ``data`` expecting a refusal; returns the error and the peak bytes numpy allocated meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(AudioDecodeError) as info:
            load_audio(data, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return info.value, peak


@pytest.fixture(scope="module")
def long_flac_of_unknown_length() -> bytes:
    """Ten minutes of 48 kHz stereo silence, 230 MB once decoded, in a FLAC that declares no length."""
    return flac_declaring(flac_silence(600, 48_000, 2), 0)


# --------------------------------------------------------------------------- refused from the header


@pytest.mark.parametrize("limit", [LIMIT_S, None])
def test_wav_claiming_1_hz_is_refused_before_it_is_upsampled(limit):
    hostile = wav(np.zeros(50_000, dtype=np.float32), rate=1)  # 100 KB: 14 h at 1 Hz, 3.2 GB at 16 kHz
    error, peak = refusal(hostile, max_seconds=limit)
    assert type(error) is AudioDecodeError
    assert "1 Hz" in error.reason and f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz" in error.reason
    assert peak < 1 * MIB


@pytest.mark.parametrize(("rate", "num_channels", "says"), [
    (MIN_SAMPLE_RATE - 1, 1, f"{MIN_SAMPLE_RATE - 1} Hz"),
    (MAX_SAMPLE_RATE + 1, 1, f"{MAX_SAMPLE_RATE + 1} Hz"),
    (16_000, MAX_CHANNELS + 1, f"{MAX_CHANNELS + 1} channels"),
])
def test_rates_and_channel_counts_no_recording_has_are_refused(rate, num_channels, says):
    error, _ = refusal(wav(np.zeros((100, num_channels), dtype=np.float32), rate))
    assert type(error) is AudioDecodeError and says in error.reason


@pytest.mark.parametrize(("rate", "num_channels"), [(MIN_SAMPLE_RATE, 1), (MAX_SAMPLE_RATE, 1), (16_000, MAX_CHANNELS)])
def test_the_extreme_rates_and_channel_counts_still_decode(rate, num_channels):
    samples = load_audio(wav(np.zeros((rate // 10, num_channels), dtype=np.float32), rate))
    assert samples.shape == (SAMPLE_RATE // 10,)


@pytest.mark.parametrize("case", ["flac, 2 h of 8 kHz silence", "flac, short body declaring 2 h", "adts aac, 2 h"])
def test_input_declaring_more_than_the_limit_is_refused_unread(case):
    hostile = {
        "flac, 2 h of 8 kHz silence": lambda: flac_silence(7200, 8_000, 1),
        "flac, short body declaring 2 h": lambda: flac_declaring(flac_silence(1, 48_000, 2), 7200 * 48_000),
        "adts aac, 2 h": lambda: adts_silence(7200),  # 4.6 MB; FFmpeg's estimate is all it has
    }[case]()
    assert len(hostile) < 5 * MIB
    error, peak = refusal(hostile, max_seconds=LIMIT_S)
    assert isinstance(error, AudioTooLongError) and error.max_seconds == LIMIT_S
    assert "declares 7" in error.length and "over the limit of 60 s" in str(error)
    assert peak < 1 * MIB, "the refusal came after decoding"


# --------------------------------------------------------------------------- stopped while decoding


def test_flac_of_unknown_length_stops_decoding_soon_after_the_limit(long_flac_of_unknown_length):
    error, peak = refusal(long_flac_of_unknown_length, max_seconds=LIMIT_S)
    assert isinstance(error, AudioTooLongError) and "runs past" in error.length
    # Decoded whole it is 230 MB at 48 kHz stereo and 38 MB at 16 kHz mono; 64 s at 16 kHz is 4 MB.
    assert peak < 16 * MIB


@pytest.mark.parametrize("limit", [LIMIT_S, 3600.0])
def test_flac_of_unknown_length_is_decoded_no_further_than_the_limit(monkeypatch, limit):
    """The limit, not the margin the header checks allow (5 %: 3,781 s of a 3,600 s limit), nor a whole block
    (a minute of 16 kHz mono) past it, is what a stream without a declared length gets decoded to."""
    decoded_s: list[float] = []
    add = MonoCollector.add

    def counted_add(self, block):
        try:
            add(self, block)
        finally:
            decoded_s.append(self.num_frames / self.sample_rate)

    monkeypatch.setattr(MonoCollector, "add", counted_add)
    hostile = flac_declaring(flac_silence(limit + 120, 16_000, 1), 0)
    error, _ = refusal(hostile, max_seconds=limit)
    assert isinstance(error, AudioTooLongError) and error.length == f"the audio runs past {limit:.1f} s"
    assert limit < max(decoded_s) <= limit + 0.001


def test_m4a_whose_headers_say_1_s_stops_decoding_soon_after_the_limit():
    lying = m4a_declaring(aac_silence("ipod", 20), 1.0)
    error, _ = refusal(lying, max_seconds=5.0)
    assert isinstance(error, AudioTooLongError) and error.length == "the audio runs past 5.0 s"
    assert load_audio(lying, max_seconds=30.0).shape[0] >= 20 * SAMPLE_RATE  # the packets, not the header, count


def test_flac_of_unknown_length_within_the_limit_decodes_whole():
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(5 * 48_000) / 48_000)).astype(np.float32)
    honest = io.BytesIO()
    sf.write(honest, np.stack([tone, -tone], axis=1), 48_000, format="FLAC", subtype="PCM_16")
    expected = load_audio(honest.getvalue(), channel=0)
    decoded = load_audio(flac_declaring(honest.getvalue(), 0), channel=0, max_seconds=LIMIT_S)
    assert decoded.shape == expected.shape == (5 * SAMPLE_RATE,)
    np.testing.assert_allclose(decoded, expected, atol=1e-6)


def test_wav_whose_data_chunk_claims_gigabytes_decodes_only_its_body():
    body = (0.1 * np.sin(np.arange(5 * 16_000) / 7)).astype(np.float32)
    honest = wav(body, 16_000)
    lying = wav_with_data_size(honest, 0x7FFF_FFF0)
    tracemalloc.start()
    try:
        decoded = load_audio(lying, max_seconds=LIMIT_S)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(decoded, load_audio(honest))
    assert peak < 2 * MIB
    error, _ = refusal(lying, max_seconds=2.0)
    assert isinstance(error, AudioTooLongError)


def test_long_honest_input_is_decoded_holding_about_one_copy_of_its_output():
    ten_minutes = flac_silence(600, 48_000, 2)  # 230 MB at 48 kHz stereo; 38 MB at 16 kHz mono
    tracemalloc.start()
    try:
        decoded = load_audio(ten_minutes, max_seconds=3600.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoded.shape == (600 * SAMPLE_RATE,)
    # The output plus a few blocks: neither the whole stream at its own rate nor the output twice (a concatenation).
    assert peak < decoded.nbytes + 16 * MIB


# --------------------------------------------------------------------------- the limit itself


def test_limit_is_exact_on_the_decoded_audio():
    ten_seconds = wav(np.zeros(10 * 8_000, dtype=np.float32), 8_000)
    assert load_audio(ten_seconds, max_seconds=10.0).shape == (10 * SAMPLE_RATE,)
    error, _ = refusal(ten_seconds, max_seconds=9.9)  # within the header checks' margin: stopped while decoding
    assert isinstance(error, AudioTooLongError)
    assert error.length == "the audio runs past 9.9 s" and str(error).endswith("over the limit of 9.9 s")


def test_infinite_limit_is_no_limit():
    np.testing.assert_array_equal(load_audio(JFK, max_seconds=float("inf")), load_audio(JFK))


@pytest.mark.parametrize("limit", [0, -1.0, float("nan")])
def test_limit_must_be_positive(limit):
    with pytest.raises(ValueError, match="max_seconds"):
        load_audio(JFK, max_seconds=limit)


# --------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server() -> str:
    engine = small_engine("tiny.en")
    try:
        settings = ServerSettings(served_model_name="tiny.en", max_audio_seconds=LIMIT_S)
        with running_server(build_app(engine, settings)) as url:
            yield url
    finally:
        engine.shutdown()


def upload(url: str, name: str, data: bytes) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/transcriptions", files={"file": (name, data)}, data={"model": "tiny.en"},
                      timeout=WAIT_S)


def test_server_refuses_lying_headers_with_400_naming_the_limit(server, long_flac_of_unknown_length):
    declared = upload(server, "declares.flac", flac_declaring(flac_silence(1, 48_000, 2), 7200 * 48_000))
    unknown = upload(server, "unknown.flac", long_flac_of_unknown_length)
    one_hz = upload(server, "slow.wav", wav(np.zeros(50_000, dtype=np.float32), rate=1))
    for response in (declared, unknown):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "audio_too_long" and error["param"] == "file"
        assert "this server accepts at most 60 s" in error["message"]
    assert "declares.flac: the file declares 7200.0 s of audio" in declared.json()["error"]["message"]
    assert one_hz.status_code == 400 and one_hz.json()["error"]["code"] == "invalid_audio"
    assert "1 Hz" in one_hz.json()["error"]["message"]
    answer = upload(server, JFK.name, JFK.read_bytes())  # and ordinary audio under the limit is transcribed
    assert answer.status_code == 200 and "country" in answer.json()["text"]
