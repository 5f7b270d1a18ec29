"""FunASR's ``WavFrontendOnline`` for one stream: Kaldi fbank, LFR stacking and CMVN over audio that arrives in
pieces, each LFR frame handed out once, as soon as the fbank frames it stacks exist.

Every fbank frame reads only its own 25 ms, so a frame computed from a piece equals the frame computed from the
whole stream; FunASR's caches (leftover samples, the LFR splice frames) only decide when a frame can be made. An
LFR frame j stacks fbank frames 6j - 3 .. 6j + 3 (the first one repeated before the start): while the stream is
open it is ready once fbank frame 6j + 3 exists; the stream's end makes the rest, ceil(fbank frames / 6) in all,
the last fbank frame repeated past the end, as the offline frontend does.
"""

from __future__ import annotations

import numpy as np
import torch

from oasr.features.funasr_fbank import FunasrFbank


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
        shift, scale = c.cmvn_shift or (0.0,), c.cmvn_scale or (1.0,)
        self.cmvn = torch.tensor([shift[: c.feature_size], scale[: c.feature_size]], dtype=torch.float32)

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
        first, end = self.emitted, self.ready(final)
        total = self.num_fbank_frames()
        if end <= first:
            return torch.zeros(1, 0, self.fbank.config.feature_size, device=device)
        lo = max(0, first * self.lfr_n - self.context)
        hi = min(total, (end - 1) * self.lfr_n + self.context + 1)  # fbank frames [lo, hi) are read
        begin = lo * self.hop - self.start
        audio = torch.from_numpy(self.samples[begin: begin + (hi - lo - 1) * self.hop + self.win]).to(device)
        fbank = self.fbank.fbank(audio[None], hi - lo)  # [1, hi - lo, n_mels]
        taps = (torch.arange(first, end, device=device)[:, None] * self.lfr_n
                + torch.arange(self.lfr_m, device=device)[None, :] - self.context)
        taps = taps.clamp(0, total - 1) - lo
        stacked = fbank[0, taps.reshape(-1)].reshape(1, end - first, -1)
        cmvn = self.cmvn.to(device)
        self.emitted = end
        self._discard_before(max(0, end * self.lfr_n - self.context))
        return (stacked + cmvn[0]) * cmvn[1]

    def _discard_before(self, fbank_frame: int) -> None:
        keep_from = fbank_frame * self.hop
        if keep_from > self.start:
            drop = min(keep_from - self.start, len(self.samples))
            self.samples, self.start = self.samples[drop:], self.start + drop
