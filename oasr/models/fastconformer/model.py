"""Parakeet CTC: the FastConformer encoder and a per-frame vocabulary projection (``ctc_head``).

Key layout of transformers' ``ParakeetForCTC``: ``encoder.*`` and ``ctc_head`` (a kernel-size-1 convolution,
kept as one so its [V, D, 1] weight loads as stored).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from oasr.layers import Conv1d
from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.fastconformer.config import ParakeetCTCConfig, tiny_ctc_config
from oasr.models.fastconformer.encoder import FastConformerEncoder, example_features
from oasr.models.frame_sync import FrameSyncModel


@ARCHITECTURES.register("parakeet_ctc")
class ParakeetForCTC(FrameSyncModel):
    config_class = ParakeetCTCConfig
    feature_extractor = "nemo_logmel"
    tokenizer = "parakeet_hf_json"
    # beam_size decodes by CTC prefix beam search (oasr.decode.ctc_prefix_beam), decoding_graph over a WFST
    # (oasr.decode.ctc_wfst).
    capabilities = ModelCapabilities(runner="frame_sync",
                                     decode_strategies=("ctc_greedy", "ctc_prefix_beam", "ctc_wfst"))
    tied_keys: ClassVar[dict[str, str]] = {}

    def __init__(self, config: ParakeetCTCConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = FastConformerEncoder(config.encoder_config)
        self.ctc_head = Conv1d(config.encoder_config.hidden_size, config.vocab_size, kernel_size=1)

    @classmethod
    def from_config(cls, config: ParakeetCTCConfig) -> ParakeetForCTC:
        return cls(config)

    @staticmethod
    def tiny_config() -> ParakeetCTCConfig:
        return tiny_ctc_config()

    @staticmethod
    def example_inputs(config: ParakeetCTCConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [B, n_mels, T], lengths [B]) for ``forward``: what a smoke test calls the model with."""
        return example_features(config.encoder_config, batch_size)

    @property
    def blank_id(self) -> int:
        return self.config.blank_id

    @property
    def ctc_columns(self) -> int:
        """Columns of ``ctc_log_probs`` (the blank included): what a decoding graph's input labels address."""
        return self.config.vocab_size

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, T]; lengths: [B] real feature frames -> EncoderOutput ([B, T', D], [B])."""
        return self.encoder(features.to(self.ctc_head.weight.dtype), lengths)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, T, D] -> log-probabilities [B, T, vocab_size] (float32; the blank included)."""
        # The kernel-size-1 convolution as the matrix multiply it is, on channel-last frames (no transposes).
        logits = F.linear(hidden, self.ctc_head.weight[:, :, 0], self.ctc_head.bias)
        return F.log_softmax(logits.float(), dim=-1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [B, T', vocab_size] for a padded batch (tests, scoring)."""
        return self.ctc_log_probs(self.encode(features, lengths).hidden)
