"""FunASR's ``Conformer`` (``model: Conformer`` in its ``config.yaml``): a Conformer encoder with a CTC head and a
Transformer attention decoder, decoded in two passes as WeNet's U2++ does (``consumes="both"`` in the seeds).

The first pass is CTC: greedy by default, and for requests with ``beam_size`` a CTC prefix beam search whose n-best
the attention decoder rescores (``oasr.decode.attention_rescoring``). The decoder never generates; it only scores
the hypotheses the CTC pass proposes (``rescore``). Served by the frame-synchronous runner: both passes run inside
the encode walk. FunASR's own inference decodes this model by a joint CTC/attention beam search instead; OASR
keeps the two-pass form, whose per-hypothesis decoder scores are the same numbers (tests/test_funasr_rescore.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import Linear
from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.frame_sync import FrameSyncModel
from oasr.models.funasr_conformer.config import FunasrConformerConfig, tiny_config
from oasr.models.funasr_conformer.decoder import TransformerDecoder
from oasr.models.funasr_conformer.encoder import ConformerEncoder


class CTCHead(nn.Module):
    """FunASR's ``CTC`` module: ``ctc_lo`` projects each frame onto the vocabulary."""

    def __init__(self, size: int, vocab_size: int) -> None:
        super().__init__()
        self.ctc_lo = Linear(size, vocab_size)


@ARCHITECTURES.register("funasr_conformer")
class FunasrConformer(FrameSyncModel):
    config_class = FunasrConformerConfig
    feature_extractor = "funasr_fbank"
    tokenizer = "funasr_tokens"
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("ctc_greedy", "ctc_attention_rescore"))
    tied_keys: ClassVar[dict[str, str]] = {}

    def __init__(self, config: FunasrConformerConfig) -> None:
        super().__init__()
        self.config = config
        size = config.encoder.output_size
        self.encoder = ConformerEncoder(config.encoder)
        self.decoder = TransformerDecoder(config.decoder, size, config.vocab_size)
        self.ctc = CTCHead(size, config.vocab_size)

    @classmethod
    def from_config(cls, config: FunasrConformerConfig) -> FunasrConformer:
        return cls(config)

    @staticmethod
    def tiny_config() -> FunasrConformerConfig:
        return tiny_config()

    @staticmethod
    def example_inputs(config: FunasrConformerConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """(fbank frames [B, T, input_size], lengths [B]) for ``forward``."""
        frames = 40
        return torch.randn(batch_size, frames, config.encoder.input_size), torch.tensor([frames, frames - 9][:batch_size])

    @property
    def blank_id(self) -> int:
        return self.config.blank_id

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, T, input_size] fbank frames; lengths: [B] -> EncoderOutput ([B, T/4, D], lengths)."""
        hidden, lengths = self.encoder(features.to(self.encoder.after_norm.weight.dtype), lengths)
        return EncoderOutput(hidden, lengths)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, T, D] -> log-probabilities [B, T, vocab] (float32)."""
        return F.log_softmax(self.ctc.ctc_lo(hidden).float(), dim=-1)

    def rescore(self, encoder_output: EncoderOutput, hypotheses: Sequence[Sequence[Sequence[int]]]) -> torch.Tensor:
        """The attention decoder's log-probability of each hypothesis, ``</s>`` included.

        encoder_output: hidden [B, T, D], lengths [B]; hypotheses: per row, K token-id lists (without ``<s>`` or
        ``</s>``; the same K for every row) -> scores [B, K] float32, on the encoder's device.
        """
        num_rows = encoder_output.hidden.shape[0]
        if len(hypotheses) != num_rows or len({len(row) for row in hypotheses}) > 1:
            raise ValueError(f"rescore takes the same number of hypotheses for each of the {num_rows} rows, got "
                             f"{[len(row) for row in hypotheses]}")
        k = len(hypotheses[0]) if hypotheses else 0
        if k == 0:
            return encoder_output.hidden.new_zeros(num_rows, 0, dtype=torch.float32)
        rows = torch.arange(num_rows, device=encoder_output.hidden.device).repeat_interleave(k)
        flat = [h for row in hypotheses for h in row]
        scores = self.decoder.score(encoder_output.hidden.index_select(0, rows),
                                    encoder_output.lengths.index_select(0, rows), flat,
                                    self.config.sos, self.config.eos)
        return scores.view(num_rows, k)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.ctc_log_probs(self.encode(features, lengths).hidden)
