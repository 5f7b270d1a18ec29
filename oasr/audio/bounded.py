"""Decoded audio gathered block by block under a length limit, and the header checks made before decoding.

A file's header can claim anything: a rate of 1 Hz (100 KB of samples that upsample to hours at 16 kHz), a
length of days, thousands of channels. Each claim a header makes is checked before the first block is decoded;
then every block is turned into mono at the output rate as it arrives, and decoding stops once it has passed
the limit. What one input can make this process hold is therefore set by the limit, not by its header, and no
more than one block of the stream's own rate and channels is held at a time. Decoding stops at the limit itself
(a reader asks only for the frames up to it, ``frames_to_read``), not at the margin the header checks allow: a
stream that declares no length costs no more than an honest one of the limit's length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import soxr

from oasr.errors import AudioDecodeError, AudioTooLongError

# 8 kHz telephone audio is the lowest rate speech is stored at; 1 kHz leaves room for odd but real files while
# refusing headers whose few bytes would upsample into hours. 384 kHz is the highest rate audio interfaces record.
MIN_SAMPLE_RATE = 1_000
MAX_SAMPLE_RATE = 384_000
# Higher-order ambisonics (64 channels at 7th order) and large microphone arrays fit; only headers do not.
MAX_CHANNELS = 256
# Samples (all channels together) decoded per block: 4 MiB of float32, whatever the channel count.
BLOCK_SAMPLES = 1 << 20
# Without a limit, a declared length sizes the output array only up to this; longer streams grow it. A header
# can declare anything, and an unlimited decode (a trusted local file) should fail on its data, not its header.
UNLIMITED_PREALLOCATION_S = 3600.0


@dataclass(frozen=True)
class DecodeTarget:
    """What the caller asked for: the output rate, which channel (None averages them all), and the longest
    input accepted in seconds (None accepts any length)."""

    sample_rate: int
    channel: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {self.sample_rate}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be positive or None, got {self.max_seconds}")


def margin_s(max_seconds: float) -> float:
    """How far past the limit a declared or partly decoded length may go before it is refused unseen.

    FFmpeg estimates some lengths from the bitrate (MP3 without a Xing header, ADTS AAC), which is off on
    variable-bitrate streams, and codecs add priming and padding; so the early refusals leave this much room and
    the exact check is made on the decoded output (:func:`check_length`).
    """
    return 1.0 + 0.05 * max_seconds


def block_frames(num_channels: int) -> int:
    """Frames per decoded block for a stream of ``num_channels``."""
    return max(1, BLOCK_SAMPLES // max(1, num_channels))


def check_stream(name: str, sample_rate: int, num_channels: int, channel: int | None) -> None:
    """Refuse a stream whose rate or channel count no real recording has, or that lacks the channel asked for."""
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise AudioDecodeError(name, f"the file declares a sample rate of {sample_rate} Hz; only "
                                     f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz is accepted")
    if not 1 <= num_channels <= MAX_CHANNELS:
        raise AudioDecodeError(name, f"the file declares {num_channels} channels; at most {MAX_CHANNELS} "
                                     "are accepted")
    if channel is not None and not 0 <= channel < num_channels:
        raise AudioDecodeError(name, f"channel {channel} requested but the audio has {num_channels} channel(s)")


def check_declared(name: str, declared_s: float | None, max_seconds: float | None) -> None:
    """Refuse at once a stream whose header says it is clearly over the limit (None: no length declared)."""
    if max_seconds is None or declared_s is None:
        return
    if declared_s > max_seconds + margin_s(max_seconds):
        raise AudioTooLongError(name, f"the file declares {declared_s:.1f} s of audio", max_seconds)


def check_length(name: str, duration_s: float, max_seconds: float | None) -> None:
    """The exact check, on the decoded output's duration."""
    if max_seconds is not None and duration_s > max_seconds:
        raise AudioTooLongError(name, f"the audio is {duration_s:.1f} s long", max_seconds)


class MonoCollector:
    """One stream's decoded blocks, kept only as mono float32 at the target rate.

    Each ``(frames, channels)`` block at the stream's rate is averaged (or has its channel picked) and resampled
    as it arrives; soxr's streaming resampler gives the same samples as resampling the whole signal at once.
    Decoding past the limit raises :class:`~oasr.errors.AudioTooLongError` before the
    block is kept. ``declared_frames``, the header's length where it gives one, sizes the output once.
    """

    def __init__(self, name: str, sample_rate: int, num_channels: int, target: DecodeTarget,
                 declared_frames: int | None = None) -> None:
        check_stream(name, sample_rate, num_channels, target.channel)
        self.name = name
        self.sample_rate = sample_rate
        self.num_channels = num_channels
        self.target = target
        self.num_frames = 0  # frames decoded at the stream's own rate
        self._max_frames: int | None = None
        if target.max_seconds is not None and math.isfinite(target.max_seconds):  # an infinite limit is none
            # The decoded frames are exact (they are what the output holds), so no margin: past the limit by
            # more than the resampler's rounding (one output sample) is surely refused by the exact check too.
            self._max_frames = math.ceil((target.max_seconds + 1 / target.sample_rate) * sample_rate) + 1
        self._resampler: soxr.ResampleStream | None = None
        if sample_rate != target.sample_rate:
            self._resampler = soxr.ResampleStream(sample_rate, target.sample_rate, 1, dtype="float32")
        self._output = _Samples(self._capacity(declared_frames), self._capacity(self._max_frames))

    def _capacity(self, declared_frames: int | None) -> int:
        """Output samples to allocate for ``declared_frames`` at the stream's rate (None: a second, grown as the
        stream goes on), never past what the limit lets through."""
        if self._max_frames is not None:
            bound = self._max_frames
        else:
            bound = int(UNLIMITED_PREALLOCATION_S * self.sample_rate)
        frames = self.sample_rate if declared_frames is None else max(declared_frames, 0)
        return int(min(bound, frames) * self.target.sample_rate / self.sample_rate) + 2  # + soxr's rounding

    def frames_to_read(self, num_frames: int) -> int:
        """How many of the next ``num_frames`` a reader should decode: no more than one past the limit, which
        is where ``add`` refuses, so a block of a minute is not decoded to learn that its first frame is over."""
        if self._max_frames is None:
            return num_frames
        return max(1, min(num_frames, self._max_frames + 1 - self.num_frames))

    def add(self, block: np.ndarray) -> None:
        """Take one ``(frames, channels)`` float32 block at the stream's rate."""
        if block.shape[0] == 0:
            return
        self.num_frames += int(block.shape[0])
        if self._max_frames is not None and self.num_frames > self._max_frames:
            assert self.target.max_seconds is not None
            raise AudioTooLongError(self.name, f"the audio runs past {self.target.max_seconds:.1f} s",
                                    self.target.max_seconds)
        mono = np.ascontiguousarray(self._pick(block), dtype=np.float32)
        if self._resampler is not None:
            mono = self._resampler.resample_chunk(mono, last=False)
        self._output.append(mono)

    def finish(self) -> np.ndarray:
        """Everything taken, as one contiguous 1-D float32 array at the target rate."""
        if self._resampler is not None:
            self._output.append(self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
        return self._output.result()

    def _pick(self, block: np.ndarray) -> np.ndarray:
        """Average all channels, or keep the one asked for."""
        channel = self.target.channel
        if channel is not None:
            return block[:, channel]
        if self.num_channels == 1:
            return block[:, 0]
        return block.mean(axis=1, dtype=np.float32)


class _Samples:
    """1-D float32 samples appended into one array, grown by doubling past its first capacity (up to
    ``max_capacity`` while that suffices), so the result is that array itself and not a concatenation of blocks
    (which holds the output twice at the end). The array is grown and trimmed in place (``realloc``, which
    remaps a large block rather than copying it), so no moment holds two copies either."""

    def __init__(self, capacity: int, max_capacity: int) -> None:
        self._data = np.empty(max(1, capacity), dtype=np.float32)
        self._max_capacity = max_capacity
        self.size = 0

    def append(self, samples: np.ndarray) -> None:
        end = self.size + samples.size
        if end > self._data.size:  # no view of the array exists between calls, so resizing it is safe
            self._data.resize(max(end, min(2 * self._data.size, self._max_capacity)), refcheck=False)
        self._data[self.size : end] = samples
        self.size = end

    def result(self) -> np.ndarray:
        data, self._data = self._data, np.empty(0, dtype=np.float32)
        if data.size != self.size:
            data.resize(self.size, refcheck=False)  # gives the spare room back
        return data
