"""Decode any audio input into 16 kHz mono float32 samples.

Two well-kept decoders do the work: libsndfile (through ``soundfile``) first,
because it is exact and fast for WAV/FLAC/Ogg and reports the sample counts
that reference data was measured with; FFmpeg (through PyAV) second, because it
reads almost every other container and codec (MP4/AAC, WebM, Opus, ...). Both
check what the header declares (rate, channels, length) before decoding, then
decode in blocks into one :class:`~oasr.audio.bounded.MonoCollector`, which
mixes or selects channels and resamples (soxr) each block as it comes, so every
format goes through the same code from there on and an optional length limit
stops decoding early.
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

from oasr.audio.bounded import DecodeTarget, MonoCollector, block_frames, check_declared, check_length, check_stream
from oasr.errors import AudioDecodeError

SAMPLE_RATE = 16_000
"""The rate every model in OASR consumes, in Hz."""

AudioSource = Union[str, os.PathLike[str], bytes, bytearray, memoryview, BinaryIO]
"""What :func:`load_audio` accepts: a path, raw file bytes, or a binary file object."""

_BYTES_NAME = "<bytes>"
# libsndfile's frame count for a stream whose length it does not know (a FLAC without its total).
_SF_UNKNOWN_FRAMES = 0x7FFF_FFFF_FFFF_FFFF
# Samples (all channels) up to which an MP3 is read in one piece: 64 MiB of float32, 2.9 min of 48 kHz stereo.
_MP3_ONE_READ_SAMPLES = 1 << 24

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


class _NoAudioStream(Exception):
    """The container opened but holds no audio stream (a video-only or data file)."""


def load_audio(
    source: str | os.PathLike[str] | bytes | BinaryIO,
    *,
    sample_rate: int = SAMPLE_RATE,
    channel: int | None = None,
    name: str | None = None,
    max_seconds: float | None = None,
) -> np.ndarray:
    """Decode ``source`` into 1-D float32 mono samples at ``sample_rate``.

    ``source`` is a path, the bytes of a whole file (what a server upload
    gives), or a binary file object. ``channel=None`` averages all channels;
    ``channel=k`` keeps only channel ``k``, for recordings with one speaker per
    channel. ``name`` is how the input is called in errors; it defaults to the
    path, or ``"<bytes>"`` for bytes and file objects.

    ``max_seconds`` (None: no limit) bounds what an untrusted input can cost:
    a header declaring more is refused before decoding, and decoding stops
    soon after passing it, so memory follows the limit, not the header. The
    result is never longer than ``max_seconds``.

    Raises :class:`~oasr.errors.AudioDecodeError` for anything that does not
    yield audio: a missing or empty file, truncated or corrupt data, content
    that is not audio, zero decoded samples, a channel the input lacks, or a
    header declaring a sample rate or channel count no recording has; its
    subclass :class:`~oasr.errors.AudioTooLongError` for input over
    ``max_seconds``.
    """
    target = DecodeTarget(sample_rate=sample_rate, channel=channel, max_seconds=max_seconds)
    src = _resolve_input(source, name)
    out = _decode(src, target)
    if out.size == 0:
        raise AudioDecodeError(src.name, f"audio is shorter than one sample at {sample_rate} Hz")
    check_length(src.name, audio_duration(out, sample_rate), max_seconds)
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


def _decode(src: _Input, target: DecodeTarget) -> np.ndarray:
    """Decode with libsndfile, falling back to FFmpeg when it cannot read the input.

    A libsndfile result with zero frames also falls back, since FFmpeg may
    read what libsndfile only half understood; if both agree there is nothing,
    the error says so. When both fail, FFmpeg's message is reported, as it is
    the decoder of last resort. A refusal of what the header declares (its
    rate, channels or length) is final: FFmpeg would read the same header.
    """
    sf_found_nothing = False
    try:
        collector = _decode_with_soundfile(src, target)
        if collector.num_frames > 0:
            return collector.finish()
        sf_found_nothing = True
    except _SOUNDFILE_ERRORS:
        pass

    try:
        collector = _decode_with_pyav(src, target)
    except _NoAudioStream as exc:
        raise AudioDecodeError(src.name, "no audio stream found") from exc
    except _PYAV_ERRORS as exc:
        if sf_found_nothing:
            raise AudioDecodeError(src.name, "decoded zero samples") from exc
        raise AudioDecodeError(src.name, f"could not decode: {_describe_av_error(exc)}") from exc
    if collector is None or collector.num_frames == 0:
        raise AudioDecodeError(src.name, "decoded zero samples")
    return collector.finish()


def _decode_with_soundfile(src: _Input, target: DecodeTarget) -> MonoCollector:
    """All frames and channels through libsndfile, as float32 blocks.

    libsndfile's frame count is exact for PCM (a WAV data chunk that claims
    more than the file holds is cut to the file) and read from the header for
    FLAC, Ogg and MP3; reads stop at it, as a whole-file read would. A stream
    of unknown length is read block by block until it ends or passes the limit.
    """
    with sf.SoundFile(src.open()) as f:
        check_stream(src.name, int(f.samplerate), int(f.channels), target.channel)
        declared = None if f.frames == _SF_UNKNOWN_FRAMES else int(f.frames)
        if declared is not None:
            check_declared(src.name, declared / f.samplerate, target.max_seconds)
        collector = MonoCollector(src.name, int(f.samplerate), int(f.channels), target, declared)
        num_frames = block_frames(f.channels)
        if f.format == "MP3" and f.frames * f.channels <= _MP3_ONE_READ_SAMPLES:
            # libsndfile's MP3 decoder rounds some samples one float32 step differently after a read boundary,
            # so a short MP3 is read in one piece, exactly as a whole-file read decodes it.
            num_frames = max(1, f.frames)
        while True:
            block = f.read(collector.frames_to_read(num_frames), dtype="float32", always_2d=True)
            if block.shape[0] == 0:
                return collector
            collector.add(block)


def _decode_with_pyav(src: _Input, target: DecodeTarget) -> MonoCollector | None:
    """All frames of the first audio stream through FFmpeg, as float32 blocks (None when it has no frames).

    The resampler only converts the sample format to planar float; its layout
    and rate are fixed from the first frame, which keeps the native rate and
    channel count and smooths over streams that change them midway.
    Undecodable metadata tags are ignored: they say nothing about the audio.
    """
    with _open_container(src.open()) as container:
        if not container.streams.audio:
            raise _NoAudioStream()
        stream = container.streams.audio[0]
        declared_s = _check_pyav_header(src.name, container, stream, target)
        resampler: av.AudioResampler | None = None
        collector: MonoCollector | None = None
        for frame in container.decode(stream):
            if resampler is None:
                rate = int(frame.sample_rate)
                declared = None if declared_s is None else int(declared_s * rate)
                collector = MonoCollector(src.name, rate, frame.layout.nb_channels, target, declared)
                resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=rate)
            for out in resampler.resample(frame):
                collector.add(out.to_ndarray().T)
        if resampler is not None:
            for out in resampler.resample(None):
                collector.add(out.to_ndarray().T)
    return collector


def _check_pyav_header(name: str, container: av.container.InputContainer, stream: av.AudioStream,
                       target: DecodeTarget) -> float | None:
    """What FFmpeg read from the header, checked before the first frame; a field it left unset is skipped.
    Returns the declared length in seconds, if any."""
    codec = stream.codec_context
    if codec.sample_rate and codec.layout.nb_channels:
        check_stream(name, int(codec.sample_rate), int(codec.layout.nb_channels), target.channel)
    declared_s = None
    if stream.duration is not None and stream.time_base is not None:
        declared_s = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        declared_s = container.duration / av.time_base
    check_declared(name, declared_s, target.max_seconds)
    return declared_s


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
