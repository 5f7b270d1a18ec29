"""Model architectures and checkpoint converters, each behind a registry.

An architecture class exposes ``config_class``, ``from_config(config)``, ``tiny_config()`` (the small random
configuration every test suite builds) and the decode-facing methods its family's strategies call.
A converter detects a checkpoint format on disk and returns a ``Checkpoint`` in the architecture's key layout.
"""

from __future__ import annotations

from oasr.registry import Registry

ARCHITECTURES: Registry[type] = Registry(
    "architecture",
    lazy={
        "whisper": "oasr.models.whisper.model",
        "parakeet_ctc": "oasr.models.fastconformer.model",
        "parakeet_rnnt": "oasr.models.fastconformer.transducer",
        "parakeet_tdt": "oasr.models.fastconformer.transducer",
        "nemotron_asr_streaming": "oasr.models.nemotron_streaming.model",
        "nemotron3_5_asr": "oasr.models.nemotron3_5.model",
        "canary": "oasr.models.canary.model",
        "cohere_asr": "oasr.models.canary.model",
        "qwen3_asr": "oasr.models.qwen3_asr.model",
        "paraformer": "oasr.models.paraformer.model",
        "paraformer_streaming": "oasr.models.paraformer_streaming.model",
        "seaco_paraformer": "oasr.models.seaco_paraformer.model",
        "sense_voice": "oasr.models.sense_voice.model",
        "funasr_conformer": "oasr.models.funasr_conformer.model",
        "voxtral": "oasr.models.voxtral.model",
        "qwen2_audio": "oasr.models.qwen2_audio.model",
        "granite_speech": "oasr.models.granite_speech.model",
    },
)

# Frame classifiers that say who speaks when (``oasr.diarization``): not ASR architectures, so kept apart from
# ARCHITECTURES and its capability records.
DIARIZATION_ARCHITECTURES: Registry[type] = Registry(
    "diarization architecture",
    lazy={"nemotron3_diarization": "oasr.models.nemotron3_diarization.model"},
)

CONVERTERS: Registry[type] = Registry(
    "checkpoint format",
    lazy={
        "native": "oasr.models.converters.native",
        "huggingface": "oasr.models.converters.huggingface",
        "ctranslate2": "oasr.models.converters.ctranslate2",
        "nemo": "oasr.models.converters.nemo",
        "funasr": "oasr.models.converters.funasr",
    },
)

__all__ = ["ARCHITECTURES", "CONVERTERS", "DIARIZATION_ARCHITECTURES"]
