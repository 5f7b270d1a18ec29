"""Nemotron ASR streaming RNN-T (transformers' ``NemotronAsrStreamingForRNNT``), served whole-file.

Key layout as Parakeet RNN-T's (``encoder.*``, ``encoder_projector``, ``decoder.{embedding,lstm,
decoder_projector}``, ``joint.head``); only the encoder differs (``oasr.models.nemotron_streaming.encoder``), so
the prediction network, joint and the transducer strategies' methods are Parakeet's. Its frontend is NeMo's
log-mel without per-feature normalisation (``nemotron_logmel``).
"""

from __future__ import annotations

from typing import ClassVar

from oasr.models import ARCHITECTURES
from oasr.models.capabilities import ModelCapabilities
from oasr.models.fastconformer.transducer import ParakeetForRNNT
from oasr.models.nemotron_streaming.config import NemotronAsrStreamingConfig, tiny_config
from oasr.models.nemotron_streaming.encoder import NemotronAsrStreamingEncoder


@ARCHITECTURES.register("nemotron_asr_streaming")
class NemotronAsrStreamingForRNNT(ParakeetForRNNT):
    config_class: ClassVar[type] = NemotronAsrStreamingConfig
    feature_extractor = "nemotron_logmel"
    # Whole files through the frame-synchronous runner; "cache_aware" names the streaming this checkpoint is
    # trained for (chunked-limited attention, causal convolutions). No streaming runtime serves it yet.
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("transducer_greedy",),
                                     streaming="cache_aware")

    encoder_class = NemotronAsrStreamingEncoder

    @staticmethod
    def tiny_config() -> NemotronAsrStreamingConfig:
        return tiny_config()
