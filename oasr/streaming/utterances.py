"""A stream's raw samples since its last endpoint: the audio of the utterance being spoken, which a two-pass
final hands to an offline model once the utterance ends. Kept apart from the runtime's ``StreamAudio``, which
holds its samples transformed (pre-emphasised) and only as far back as the next chunk reads."""

from __future__ import annotations

import numpy as np


class UtteranceAudio:
    def __init__(self) -> None:
        self._pieces: list[np.ndarray] = []
        self.start = 0  # absolute sample index of the first sample kept (the current utterance's first)
        self.num_samples = 0  # received so far, from the stream's start

    def push(self, audio: np.ndarray) -> None:
        """audio: 1-D float32 16 kHz samples, as the stream received them."""
        if len(audio):
            self._pieces.append(np.asarray(audio, dtype=np.float32))
            self.num_samples += len(audio)

    def cut(self, end: int | None = None) -> np.ndarray:
        """The samples [``start``, ``end``) (``end`` None: all received), which are forgotten: the next utterance
        begins at ``end``. An ``end`` past the samples received takes what there is."""
        kept = np.concatenate(self._pieces) if self._pieces else np.zeros(0, dtype=np.float32)
        end = self.num_samples if end is None else min(max(end, self.start), self.num_samples)
        utterance, rest = kept[: end - self.start], kept[end - self.start:]
        self._pieces = [rest] if len(rest) else []
        self.start = end
        return utterance
