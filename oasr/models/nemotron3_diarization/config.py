"""Nemotron 3 Diarization configuration. Field names follow transformers' ``Nemotron3DiarizationConfig`` and its
``audio_config`` / ``head_config`` / ``streaming_config``, so a ``config.json`` written by ``save_pretrained``
loads as is; training-only fields (initializer range, dropout) and transformers' bookkeeping are read past.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# The processor's latency modes: name -> (chunk frames, look-ahead frames), in encoder frames (80 ms each).
DEFAULT_STREAMING_MODES: dict[str, tuple[int, int]] = {
    "low_latency": (9, 4),
    "very_low_latency": (6, 2),
    "ultra_low_latency": (3, 1),
}


def _known(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names and v is not None}


@dataclass(frozen=True)
class DiarizationAudioConfig:
    """The transformer encoder: stacked mel frames, pre-norm layers with rotary positions."""

    hidden_size: int = 512
    intermediate_size: int = 2048
    num_hidden_layers: int = 31
    num_attention_heads: int = 8
    num_key_value_heads: int | None = None  # None: as many as the query heads
    hidden_act: str = "gelu"
    num_mel_bins: int = 128
    subsampling_factor: int = 8  # mel frames stacked into one encoder frame
    rope_theta: float = 10_000.0
    partial_rotary_factor: float = 1.0  # share of each head's dimensions that rotate

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must divide evenly into attention heads")
        # transformers' value projection has num_attention_heads heads whatever num_key_value_heads says, so
        # only the plain layout is a checkpoint that reference runs.
        if self.kv_heads != self.num_attention_heads:
            raise ValueError(f"num_key_value_heads {self.kv_heads} != num_attention_heads "
                             f"{self.num_attention_heads} is not served")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives no even rotary width")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DiarizationAudioConfig:
        values = dict(values)
        rope = values.pop("rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope['rope_type']!r} is not served (only 'default')")
        for key in ("rope_theta", "partial_rotary_factor"):
            if key in rope:
                values[key] = rope[key]
        return cls(**_known(cls, values))


@dataclass(frozen=True)
class DiarizationHeadConfig:
    """The speaker head: a projection, a sub-pixel upsampler back to the mel frame rate, a two-layer classifier."""

    hidden_size: int = 192
    num_speakers: int = 8
    audio_hidden_size: int = 512
    subsampling_factor: int = 8

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DiarizationHeadConfig:
        return cls(**_known(cls, values))


@dataclass(frozen=True)
class SpeakerCacheConfig:
    """transformers' ``streaming_config``: the arrival-order speaker cache's policy, and the FIFO of streams."""

    fifo_length: int = 264  # streams' FIFO of recent encoder frames (offline uses the top-level field)
    speaker_cache_update_period: int = 222  # frames moved from a full FIFO to the cache, at least
    speaker_cache_length: int = 264
    speaker_cache_silence_frames_per_speaker: int = 1
    prediction_score_threshold: float = 0.25  # probabilities are clamped at it before their log
    latest_frames_score_boost: float = 0.05
    strong_boost_rate: float = 0.75
    weak_boost_rate: float = 1.5
    min_positive_scores_rate: float = 0.5
    num_speakers: int = 8
    subsampling_factor: int = 8

    def __post_init__(self) -> None:
        least = (1 + self.speaker_cache_silence_frames_per_speaker) * self.num_speakers
        if self.speaker_cache_length < least:
            raise ValueError(f"speaker_cache_length {self.speaker_cache_length} is under (1 + silence frames) * "
                             f"speakers = {least}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SpeakerCacheConfig:
        return cls(**_known(cls, values))


@dataclass(frozen=True)
class Nemotron3DiarizationConfig:
    audio_config: DiarizationAudioConfig = field(default_factory=DiarizationAudioConfig)
    head_config: DiarizationHeadConfig = field(default_factory=DiarizationHeadConfig)
    streaming_config: SpeakerCacheConfig = field(default_factory=SpeakerCacheConfig)
    # Offline: a whole file is cut into chunks of chunk_length encoder frames, each reading chunk_left_context
    # frames before it and chunk_right_context after it, with a FIFO of fifo_length frames.
    chunk_length: int = 340
    chunk_right_context: int = 40
    chunk_left_context: int = 0
    fifo_length: int = 40
    speaker_cache_update_period: int = 300
    # The processor's streaming latency modes (processor_config.json, read by the converter).
    streaming_modes: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(DEFAULT_STREAMING_MODES))
    default_streaming_mode: str = "low_latency"

    def __post_init__(self) -> None:
        if not 0 <= self.chunk_right_context < self.chunk_length or self.chunk_left_context < 0:
            raise ValueError(f"chunk_right_context {self.chunk_right_context} must lie in [0, chunk_length "
                             f"{self.chunk_length}) and chunk_left_context {self.chunk_left_context} be >= 0")
        audio, head, cache = self.audio_config, self.head_config, self.streaming_config
        if head.audio_hidden_size != audio.hidden_size:
            raise ValueError(f"head_config.audio_hidden_size {head.audio_hidden_size} != audio hidden_size "
                             f"{audio.hidden_size}")
        if not head.subsampling_factor == cache.subsampling_factor == audio.subsampling_factor:
            raise ValueError("the audio, head and streaming configs disagree on subsampling_factor")
        if cache.num_speakers != head.num_speakers:
            raise ValueError(f"streaming_config.num_speakers {cache.num_speakers} != head_config.num_speakers "
                             f"{head.num_speakers}")
        if self.default_streaming_mode not in self.streaming_modes:
            raise ValueError(f"default streaming mode {self.default_streaming_mode!r} is not among "
                             f"{list(self.streaming_modes)}")

    @property
    def num_speakers(self) -> int:
        return self.head_config.num_speakers

    @property
    def num_mel_bins(self) -> int:
        return self.audio_config.num_mel_bins

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Nemotron3DiarizationConfig:
        kwargs = _known(cls, values)
        kwargs["audio_config"] = DiarizationAudioConfig.from_dict(values.get("audio_config") or {})
        kwargs["head_config"] = DiarizationHeadConfig.from_dict(values.get("head_config") or {})
        kwargs["streaming_config"] = SpeakerCacheConfig.from_dict(values.get("streaming_config") or {})
        if "streaming_modes" in kwargs:  # JSON gives lists
            kwargs["streaming_modes"] = {k: (int(v[0]), int(v[1])) for k, v in kwargs["streaming_modes"].items()}
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        audio = values["audio_config"]
        audio["rope_parameters"] = {"rope_type": "default", "rope_theta": audio.pop("rope_theta"),
                                    "partial_rotary_factor": audio.pop("partial_rotary_factor")}
        return {"model_type": "nemotron3_diarization", **values}


def tiny_config() -> Nemotron3DiarizationConfig:
    """A few-thousand-parameter model whose offline chunks, FIFO and speaker cache all turn over within a few
    seconds of audio, so tests reach cache compression on short mixtures."""
    return Nemotron3DiarizationConfig(
        audio_config=DiarizationAudioConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_mel_bins=16),
        head_config=DiarizationHeadConfig(hidden_size=24, num_speakers=4, audio_hidden_size=32),
        streaming_config=SpeakerCacheConfig(fifo_length=12, speaker_cache_update_period=8, speaker_cache_length=16,
                                            num_speakers=4),
        chunk_length=12, chunk_right_context=3, chunk_left_context=2, fifo_length=10, speaker_cache_update_period=6,
    )
