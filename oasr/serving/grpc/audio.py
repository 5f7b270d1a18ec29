"""A Riva request's audio as the engine's 16 kHz mono float32: raw samples (16-bit PCM, G.711 mu-law or A-law at
the config's rate, channels interleaved and averaged) or a file whose header describes it (FLAC, Ogg Opus,
decoded as uploads are). Raw samples resample through soxr's streaming resampler, so a stream's chunks give the
same samples as the whole recording at once. The G.711 tables are the realtime route's."""

from __future__ import annotations

import numpy as np
import soxr

from oasr.errors import AudioDecodeError, AudioTooLongError
from oasr.serving.grpc.config import ALAW, MULAW, AudioFormat, invalid
from oasr.serving.realtime.audio import codec
from oasr.transcription.spans import to_samples

TARGET_RATE = 16_000
_PCM16_SCALE = 32768.0


class RawAudio:
    """One request's raw samples as they arrive; ``flush`` at the end hands out what the resampler holds."""

    def __init__(self, audio: AudioFormat) -> None:
        self.format = audio
        self.table = codec("g711_ulaw").table if audio.encoding == MULAW else \
            codec("g711_alaw").table if audio.encoding == ALAW else None
        self.bytes_per_frame = (1 if self.table is not None else 2) * audio.channels
        self._pending = b""  # a partial frame, completed by the next chunk
        # None at 16 kHz: the samples go to the engine as sent (soxr would still filter them).
        self._resampler = None if audio.sample_rate == TARGET_RATE else \
            soxr.ResampleStream(audio.sample_rate, TARGET_RATE, 1, dtype="float32")
        self.num_input_frames = 0

    @property
    def input_seconds(self) -> float:
        return self.num_input_frames / self.format.sample_rate

    def push(self, data: bytes) -> np.ndarray:
        data = self._pending + data
        whole = len(data) - len(data) % self.bytes_per_frame
        self._pending = data[whole:]
        if self.table is not None:
            samples = self.table[np.frombuffer(data[:whole], dtype=np.uint8)]
        else:
            samples = np.frombuffer(data[:whole], dtype="<i2").astype(np.float32) / _PCM16_SCALE
        frames = samples.reshape(-1, self.format.channels).mean(axis=1, dtype=np.float32)
        self.num_input_frames += len(frames)
        return frames if self._resampler is None else self._resampler.resample_chunk(frames, last=False)

    def flush(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        return self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)


def decode_recording(audio: AudioFormat, data: bytes, field: str, max_seconds: float) -> np.ndarray:
    """A whole recording (Recognize's ``audio``); raises INVALID_ARGUMENT naming ``field`` for audio that cannot
    be read, is empty, or is longer than ``max_seconds``."""
    if not data:
        raise invalid(field, "no audio was sent")
    if audio.raw:
        raw = RawAudio(audio)
        if len(data) % raw.bytes_per_frame:
            raise invalid(field, f"{len(data)} bytes is not a whole number of {audio.channels}-channel samples")
        if len(data) / raw.bytes_per_frame / audio.sample_rate > max_seconds:
            raise invalid(field, f"the audio is longer than this server's limit of {max_seconds:g} s")
        return np.concatenate([raw.push(data), raw.flush()])
    try:
        return to_samples(data, "audio", max_seconds)
    except AudioTooLongError:
        raise invalid(field, f"the audio is longer than this server's limit of {max_seconds:g} s") from None
    except AudioDecodeError as exc:
        raise invalid(field, f"could not read the audio: {exc}") from None
