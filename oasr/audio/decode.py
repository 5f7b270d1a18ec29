"""Decode any audio input into 16 kHz mono float32 samples.

Two well-kept decoders do the work: libsndfile (through ``soundfile``) first,
because it is exact and fast for WAV/FLAC/Ogg and reports the sample counts
that reference data was measured with; FFmpeg (through PyAV) second, because it
reads almost every other container and codec (MP4/AAC, WebM, Opus, ...). Both
paths return all channels at the stream's native rate; channel mixing or
selection and the one resampling step (soxr) happen afterwards, so every format
goes through the same code from there on.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import BinaryIO, Union

import av
import av.error
import numpy as np
import soundfile as sf
import soxr

from oasr.errors import AudioDecodeError

SAMPLE_RATE = 16_000
"""The rate every model in OASR consumes, in Hz."""

AudioSource = Union[str, os.PathLike[str], bytes, bytearray, memoryview, BinaryIO]
"""What :func:`load_audio` accepts: a path, raw file bytes, or a binary file object."""

_BYTES_NAME = "<bytes>"

# What each library raises for input it cannot read. Anything else is a bug and
# should surface as such rather than be reported as a bad file.
_SOUNDFILE_ERRORS: tuple[type[BaseException], ...] = (sf.SoundFileError, RuntimeError)
_PYAV_ERRORS: tuple[type[BaseException], ...] = (av.error.FFmpegError, ValueError)


@dataclass(frozen=True)
class _Input:
    """One input, readable any number of times, so the fallback decoder starts clean."""

    name: str
    path: str | None = None
    data: bytes | None = None

    def open(self) -> str | io.BytesIO:
        """A fresh handle for a decoder: the path itself, or a new in-memory stream."""
        if self.path is not None:
            return self.path
        assert self.data is not None
        return io.BytesIO(self.data)


@dataclass(frozen=True)
class _Decoded:
    """Samples as (frames, channels) float32 at the stream's own rate."""

    samples: np.ndarray
    sample_rate: int

    @property
    def frames(self) -> int:
        return int(self.samples.shape[0])

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])


class _NoAudioStream(Exception):
    """The container opened but holds no audio stream (a video-only or data file)."""


def load_audio(
    source: str | os.PathLike[str] | bytes | BinaryIO,
    *,
    sample_rate: int = SAMPLE_RATE,
    channel: int | None = None,
    name: str | None = None,
) -> np.ndarray:
    """Decode ``source`` into 1-D float32 mono samples at ``sample_rate``.

    ``source`` is a path, the bytes of a whole file (what a server upload
    gives), or a binary file object. ``channel=None`` averages all channels;
    ``channel=k`` keeps only channel ``k``, for recordings with one speaker per
    channel. ``name`` is how the input is called in errors; it defaults to the
    path, or ``"<bytes>"`` for bytes and file objects.

    Raises :class:`~oasr.errors.AudioDecodeError` for anything that does not
    yield audio: a missing or empty file, truncated or corrupt data, content
    that is not audio, zero decoded samples, or a channel the input lacks.
    """
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    src = _resolve_input(source, name)
    decoded = _decode(src)
    mono = _pick_channels(decoded, channel, src.name)
    out = _resample(mono, decoded.sample_rate, sample_rate)
    if out.size == 0:
        raise AudioDecodeError(src.name, f"audio is shorter than one sample at {sample_rate} Hz")
    return out


def audio_duration(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float:
    """Length in seconds of ``samples`` (time on the last axis) at ``sample_rate``."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    return float(np.shape(samples)[-1]) / float(sample_rate)


def _resolve_input(source: AudioSource, name: str | None) -> _Input:
    """Turn any accepted source into an :class:`_Input`, failing early on missing or empty files.

    Paths stay paths so large files are streamed by the decoders rather than
    read into memory; bytes and file objects are held as bytes because PyAV
    and libsndfile both need to seek, which an upload stream may not allow.
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        label = name if name is not None else path
        _check_path(path, label)
        return _Input(name=label, path=path)
    label = name if name is not None else _BYTES_NAME
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif hasattr(source, "read"):
        data = source.read()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"file object must be opened in binary mode, read() gave {type(data).__name__}")
        data = bytes(data)
    else:
        raise TypeError(f"unsupported audio source type: {type(source).__name__}")
    if not data:
        raise AudioDecodeError(label, "input is empty")
    return _Input(name=label, data=data)


def _check_path(path: str, label: str) -> None:
    """Give the common path problems their own message instead of a decoder's guess."""
    if not os.path.exists(path):
        raise AudioDecodeError(label, "file not found")
    if not os.path.isfile(path):
        raise AudioDecodeError(label, "not a regular file")
    try:
        size = os.path.getsize(path)
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise AudioDecodeError(label, f"could not read file: {exc.strerror or exc}") from exc
    if size == 0:
        raise AudioDecodeError(label, "file is empty")


def _decode(src: _Input) -> _Decoded:
    """Decode with libsndfile, falling back to FFmpeg when it cannot read the input.

    A libsndfile result with zero frames also falls back, since FFmpeg may
    read what libsndfile only half understood; if both agree there is nothing,
    the error says so. When both fail, FFmpeg's message is reported, as it is
    the decoder of last resort.
    """
    sf_found_nothing = False
    try:
        decoded = _decode_with_soundfile(src.open())
        if decoded.frames > 0 and decoded.channels > 0:
            return decoded
        sf_found_nothing = True
    except _SOUNDFILE_ERRORS:
        pass

    try:
        decoded = _decode_with_pyav(src.open())
    except _NoAudioStream as exc:
        raise AudioDecodeError(src.name, "no audio stream found") from exc
    except _PYAV_ERRORS as exc:
        if sf_found_nothing:
            raise AudioDecodeError(src.name, "decoded zero samples") from exc
        raise AudioDecodeError(src.name, f"could not decode: {_describe_av_error(exc)}") from exc
    if decoded.frames == 0 or decoded.channels == 0:
        raise AudioDecodeError(src.name, "decoded zero samples")
    return decoded


def _decode_with_soundfile(handle: str | io.BytesIO) -> _Decoded:
    """All frames and channels through libsndfile, as float32."""
    with sf.SoundFile(handle) as f:
        samples = f.read(dtype="float32", always_2d=True)
        return _Decoded(samples=samples, sample_rate=int(f.samplerate))


def _decode_with_pyav(handle: str | io.BytesIO) -> _Decoded:
    """All frames of the first audio stream through FFmpeg, as float32.

    The resampler only converts the sample format to planar float; its layout
    and rate are fixed from the first frame, which keeps the native rate and
    channel count and smooths over streams that change them midway.
    Undecodable metadata tags are ignored: they say nothing about the audio.
    """
    with _open_container(handle) as container:
        if not container.streams.audio:
            raise _NoAudioStream()
        stream = container.streams.audio[0]
        resampler: av.AudioResampler | None = None
        rate = 0
        chunks: list[np.ndarray] = []
        for frame in container.decode(stream):
            if resampler is None:
                rate = int(frame.sample_rate)
                resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=rate)
            chunks.extend(out.to_ndarray() for out in resampler.resample(frame))
        if resampler is not None:
            chunks.extend(out.to_ndarray() for out in resampler.resample(None))
    if not chunks:
        return _Decoded(samples=np.zeros((0, 1), dtype=np.float32), sample_rate=rate or SAMPLE_RATE)
    planar = np.concatenate(chunks, axis=1)  # (channels, frames)
    return _Decoded(samples=np.ascontiguousarray(planar.T, dtype=np.float32), sample_rate=rate)


def _open_container(handle: str | io.BytesIO) -> av.container.InputContainer:
    try:
        return av.open(handle, mode="r", metadata_errors="ignore")
    except TypeError:  # PyAV >= 19 removed the option (and no longer fails on undecodable tags)
        return av.open(handle, mode="r")


def _describe_av_error(exc: BaseException) -> str:
    """FFmpeg's own sentence, without PyAV's errno and '<none>' filename decoration."""
    text = getattr(exc, "strerror", None)
    if not text:
        text = str(exc) or type(exc).__name__
    return str(text)


def _pick_channels(decoded: _Decoded, channel: int | None, label: str) -> np.ndarray:
    """Average all channels, or keep the one asked for."""
    if channel is None:
        if decoded.channels == 1:
            return decoded.samples[:, 0]
        return decoded.samples.mean(axis=1, dtype=np.float32)
    if not 0 <= channel < decoded.channels:
        raise AudioDecodeError(
            label,
            f"channel {channel} requested but the audio has {decoded.channels} channel(s)",
        )
    return decoded.samples[:, channel]


def _resample(mono: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Resample with soxr (default quality) into a contiguous float32 array."""
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if in_rate != out_rate:
        mono = soxr.resample(mono, in_rate, out_rate)
    return np.ascontiguousarray(mono, dtype=np.float32)
