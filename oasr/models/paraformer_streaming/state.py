"""What one streaming Paraformer stream carries from one step to the next (its own module: the model's steps and
the stream driver both read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StreamState:
    """One stream's carried tensors (batch of one); ``None`` before the first step that sets them."""

    overlap: torch.Tensor | None = None  # [1, left + right, D_in] the previous step's last embedded frames
    position: int = 0  # frames embedded so far (the next chunk's first position)
    encoder_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)
    cif_hidden: torch.Tensor | None = None  # [1, 1, D]
    cif_alpha: torch.Tensor | None = None  # [1, 1]
    decoder_fsmn: list[torch.Tensor | None] = field(default_factory=list)  # [1, D, kernel - 1 + tokens]
    decoder_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = field(default_factory=list)

    def reset_decoder(self) -> None:
        """A new utterance: the decoder's memory of earlier tokens and frames goes."""
        self.decoder_fsmn, self.decoder_kv = [], []
