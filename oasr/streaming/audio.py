"""One stream's audio as its feature frames need it: pushed in pieces of any length, pre-emphasised as it
arrives, and kept only as far back as the next frame to compute reads.

Feature frame i is centred on sample i * hop: it reads samples [i * hop - n_fft / 2, i * hop + n_fft / 2), zeros
before sample 0 (the offline frontend's centred, zero-padded STFT). While the stream is open a frame is ready
once all its samples have arrived; once it is closed the frames whose centre lies inside the audio are ready
(``num_samples // hop``, the offline frontend's real frames), the samples after the end read as zeros.
"""

from __future__ import annotations

import numpy as np


class StreamAudio:
    def __init__(self, hop: int, n_fft: int, preemphasis: float) -> None:
        self.hop, self.half_window, self.preemphasis = hop, n_fft // 2, preemphasis
        self.samples = np.zeros(0, dtype=np.float32)  # pre-emphasised, from absolute sample ``start`` on
        self.start = 0
        self.num_samples = 0  # received so far
        self.closed = False
        self._last = 0.0  # the last raw sample, for pre-emphasis across pushes

    def push(self, audio: np.ndarray) -> None:
        """audio: 1-D float 16 kHz samples (any length, also empty)."""
        if self.closed:
            raise ValueError("audio pushed after the stream was closed")
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"stream audio must be 1-D samples, got shape {audio.shape}")
        if not np.isfinite(audio).all():
            raise ValueError("stream audio holds NaN or infinite samples")
        if not len(audio):
            return
        shifted = np.concatenate([np.array([self._last], dtype=np.float32), audio[:-1]])
        emphasised = audio - np.float32(self.preemphasis) * shifted if self.preemphasis else audio
        self._last = float(audio[-1])
        self.samples = np.concatenate([self.samples, emphasised.astype(np.float32)])
        self.num_samples += len(audio)

    def close(self) -> None:
        self.closed = True

    @property
    def num_frames_ready(self) -> int:
        if self.closed:
            return self.num_samples // self.hop
        return max(0, (self.num_samples - self.half_window) // self.hop + 1)

    def window(self, first_frame: int, num_frames: int) -> np.ndarray:
        """The samples frames [first_frame, first_frame + num_frames) read, (num_frames - 1) * hop + n_fft of
        them; zeros before sample 0 and after the last received one (``first_frame`` may be negative)."""
        begin = first_frame * self.hop - self.half_window
        size = (num_frames - 1) * self.hop + 2 * self.half_window
        out = np.zeros(size, dtype=np.float32)
        lo, hi = max(begin, self.start), min(begin + size, self.start + len(self.samples))
        if hi > lo:
            out[lo - begin : hi - begin] = self.samples[lo - self.start : hi - self.start]
        return out

    def discard_before(self, frame: int) -> None:
        """Frees the samples no frame from ``frame`` on reads."""
        keep_from = frame * self.hop - self.half_window
        if keep_from > self.start:
            drop = min(keep_from - self.start, len(self.samples))
            self.samples = self.samples[drop:]
            self.start += drop
