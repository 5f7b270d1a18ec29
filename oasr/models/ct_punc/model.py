"""The CT-Transformer's network: a token embedding, FunASR's SANM encoder (``input_layer: pe``: the embeddings scaled
and a sinusoid added, the same layers as Paraformer's encoder) and a linear classifier giving one punctuation
class per token. Module names mirror the checkpoint's keys (``embed.weight``, ``encoder.encoders0.0...``,
``decoder.weight``), so ``model.pt`` loads as saved."""

from __future__ import annotations

import torch
from torch import nn

from oasr.layers import Embedding, Linear
from oasr.models.ct_punc.config import CTPuncConfig
from oasr.models.paraformer.sanm import SANMEncoder


class CTTransformer(nn.Module):
    def __init__(self, config: CTPuncConfig, vocab_size: int) -> None:
        super().__init__()
        encoder = config.encoder
        self.embed = Embedding(vocab_size, config.embed_unit)
        self.encoder = SANMEncoder(encoder.input_size, encoder.output_size, encoder.attention_heads,
                                   encoder.linear_units, encoder.num_blocks, encoder.kernel_size, encoder.sanm_shfit)
        self.decoder = Linear(config.att_unit, len(config.punc_list))

    def forward(self, token_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """token_ids: [B, T] (padded past each row's length); lengths: [B] -> class logits [B, T, num_marks]."""
        hidden = self.encoder(self.encoder.embed(self.embed(token_ids)), lengths)
        return self.decoder(hidden)
