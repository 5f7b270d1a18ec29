"""SenseVoice-Small (FunASR): one encoder pass and a CTC head, with the request's language and ITN as queries.

Four embeddings are prepended to the LFR frames before the encoder: the language (a row per language, row 0
detects), the event and emotion queries (fixed rows) and the text normalisation (ITN on or off). The CTC head then
writes, at those four positions, the language, emotion and event it found and the ITN tag, followed by the text;
the tags are SentencePiece pieces ``<|en|>``, ``<|NEUTRAL|>``, ``<|Speech|>``, ``<|withitn|>``. OASR's text drops
them (the ``sentencepiece`` tokenizer drops ``<|...|>`` pieces); the token ids keep them.

Requests choose through ``DecodeOptions``: ``language`` (None or "auto" detects; zh, en, yue, ja, ko, nospeech
force) and ``punctuation`` (ITN: True, OASR's default, is ``withitn``; False ``woitn``), folded into one prompt id
(``prompt_id``) that ``encode_prompted`` turns into the queries.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from oasr.errors import UnsupportedOptionError
from oasr.layers import Embedding, LayerNorm, Linear
from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.frame_sync import FrameSyncModel
from oasr.models.paraformer.sanm import SANMEncoder, SANMEncoderLayer, frame_mask
from oasr.models.sense_voice.config import (
    EVENT_EMOTION_ROWS,
    ITN_ROWS,
    LANGUAGE_ROWS,
    NUM_QUERIES,
    NUM_QUERY_ROWS,
    SenseVoiceConfig,
    SenseVoiceEncoderConfig,
    tiny_config,
)

NORM_EPS = 1e-5  # SenseVoice's LayerNorm is torch's default


class SenseVoiceEncoder(SANMEncoder):
    """``SenseVoiceEncoderSmall``: the SANM encoder, then ``tp_encoders`` and ``tp_norm``."""

    def __init__(self, c: SenseVoiceEncoderConfig) -> None:
        super().__init__(c.input_size, c.output_size, c.attention_heads, c.linear_units, c.num_blocks,
                         c.kernel_size, c.sanm_shfit, norm_eps=NORM_EPS)
        self.tp_encoders = nn.ModuleList(
            SANMEncoderLayer(c.output_size, c.output_size, c.attention_heads, c.linear_units, c.kernel_size,
                             c.sanm_shfit, NORM_EPS) for _ in range(c.tp_blocks))
        self.tp_norm = LayerNorm(c.output_size, eps=NORM_EPS)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = super().forward(x, lengths)
        mask = frame_mask(lengths, x.shape[1])
        for layer in self.tp_encoders:
            x = layer(x, mask)
        return self.tp_norm(x)


class CTCHead(nn.Module):
    """FunASR's ``CTC`` module: ``ctc_lo`` projects each frame onto the vocabulary."""

    def __init__(self, size: int, vocab_size: int) -> None:
        super().__init__()
        self.ctc_lo = Linear(size, vocab_size)


@ARCHITECTURES.register("sense_voice")
class SenseVoiceSmall(FrameSyncModel):
    config_class = SenseVoiceConfig
    feature_extractor = "funasr_fbank"
    tokenizer = "sense_voice_bpe"
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("ctc_greedy", "ctc_prefix_beam"),
                                     options=frozenset({"language", "punctuation"}), audio_tags=True)
    tied_keys: ClassVar[dict[str, str]] = {}

    def __init__(self, config: SenseVoiceConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = Embedding(NUM_QUERY_ROWS, config.encoder.input_size)
        self.encoder = SenseVoiceEncoder(config.encoder)
        self.ctc = CTCHead(config.encoder.output_size, config.vocab_size)

    @classmethod
    def from_config(cls, config: SenseVoiceConfig) -> SenseVoiceSmall:
        return cls(config)

    @staticmethod
    def tiny_config() -> SenseVoiceConfig:
        return tiny_config()

    @staticmethod
    def example_inputs(config: SenseVoiceConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        frames = 20
        return torch.randn(batch_size, frames, config.encoder.input_size), torch.tensor([frames, frames - 5][:batch_size])

    @property
    def blank_id(self) -> int:
        return self.config.blank_id

    def prompt_id(self, options) -> int:
        """The request's (language, ITN) pair as one id: language row * 2 + ITN."""
        language = options.language or "auto"
        if language not in LANGUAGE_ROWS:
            raise UnsupportedOptionError(f"SenseVoice does not serve language {language!r} "
                                         f"(it serves {', '.join(LANGUAGE_ROWS)})")
        return LANGUAGE_ROWS[language] * 2 + int(bool(options.punctuation))

    def output_language(self, language: str | None, token_ids) -> str | None:
        """The first language tag the model wrote (``<|en|>`` -> "en"), else the language asked for."""
        languages = {self.config.tag_token_ids[f"<|{code}|>"]: code for code in LANGUAGE_ROWS
                     if code not in ("auto", "nospeech") and f"<|{code}|>" in self.config.tag_token_ids}
        return next((languages[t] for t in token_ids if t in languages), language)

    def queries(self, prompt_ids: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor:
        """prompt_ids: int64 [B] (None: auto language, ITN on) -> the four query embeddings [B, 4, input_size]."""
        if prompt_ids is None:
            prompt_ids = torch.full((batch,), LANGUAGE_ROWS["auto"] * 2 + 1, dtype=torch.long, device=device)
        itn = torch.where(prompt_ids % 2 == 1, ITN_ROWS[True], ITN_ROWS[False])
        fixed = torch.tensor(EVENT_EMOTION_ROWS, device=device).expand(batch, -1)
        rows = torch.cat([(prompt_ids // 2)[:, None], fixed, itn[:, None]], dim=1)
        return self.embed(rows)

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """Whole inputs with the default prompt (auto language, ITN on)."""
        return self.encode_prompted(features, lengths, None)

    def encode_prompted(self, features: torch.Tensor, lengths: torch.Tensor,
                        prompt_ids: torch.Tensor | None) -> EncoderOutput:
        """features: [B, T, input_size] LFR frames; lengths: [B]; prompt_ids: [B] or None -> EncoderOutput
        ([B, 4 + T, D], lengths + 4): the query frames first, as FunASR runs them."""
        dtype = self.embed.weight.dtype
        lengths = lengths.to(features.device) + NUM_QUERIES
        queries = self.queries(prompt_ids, features.shape[0], features.device).to(dtype)
        x = torch.cat([queries, features.to(dtype)], dim=1)
        return EncoderOutput(self.encoder(self.encoder.embed(x), lengths), lengths)

    def ctc_log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, T, D] -> log-probabilities [B, T, vocab] (float32)."""
        return F.log_softmax(self.ctc.ctc_lo(hidden).float(), dim=-1)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.ctc_log_probs(self.encode(features, lengths).hidden)
