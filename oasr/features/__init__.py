"""Feature-extractor registry: raw 16 kHz audio -> model input features, batched, on CPU or GPU."""

from __future__ import annotations

from oasr.registry import Registry

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
)

__all__ = ["FEATURE_EXTRACTORS"]
