"""Where a batch's real frames live: padded to the longest row, or packed row after row.

An encoder layer's position-wise work (feed-forwards, projections, norms, residual adds) treats every frame
alike, so on a padded batch it computes the padded frames too; for a batch of mixed lengths that can be a sixth or
more of the work. ``FrameLayout.packed`` keeps only the real frames, [rows, C] with each utterance's frames
contiguous, and gives the layers that mix frames (attention, convolution) a padded view where they need one:
``unpack`` gathers [B, T, C] (every padded frame a copy of some real frame, so finite) and ``pack`` gathers
the real frames back. ``FrameLayout.padded`` is the same interface over [B, T, C] itself (``pack`` and
``unpack`` return their input).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Packed rows are rounded up to a multiple of this: matrix-multiply kernels are picked by shape, and round
# shapes get the good ones. The spare rows hold copies of a real frame; nothing reads them back.
ROW_MULTIPLE = 64


@dataclass(frozen=True)
class FrameLayout:
    lengths: torch.Tensor  # [B] int64: real frames per utterance
    starts: torch.Tensor  # [B] int64: where each utterance's first frame sits in the flattened frames
    mask: torch.Tensor  # bool [B, T]: True on real frames of the padded view
    num_frames: int  # T, the padded view's frames per utterance
    # Packed only: flattened padded position of each packed row, and packed row of each padded position.
    packed_from: torch.Tensor | None = None  # [rows]
    padded_from: torch.Tensor | None = None  # [B * T]

    @property
    def is_packed(self) -> bool:
        return self.packed_from is not None

    @classmethod
    def padded(cls, lengths: torch.Tensor, num_frames: int) -> FrameLayout:
        """Utterance b at flattened frames [b * T, b * T + lengths[b])."""
        rows = torch.arange(lengths.shape[0], device=lengths.device)
        mask = torch.arange(num_frames, device=lengths.device)[None, :] < lengths[:, None]
        return cls(lengths=lengths, starts=rows * num_frames, mask=mask, num_frames=num_frames)

    @classmethod
    def packed(cls, lengths: Sequence[int], num_frames: int, device: torch.device | str) -> FrameLayout:
        """Utterance b at rows [sum(lengths[:b]), sum(lengths[:b + 1])); ``lengths`` on the host, so the layout
        is built without reading the device."""
        if not lengths or min(lengths) < 1 or max(lengths) > num_frames:
            raise ValueError(f"packing needs 1..{num_frames} frames per utterance, got {list(lengths)}")
        host = torch.tensor(lengths, dtype=torch.long)
        starts = torch.cumsum(host, 0) - host
        total = int(host.sum())
        frame = torch.arange(num_frames)
        real = frame[None, :] < host[:, None]  # [B, T]
        # Each packed row's padded position; spare rows repeat position 0 (utterance 0's first frame).
        packed_from = torch.zeros(-(-total // ROW_MULTIPLE) * ROW_MULTIPLE, dtype=torch.long)
        packed_from[:total] = torch.nonzero(real.flatten()).flatten()
        # Each padded position's packed row; a padded frame repeats its utterance's first frame.
        padded_from = (starts[:, None] + torch.where(real, frame[None, :], 0)).flatten()
        # One upload for the four index tensors (pinned, so it does not wait for the device).
        parts = (host, starts, packed_from, padded_from)
        flat = torch.cat(parts)
        device = torch.device(device)
        flat = flat.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else flat.to(device)
        lengths_, starts_, packed_from_, padded_from_ = flat.split([len(p) for p in parts])
        mask = torch.arange(num_frames, device=device)[None, :] < lengths_[:, None]
        return cls(lengths=lengths_, starts=starts_, mask=mask, num_frames=num_frames,
                   packed_from=packed_from_, padded_from=padded_from_)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, C] -> [rows, C] (packed); the input itself when padded."""
        if self.packed_from is None:
            return x
        return x.reshape(-1, x.shape[-1]).index_select(0, self.packed_from)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, C] -> [B, T, C] (packed); the input itself when padded."""
        if self.padded_from is None:
            return x
        return x.index_select(0, self.padded_from).view(self.mask.shape[0], self.num_frames, x.shape[-1])
