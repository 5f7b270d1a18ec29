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


# cuFFT makes a plan for each batch shape it transforms, and the first use of a shape can cost far more than a
# step; a step's streams vary in number and in fbank frames, so on CUDA a call's rows are padded to a power of two
# and its frames to a multiple of this, shapes ``warm_fbank`` makes once before any stream.
FRAMES_BUCKET = 64


def fbank_shape(num_rows: int, num_fbank: int, bucketed: bool) -> tuple[int, int]:
    """The (rows, fbank frames) an fbank call of ``num_rows`` works of ``num_fbank`` frames computes."""
    if not bucketed:
        return num_rows, num_fbank
    return 1 << max(num_rows - 1, 0).bit_length(), -(-num_fbank // FRAMES_BUCKET) * FRAMES_BUCKET


def lfr_features(fbank: FunasrFbank, works: list[FbankWork], device: torch.device,
                 bucketed: bool | None = None) -> list[torch.Tensor]:
    """Each work's LFR frames, [K, lfr_m * n_mels] after CMVN: works of one fbank shape in one call (a step's
    streams mostly share theirs), each frame computed from its own samples as alone; ``bucketed``: calls padded
    to ``fbank_shape``'s buckets (None: on CUDA)."""
    c = fbank.config
    bucketed = device.type == "cuda" if bucketed is None else bucketed
    shift, scale = c.cmvn_shift or (0.0,), c.cmvn_scale or (1.0,)
    cmvn = torch.tensor([shift[: c.feature_size], scale[: c.feature_size]], dtype=torch.float32).to(device)
    out = [torch.zeros(0, c.feature_size, device=device) for _ in works]
    shapes: dict[int, list[int]] = {}  # fbank frames computed -> the works
    for index, work in enumerate(works):
        if work.num_frames:
            shapes.setdefault(fbank_shape(1, work.num_fbank, bucketed)[1], []).append(index)
    for num_fbank, indices in shapes.items():
        num_rows, num_fbank = fbank_shape(len(indices), num_fbank, bucketed)
        audio = np.zeros((num_rows, (num_fbank - 1) * c.hop_length + c.win_length), dtype=np.float32)
        longest = max(works[i].num_frames for i in indices)
        taps = np.zeros((len(indices), longest, works[indices[0]].taps.shape[1]), dtype=np.int64)
        for row, index in enumerate(indices):
            audio[row, : len(works[index].audio)] = works[index].audio
            taps[row, : works[index].num_frames] = works[index].taps
        frames = fbank.fbank(torch.from_numpy(audio).to(device), num_fbank)  # [rows, num_fbank, n_mels]
        at = torch.from_numpy(taps.reshape(len(indices), -1)).to(device)
        stacked = frames[torch.arange(len(indices), device=device)[:, None], at]
        stacked = (stacked.reshape(len(indices), longest, -1) + cmvn[0]) * cmvn[1]
        for row, index in enumerate(indices):
            out[index] = stacked[row, : works[index].num_frames]
    return out


def warm_fbank(fbank: FunasrFbank, max_rows: int, max_fbank: int, device: torch.device) -> None:
    """Every fbank shape ``lfr_features`` can compute for up to ``max_rows`` works of up to ``max_fbank`` frames,
    once (on CUDA; elsewhere no shape costs more the first time)."""
    if device.type != "cuda":
        return
    c = fbank.config
    most_rows, most_frames = fbank_shape(max_rows, max_fbank, True)
    for num_fbank in range(FRAMES_BUCKET, most_frames + 1, FRAMES_BUCKET):
        num_rows = 1
        while num_rows <= most_rows:
            samples = (num_fbank - 1) * c.hop_length + c.win_length
            fbank.fbank(torch.zeros(num_rows, samples, device=device), num_fbank)
            num_rows *= 2


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
