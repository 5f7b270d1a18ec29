"""Paraformer (FunASR): SANM encoder, CIF predictor, one non-autoregressive SANM decoder pass.

Served by the frame-synchronous runner: the whole decode happens in the encode walk (``cif_greedy``), batched.
Token timestamps come from the CIF fire positions, through the ``cif`` word aligner
(``oasr.models.paraformer.alignment``). Key layout: FunASR's ``model.pt`` (``encoder.*``, ``predictor.*``,
``decoder.*``), read by the ``funasr`` converter.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.frame_sync import FrameSyncModel
from oasr.models.paraformer.cif import CifOutput, CifPredictor
from oasr.models.paraformer.config import ParaformerConfig, tiny_config
from oasr.models.paraformer.decoder import ParaformerDecoder
from oasr.models.paraformer.sanm import SANMEncoder


@ARCHITECTURES.register("paraformer")
class Paraformer(FrameSyncModel):
    config_class = ParaformerConfig
    feature_extractor = "funasr_fbank"
    tokenizer = "funasr_tokens"
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("cif_greedy",), word_timing=True,
                                     aligner="cif", writes_punctuation=False)
    tied_keys: ClassVar[dict[str, str]] = {}

    def __init__(self, config: ParaformerConfig) -> None:
        super().__init__()
        self.config = config
        e = config.encoder
        self.encoder = SANMEncoder(e.input_size, e.output_size, e.attention_heads, e.linear_units, e.num_blocks,
                                   e.kernel_size, e.sanm_shfit)
        self.predictor = CifPredictor(config.predictor)
        self.decoder = ParaformerDecoder(config.decoder, e.output_size, config.vocab_size)

    @classmethod
    def from_config(cls, config: ParaformerConfig) -> Paraformer:
        return cls(config)

    @staticmethod
    def tiny_config() -> ParaformerConfig:
        return tiny_config()

    @staticmethod
    def example_inputs(config: ParaformerConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [B, T, input_size], lengths [B]) for ``forward``."""
        frames = 20
        return torch.randn(batch_size, frames, config.encoder.input_size), torch.tensor([frames, frames - 5][:batch_size])

    @property
    def dropped_ids(self) -> tuple[int, ...]:
        return (self.config.blank_id, self.config.sos, self.config.eos)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, T, input_size] LFR frames; lengths: [B] -> EncoderOutput ([B, T, D], [B])."""
        dtype = self.encoder.after_norm.weight.dtype
        lengths = lengths.to(features.device)
        # A row with no frames (under 25 ms of audio) still attends to one, so that no softmax is empty; the
        # decode drops it (its lengths stay 0).
        hidden = self.encoder(self.encoder.embed(features.to(dtype)), lengths.clamp(min=1))
        return EncoderOutput(hidden, lengths)

    def predict(self, hidden: torch.Tensor, lengths: torch.Tensor) -> CifOutput:
        """The CIF predictor over encoder frames [B, T, D] with their lengths [B]."""
        return self.predictor(hidden, lengths)

    def cif_logits(self, hidden: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: [B, T, D]; lengths: [B] -> (logits [B, L, vocab], token counts [B]) (``cif_greedy``)."""
        cif = self.predict(hidden, lengths)
        counts = cif.token_counts * (lengths > 0)
        if cif.embeds.shape[1] == 0:
            return hidden.new_zeros(hidden.shape[0], 0, self.config.vocab_size), counts
        logits = self.decoder(cif.embeds.to(hidden.dtype), counts, hidden, lengths.clamp(min=1))
        return logits, counts

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Decoder logits [B, L, vocab] for a padded batch (tests)."""
        encoded = self.encode(features, lengths)
        return self.cif_logits(encoded.hidden, encoded.lengths)[0]
