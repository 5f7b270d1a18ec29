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
    On CUDA, inputs already in pinned memory are copied straight into their rows; the others travel together in
    one copy from a pinned buffer and are placed row by row on the device. (A copy per input from pageable memory
    would wait for the stream before each one and stage every byte through the driver's own buffer.)
    """
    if not audio:
        raise ValueError("no audio to featurize")
    rows = [torch.as_tensor(samples, dtype=torch.float32).reshape(-1) for samples in audio]
    if width is not None:
        rows = [row[:width] for row in rows]
    lengths = [row.shape[0] for row in rows]
    width = max(lengths) if width is None else width
    device = torch.device(device)
    batch = torch.zeros(len(rows), width, dtype=torch.float32, device=device)
    # Inputs already in pinned memory (staged by the engine) go straight into their rows.
    staged = [row.is_pinned() for row in rows] if device.type == "cuda" else [False] * len(rows)
    for i, row in enumerate(rows):
        if staged[i]:
            batch[i, : lengths[i]].copy_(row, non_blocking=True)
    rest = [i for i in range(len(rows)) if not staged[i]]
    if rest:
        if device.type == "cuda":
            host = torch.empty(sum(lengths[i] for i in rest), dtype=torch.float32, pin_memory=True)
            torch.cat([rows[i] for i in rest], out=host)
            flat = host.to(device, non_blocking=True)  # the pinned block is not reused before this copy is done
        else:
            flat = torch.cat([rows[i] for i in rest]).to(device)
        offset = 0
        for i in rest:
            batch[i, : lengths[i]] = flat[offset : offset + lengths[i]]
            offset += lengths[i]
    return batch, torch.tensor(lengths, dtype=torch.long).to(device, non_blocking=True)
