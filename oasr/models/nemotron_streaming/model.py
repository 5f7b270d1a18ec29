"""Nemotron ASR streaming RNN-T (transformers' ``NemotronAsrStreamingForRNNT``), served whole-file.

Key layout as Parakeet RNN-T's (``encoder.*``, ``encoder_projector``, ``decoder.{embedding,lstm,
decoder_projector}``, ``joint.head``); only the encoder differs (``oasr.models.nemotron_streaming.encoder``), so
the prediction network, joint and the transducer strategies' methods are Parakeet's. Its frontend is NeMo's
log-mel without per-feature normalisation (``nemotron_logmel``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch

from oasr.models import ARCHITECTURES
from oasr.models.capabilities import ModelCapabilities
from oasr.models.fastconformer.transducer import ParakeetForRNNT
from oasr.models.nemotron_streaming.config import NemotronAsrStreamingConfig, tiny_config
from oasr.models.nemotron_streaming.encoder import NemotronAsrStreamingEncoder
from oasr.models.nemotron_streaming.stream import stream_geometry, stream_step
from oasr.streaming.geometry import StreamGeometry


@ARCHITECTURES.register("nemotron_asr_streaming")
class NemotronAsrStreamingForRNNT(ParakeetForRNNT):
    config_class: ClassVar[type] = NemotronAsrStreamingConfig
    feature_extractor = "nemotron_logmel"
    # Whole files through the frame-synchronous runner; streams through the "cache_aware" streaming runtime
    # (oasr.streaming.cache_aware), which calls the stream_* methods below.
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("transducer_greedy",),
                                     streaming="cache_aware")

    encoder_class = NemotronAsrStreamingEncoder

    @staticmethod
    def tiny_config() -> NemotronAsrStreamingConfig:
        return tiny_config()

    @property
    def default_lookahead(self) -> int:
        """The lookahead (encoder frames) streams get when they ask for none: the checkpoint's own."""
        return self.config.encoder_config.default_num_lookahead_tokens

    def stream_geometry(self, lookahead: int, frame_seconds: float) -> StreamGeometry:
        geometry = stream_geometry(self.encoder, lookahead, frame_seconds)
        return replace(geometry, state=geometry.state + self.predictor_fields())

    def stream_encode(self, features: torch.Tensor, state: dict[str, torch.Tensor], first: torch.Tensor,
                      past_valid: torch.Tensor, geometry: StreamGeometry,
                      real: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """One chunk per row (``oasr.models.nemotron_streaming.stream.stream_step``)."""
        return stream_step(self.encoder, features, state, first, past_valid, geometry, real)
