"""FunASR's ``WavFrontendOnline`` for one stream: Kaldi fbank, LFR stacking and CMVN over audio that arrives in
pieces, each LFR frame handed out once, as soon as the fbank frames it stacks exist.

Every fbank frame reads only its own 25 ms, so a frame computed from a piece equals the frame computed from the
whole stream; FunASR's caches (leftover samples, the LFR splice frames) only decide when a frame can be made. An
LFR frame j stacks fbank frames 6j - 3 .. 6j + 3 (the first one repeated before the start): while the stream is
open it is ready once fbank frame 6j + 3 exists; the stream's end makes the rest, ceil(fbank frames / 6) in all,
the last fbank frame repeated past the end, as the offline frontend does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oasr.features.funasr_fbank import FunasrFbank


@dataclass(frozen=True)
class FbankWork:
    """One stream's LFR frames to make: the fbank frames they stack read ``audio`` (``num_fbank`` frames from its
    start); ``taps`` [K, lfr_m] are the fbank frames (of those) each LFR frame stacks."""

    audio: np.ndarray
    num_fbank: int
    taps: np.ndarray

    @property
    def num_frames(self) -> int:
        return len(self.taps)


def lfr_features(fbank: FunasrFbank, works: list[FbankWork], device: torch.device) -> list[torch.Tensor]:
    """Each work's LFR frames, [K, lfr_m * n_mels] after CMVN: works of one shape in one fbank call (a step's
    streams mostly share theirs), each frame computed from its own samples as alone."""
    c = fbank.config
    shift, scale = c.cmvn_shift or (0.0,), c.cmvn_scale or (1.0,)
    cmvn = torch.tensor([shift[: c.feature_size], scale[: c.feature_size]], dtype=torch.float32).to(device)
    out: list[torch.Tensor | None] = [None] * len(works)
    shapes: dict[tuple[int, int, int], list[int]] = {}
    for index, work in enumerate(works):
        shapes.setdefault((len(work.audio), work.num_fbank, work.num_frames), []).append(index)
    for (_, num_fbank, num_frames), indices in shapes.items():
        if num_frames == 0:
            for index in indices:
                out[index] = torch.zeros(0, c.feature_size, device=device)
            continue
        audio = torch.from_numpy(np.stack([works[i].audio for i in indices])).to(device)
        frames = fbank.fbank(audio, num_fbank)  # [G, num_fbank, n_mels]
        taps = torch.from_numpy(np.stack([works[i].taps for i in indices]).reshape(len(indices), -1)).to(device)
        stacked = frames[torch.arange(len(indices), device=device)[:, None], taps]
        stacked = (stacked.reshape(len(indices), num_frames, -1) + cmvn[0]) * cmvn[1]
        for row, index in enumerate(indices):
            out[index] = stacked[row]
    return out


class OnlineFrontend:
    def __init__(self, fbank: FunasrFbank) -> None:
        self.fbank = fbank
        c = fbank.config
        self.win, self.hop, self.lfr_m, self.lfr_n = c.win_length, c.hop_length, c.lfr_m, c.lfr_n
        self.context = (c.lfr_m - 1) // 2  # fbank frames each side of an LFR frame's centre
        self.samples = np.zeros(0, dtype=np.float32)  # from absolute sample ``start`` on
        self.start = 0
        self.num_samples = 0
        self.emitted = 0  # LFR frames handed out

    def push(self, audio: np.ndarray) -> None:
        self.samples = np.concatenate([self.samples, np.asarray(audio, dtype=np.float32)])
        self.num_samples += len(audio)

    def num_fbank_frames(self) -> int:
        return max(0, (self.num_samples - self.win) // self.hop + 1)

    def ready(self, final: bool) -> int:
        """LFR frames that can be made now (all of them at the end of the stream)."""
        frames = self.num_fbank_frames()
        if final:
            return -(-frames // self.lfr_n)
        return max(0, (frames - 1 - self.context) // self.lfr_n + 1)

    def take(self, final: bool, device: torch.device) -> torch.Tensor:
        """The LFR frames ready and not yet handed out: [1, K, lfr_m * n_mels] after CMVN (K may be 0)."""
        return lfr_features(self.fbank, [self.plan(final)], device)[0][None]

    def plan(self, final: bool) -> FbankWork:
        """What ``take`` computes, without computing it: the frames ready and not yet handed out are counted as
        handed out, and the samples they read are returned (``lfr_features`` makes them, many streams at once)."""
        first, end = self.emitted, max(self.emitted, self.ready(final))
        total = self.num_fbank_frames()
        if end == first:
            return FbankWork(np.zeros(0, dtype=np.float32), 0, np.zeros((0, self.lfr_m), dtype=np.int64))
        lo = max(0, first * self.lfr_n - self.context)
        hi = min(total, (end - 1) * self.lfr_n + self.context + 1)  # fbank frames [lo, hi) are read
        begin = lo * self.hop - self.start
        audio = self.samples[begin: begin + (hi - lo - 1) * self.hop + self.win]
        taps = (np.arange(first, end)[:, None] * self.lfr_n + np.arange(self.lfr_m)[None, :] - self.context)
        taps = taps.clip(0, total - 1) - lo
        self.emitted = end
        self._discard_before(max(0, end * self.lfr_n - self.context))
        return FbankWork(audio, hi - lo, taps)

    def _discard_before(self, fbank_frame: int) -> None:
        keep_from = fbank_frame * self.hop
        if keep_from > self.start:
            drop = min(keep_from - self.start, len(self.samples))
            self.samples, self.start = self.samples[drop:], self.start + drop
