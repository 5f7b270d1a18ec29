"""Realtime input audio: the three wire formats decoded to float samples and resampled to the engine's 16 kHz.

``pcm16`` (GA ``audio/pcm``) is 16-bit little-endian mono at 24 kHz, the only rate OpenAI accepts; ``g711_ulaw``
and ``g711_alaw`` (GA ``audio/pcmu`` / ``audio/pcma``) are 8-bit G.711 at 8 kHz (ITU-T G.711, decoded through
256-entry tables built with numpy: the standard library's ``audioop`` is gone in Python 3.13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import soxr

AudioFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]
AUDIO_FORMATS: tuple[AudioFormat, ...] = ("pcm16", "g711_ulaw", "g711_alaw")
TARGET_RATE = 16_000
PCM16_RATE = 24_000
G711_RATE = 8_000
_PCM16_SCALE = 32768.0


class InvalidAudioError(ValueError):
    """Bytes that are not whole samples of the session's format."""


def _ulaw_table() -> np.ndarray:
    """G.711 mu-law byte -> linear sample in [-1, 1] (the 14-bit magnitude scaled by 2**15, as PCM16 is)."""
    codes = ~np.arange(256, dtype=np.uint8)  # bytes are stored inverted
    exponent = (codes >> 4) & 0x07
    mantissa = (codes & 0x0F).astype(np.int32)
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32) / _PCM16_SCALE


def _alaw_table() -> np.ndarray:
    """G.711 A-law byte -> linear sample in [-1, 1]."""
    codes = np.arange(256, dtype=np.uint8) ^ 0x55  # even bits are stored inverted
    exponent = ((codes >> 4) & 0x07).astype(np.int32)
    mantissa = (codes & 0x0F).astype(np.int32)
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.float32) / _PCM16_SCALE


@dataclass(frozen=True)
class Codec:
    name: AudioFormat
    sample_rate: int
    bytes_per_sample: int
    table: np.ndarray | None  # byte -> sample, for the 8-bit companded formats

    def decode(self, data: bytes) -> np.ndarray:
        """Float32 samples at ``sample_rate``; raises ``InvalidAudioError`` on a partial sample."""
        if len(data) % self.bytes_per_sample:
            raise InvalidAudioError(f"{self.name} audio is {self.bytes_per_sample} bytes per sample; "
                                    f"got {len(data)} bytes")
        if self.table is None:
            return np.frombuffer(data, dtype="<i2").astype(np.float32) / _PCM16_SCALE
        return self.table[np.frombuffer(data, dtype=np.uint8)]


def codec(name: AudioFormat) -> Codec:
    if name == "pcm16":
        return Codec(name, PCM16_RATE, 2, None)
    if name == "g711_ulaw":
        return Codec(name, G711_RATE, 1, _ulaw_table())
    if name == "g711_alaw":
        return Codec(name, G711_RATE, 1, _alaw_table())
    raise ValueError(f"unknown realtime audio format {name!r}; choose one of {', '.join(AUDIO_FORMATS)}")


class InputAudio:
    """One session's audio as it arrives: decoded, resampled to 16 kHz with soxr's streaming resampler (the
    same samples as resampling the whole signal at once). ``flush`` hands out what the resampler still holds,
    so a committed turn ends where its audio ended; the next append starts a fresh stream."""

    def __init__(self, name: AudioFormat) -> None:
        self.codec = codec(name)
        self._resampler: soxr.ResampleStream | None = None
        self.num_input_samples = 0  # at the wire rate, over the session

    @property
    def input_seconds(self) -> float:
        return self.num_input_samples / self.codec.sample_rate

    def push(self, data: bytes) -> np.ndarray:
        samples = self.codec.decode(data)
        self.num_input_samples += len(samples)
        if self._resampler is None:
            self._resampler = soxr.ResampleStream(self.codec.sample_rate, TARGET_RATE, 1, dtype="float32")
        return self._resampler.resample_chunk(samples, last=False)

    def flush(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        self._resampler = None
        return tail
