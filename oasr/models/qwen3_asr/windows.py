"""Where a batch's audio positions go in the encoder's attention windows, planned on the host from frame counts.

The encoder attends within windows of ``chunks_per_window`` chunks (8 s). Every chunk of a request but its last is
full, so a request's windows are its chunks taken ``chunks_per_window`` at a time, and the whole batch's work is
its windows, each a sequence of its own: the transformer layers run on [windows, chunks_per_window * P, d] instead
of [B, longest, d], so no row computes the padding up to the batch's longest request and attention is
``windows x W^2`` instead of ``B x S^2``. Only chunks that hold audio go through the convolutions.

``WindowPlan`` holds the index tensors (one gather in, one gather out) and the key mask; it is built from host
ints, so making it never waits for the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from oasr.uploads import upload


def positions_of(frames: int) -> int:
    """Positions after the three (kernel 3, stride 2, padding 1) convolutions of a chunk of ``frames`` frames; an
    empty chunk has none."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1 if frames > 0 else 0
    return frames


@dataclass(frozen=True)
class WindowPlan:
    """chunks: [N] indices of the chunks holding audio in the batch's [B * C] chunks; into_windows: [windows * W]
    indices into those chunks' positions (flattened, [N * P], then one zero row at N * P) filling every window
    slot; keys: bool [windows, 1, 1, W] (True = a real position); out_of_windows: [B, longest] indices into the
    windows' outputs (flattened, then one zero row) giving each request's positions in order; counts: [B] host
    ints, each request's positions; lengths: the same on the device."""

    chunks: torch.Tensor
    into_windows: torch.Tensor
    keys: torch.Tensor
    out_of_windows: torch.Tensor
    counts: tuple[int, ...]
    lengths: torch.Tensor
    window: int

    @classmethod
    def build(cls, frames: Sequence[int], chunks_per_row: int, chunk_frames: int, chunks_per_window: int,
              device: torch.device) -> WindowPlan:
        per_chunk = positions_of(chunk_frames)
        window = per_chunk * chunks_per_window
        frames_np = np.asarray(frames, dtype=np.int64)
        used = np.maximum(1, -(-frames_np // chunk_frames))  # chunks holding audio, per row
        row = np.repeat(np.arange(len(frames_np)), used)  # per chunk
        first_chunk = np.cumsum(used) - used
        c = np.arange(len(row)) - first_chunk[row]  # the chunk's index in its row
        sizes = np.minimum(chunk_frames, frames_np[row] - c * chunk_frames)
        for _ in range(3):  # the three stride-2 convolutions (positions_of, for every chunk at once)
            sizes = np.where(sizes > 0, (sizes - 1) // 2 + 1, 0)
        windows_per_row = -(-used // chunks_per_window)
        first_window = np.cumsum(windows_per_row) - windows_per_row
        num_windows = int(windows_per_row.sum())
        slot = (first_window[row] + c // chunks_per_window) * chunks_per_window + c % chunks_per_window
        offsets = np.arange(per_chunk)
        real = offsets[None, :] < sizes[:, None]  # [chunks, P]
        targets = (slot[:, None] * per_chunk + offsets)[real]  # window slots of the real positions, in row order
        zero = len(row) * per_chunk  # the zero row after the chunks' positions
        into = np.full(num_windows * window, zero, dtype=np.int64)
        into[targets] = (np.arange(len(row))[:, None] * per_chunk + offsets)[real]
        keys = np.zeros(num_windows * window, dtype=bool)
        keys[targets] = True
        counts = np.bincount(row, weights=sizes, minlength=len(frames_np)).astype(np.int64)
        rank = np.arange(len(targets)) - np.repeat(np.cumsum(counts) - counts, counts)
        out = np.full((len(frames_np), int(counts.max())), num_windows * window, dtype=np.int64)
        out[np.repeat(np.arange(len(frames_np)), counts), rank] = targets
        # One pinned upload for all of it: a blocking copy would wait for the device's queue (the features).
        chunks, into_, keys_, out_, counts_ = upload(device, row * chunks_per_row + c, into, keys, out, counts)
        return cls(chunks=chunks, into_windows=into_, keys=keys_.bool().view(-1, 1, 1, window),
                   out_of_windows=out_.view(out.shape), counts=tuple(counts.tolist()), lengths=counts_,
                   window=window)

    @property
    def num_windows(self) -> int:
        return self.keys.shape[0]
