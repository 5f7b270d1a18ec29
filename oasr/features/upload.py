"""Audio of many lengths -> one zero-padded float32 batch on the device the features are computed on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def pad_to_device(
    audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str, *, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D inputs -> (float32 [B, width] zero-padded on ``device``, samples [B] int64 on ``device``).

    ``width``: cut every input to this many samples and pad to it; None pads to the longest input.
    On CUDA all samples travel in one copy from pinned memory and are placed row by row on the device. A copy per
    input from pageable memory would wait for the stream before each one and stage every byte through the
    driver's own buffer.
    """
    if not audio:
        raise ValueError("no audio to featurize")
    rows = [torch.as_tensor(samples, dtype=torch.float32).reshape(-1) for samples in audio]
    if width is not None:
        rows = [row[:width] for row in rows]
    lengths = [row.shape[0] for row in rows]
    width = max(lengths) if width is None else width
    device = torch.device(device)
    if device.type == "cuda":
        host = torch.empty(sum(lengths), dtype=torch.float32, pin_memory=True)
        torch.cat(rows, out=host)
        flat = host.to(device, non_blocking=True)  # the pinned block is not reused before this copy is done
    else:
        flat = torch.cat(rows).to(device)
    batch = torch.zeros(len(rows), width, dtype=torch.float32, device=device)
    offset = 0
    for i, length in enumerate(lengths):
        batch[i, :length] = flat[offset : offset + length]
        offset += length
    return batch, torch.tensor(lengths, dtype=torch.long).to(device, non_blocking=True)
