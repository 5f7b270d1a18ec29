"""Feature-extractor registry: raw 16 kHz audio -> model input features, batched, on CPU or GPU."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from oasr.registry import Registry

if TYPE_CHECKING:  # annotations only
    import numpy as np
    import torch


@runtime_checkable
class FeatureExtractor(Protocol):
    """What every registered extractor provides: the loader builds it with ``for_model``; the runners read
    ``frame_lengths`` and ``padded`` (its ``__call__`` differs by family: some also return the frame counts)."""

    @classmethod
    def for_model(cls, config: object) -> FeatureExtractor:
        """The extractor a checkpoint's config asks for."""

    def frame_lengths(self, num_samples: torch.Tensor) -> torch.Tensor:
        """Feature frames [B] that ``num_samples`` [B] samples of audio give."""

    def padded(self, audio: Sequence[np.ndarray | torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
        """Features of a batch, each right-padded to the longest (or to the model's window): [B, n_mels, frames]."""


FEATURE_EXTRACTORS: Registry[type] = Registry(
    "feature extractor",
    lazy={
        "whisper_logmel": "oasr.features.whisper_logmel",
        "nemo_logmel": "oasr.features.nemo_logmel",
        "nemotron_logmel": "oasr.features.nemo_logmel",
        "aed_logmel": "oasr.features.aed_logmel",
        "qwen3_logmel": "oasr.features.qwen3_logmel",
        "funasr_fbank": "oasr.features.funasr_fbank",
        "chunked_whisper_logmel": "oasr.features.chunked_logmel",
        "masked_whisper_logmel": "oasr.features.chunked_logmel",
        "granite_logmel": "oasr.features.granite_logmel",
    },
    contract=FeatureExtractor,
)

__all__ = ["FEATURE_EXTRACTORS", "FeatureExtractor"]
