"""SeACo-Paraformer (FunASR's ``SeacoParaformer``): a Paraformer whose decoder can be steered, per request, toward
a list of hotwords.

Without hotwords it decodes exactly as the Paraformer (``cif_greedy``). With a list, each phrase is spelled as
tokens (``oasr.models.seaco_paraformer.hotwords``), embedded by the main decoder's ``embed`` and run through the
LSTM ``bias_encoder``; its last step is the phrase's embedding, and a "no hotword" entry (``<s>`` alone) is
appended. The ``seaco_decoder`` attends from the token positions to those embeddings twice, once from the CIF
embeddings and once from the main decoder's last hidden states; ``hotword_output_layer`` scores the sum over the
vocabulary. A position whose best hotword-head class is ``NO_BIAS`` keeps the decoder's scores, any other takes
the hotword head's (FunASR's merge at the weight its inference uses, 1; ``model_conf.seaco_weight`` weighs a
training loss). Key names are FunASR's.

Hotwords reach the model through the ``cif_hotwords`` strategy: the runner groups rows by their hotword list, so
every row of one call shares one list and gets what it would alone. Word timestamps are not offered: the released
checkpoints time tokens with ``CifPredictorV3``'s upsampled weights, which OASR does not run (it reads that
predictor's token path, which is ``CifPredictorV2``'s, and reports the upsampling weights as dropped).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from oasr.errors import UnsupportedOptionError
from oasr.layers import LSTM, Linear
from oasr.models import ARCHITECTURES
from oasr.models.capabilities import ModelCapabilities
from oasr.models.paraformer.decoder import ParaformerDecoder
from oasr.models.paraformer.model import Paraformer
from oasr.models.seaco_paraformer.config import SeacoParaformerConfig, tiny_config
from oasr.models.seaco_paraformer.hotwords import check_hotwords
from oasr.types import DecodeOptions, Hotword

BIAS_ENCODER_LAYERS = 2  # FunASR builds the LSTM with two layers, whatever the config says


@ARCHITECTURES.register("seaco_paraformer")
class SeacoParaformer(Paraformer):
    config_class = SeacoParaformerConfig
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("cif_greedy", "cif_hotwords"),
                                     writes_punctuation=False)
    config: SeacoParaformerConfig

    def __init__(self, config: SeacoParaformerConfig) -> None:
        super().__init__(config)
        size = config.inner_dim
        self.bias_encoder = LSTM(size, size, num_layers=BIAS_ENCODER_LAYERS, batch_first=True)
        self.seaco_decoder = ParaformerDecoder(config.seaco_decoder, size, config.vocab_size, embed=False,
                                               output_layer=False)
        self.hotword_output_layer = Linear(size, config.vocab_size)

    @classmethod
    def from_config(cls, config: SeacoParaformerConfig) -> SeacoParaformer:
        return cls(config)

    @staticmethod
    def tiny_config() -> SeacoParaformerConfig:
        return tiny_config()

    def prompt_id(self, options: DecodeOptions) -> None:
        """No prompt; refuses here (the runner's option check) what the hotword path cannot serve (a beam wider
        than 1 is refused by the capability check: its strategy's ``widest_beam``)."""
        if options.hotwords:
            if self.config.hotword_spelling is None:
                raise UnsupportedOptionError("this SeACo-Paraformer was built without a token list: it cannot "
                                             "spell hotwords")
            check_hotwords(options.hotwords, "SeACo-Paraformer")
        return None

    def hotword_ids(self, hotwords: Sequence[Hotword]) -> list[list[int]]:
        """Each phrase's token ids, then FunASR's "no hotword" entry ``[<s>]``."""
        spelling = self.config.hotword_spelling
        if spelling is None:
            raise ValueError("this model has no hotword spelling (see prompt_id)")
        return [*(spelling.spell(h.phrase) for h in hotwords), [self.config.sos]]

    def hotword_embeddings(self, ids: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
        """Token ids of N hotwords -> their embeddings [N, inner_dim]: the bias encoder's output at each one's
        last token (the LSTM runs forward only, so padding after a hotword does not reach it)."""
        lengths = torch.tensor([len(i) for i in ids], device=device)
        padded = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long, device=device)
        for row, tokens in enumerate(ids):
            padded[row, : len(tokens)] = torch.tensor(tokens, device=device)
        hidden, _ = self.bias_encoder(self.decoder.embed(padded))
        return hidden[torch.arange(len(ids), device=device), lengths - 1]

    def cif_logits_biased(self, hidden: torch.Tensor, lengths: torch.Tensor, hotwords: Sequence[Hotword]
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """``cif_logits`` steered by one hotword list that every row shares: hidden [B, T, D], lengths [B] ->
        (log-probabilities [B, L, vocab], token counts [B])."""
        cif = self.predict(hidden, lengths)
        counts = cif.token_counts * (lengths > 0)
        if cif.embeds.shape[1] == 0:
            return hidden.new_zeros(hidden.shape[0], 0, self.config.vocab_size), counts
        embeds = cif.embeds.to(hidden.dtype)
        states = self.decoder.hidden(embeds, counts, hidden, lengths.clamp(min=1))
        decoded = torch.log_softmax(self.decoder.output_layer(states), dim=-1)
        memory = self.hotword_embeddings(self.hotword_ids(hotwords), hidden.device).to(hidden.dtype)
        memory = memory[None].expand(hidden.shape[0], -1, -1)
        num_hotwords = torch.full_like(counts, memory.shape[1])
        attended = (self.seaco_decoder.hidden(embeds, counts, memory, num_hotwords)
                    + self.seaco_decoder.hidden(states, counts, memory, num_hotwords))
        biased = torch.log_softmax(self.hotword_output_layer(attended), dim=-1)
        unbiased = biased.argmax(dim=-1, keepdim=True) == self.config.no_bias_id
        return torch.where(unbiased, decoded, biased), counts
