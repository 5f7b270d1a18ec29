"""CTC greedy decoding: best label per frame, repeats collapsed, blanks dropped; whole batch, one host read.

Model contract (architectures listing it in their capabilities): ``ctc_log_probs(hidden [B, T, D]) -> [B, T, V]``
and ``blank_id``.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.pending import CopiedTokens


class CTCModel(Protocol):
    blank_id: int

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor: ...


def collapse_mask(labels: torch.Tensor, lengths: torch.Tensor, blank_id: int) -> torch.Tensor:
    """labels: [B, T] frame labels; lengths: [B] -> bool [B, T], True where a frame starts a new token.

    A label counts when it is not blank, differs from the previous frame's label, and lies inside the row.
    """
    previous = F.pad(labels[:, :-1], (1, 0), value=-1)
    inside = torch.arange(labels.shape[1], device=labels.device)[None, :] < lengths[:, None]
    return (labels != blank_id) & (labels != previous) & inside


def launch_greedy(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int) -> CopiedTokens:
    """log_probs: [B, T, V]; lengths: [B] -> token ids per row, on their way to the host."""
    labels = log_probs.argmax(dim=-1)
    keep = collapse_mask(labels, lengths.to(labels.device), blank_id)
    return CopiedTokens((labels.int(), keep), _kept_labels)


def _kept_labels(labels: torch.Tensor, keep: torch.Tensor) -> list[list[int]]:
    return [row[mask].tolist() for row, mask in zip(labels, keep, strict=True)]


def greedy_ids(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int) -> list[list[int]]:
    """log_probs: [B, T, V]; lengths: [B] -> token ids per row."""
    return launch_greedy(log_probs, lengths, blank_id).wait()


@DECODE_STRATEGIES.register("ctc_greedy")
class CTCGreedy(DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = False  # serves DecodeOptions.beam_size

    def decode(self, model: CTCModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> token ids per row (no blanks, repeats merged)."""
        return self.launch(model, encoder_output).wait()

    def launch(self, model: CTCModel, encoder_output: EncoderOutput) -> CopiedTokens:
        """``decode`` with the result still on its way to the host."""
        log_probs = model.ctc_log_probs(encoder_output.hidden)
        return launch_greedy(log_probs, encoder_output.lengths, model.blank_id)
