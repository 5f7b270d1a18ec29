"""Qwen3-ASR configuration, field for field as transformers' ``Qwen3ASRConfig`` writes ``config.json``: the audio
encoder under ``audio_config`` (``Qwen3ASREncoderConfig``), the language model under ``text_config`` (``Qwen3Config``),
and the id of ``<|audio_pad|>`` (``audio_token_id``) at the top level. Fields a config.json leaves out take
transformers' defaults (the 1.7B checkpoint's, from ``Qwen3ASRConfig.sub_configs_defaults``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.models.fastconformer.config import _known_fields


@dataclass(frozen=True)
class Qwen3AudioEncoderConfig:
    num_mel_bins: int = 128
    d_model: int = 1024
    encoder_layers: int = 24
    encoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    activation_function: str = "gelu"
    downsample_hidden_size: int = 480  # channels of the three stride-2 convolutions
    output_dim: int = 3584  # the projector's output: the language model's width
    n_window: int = 50  # half a chunk: each chunk is 2 * n_window mel frames (1 s)
    n_window_infer: int = 800  # mel frames one attention window spans (8 s); a whole number of chunks
    max_position_embeddings: int = 13  # positions per chunk (the sinusoid restarts in every chunk)

    def __post_init__(self) -> None:
        if self.n_window_infer % (2 * self.n_window):
            raise ValueError(f"n_window_infer {self.n_window_infer} must be a multiple of 2 * n_window "
                             f"({2 * self.n_window}): attention windows hold whole chunks")
        if self.d_model % self.encoder_attention_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by {self.encoder_attention_heads} heads")

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def conv_frequencies(self) -> int:
        """Mel bins left after the three stride-2 convolutions."""
        bins = self.num_mel_bins
        for _ in range(3):
            bins = (bins - 1) // 2 + 1
        return bins

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen3AudioEncoderConfig:
        return cls(**_known_fields(cls, values))


@dataclass(frozen=True)
class Qwen3TextConfig:
    vocab_size: int = 151_936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 65_536
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    attention_bias: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.num_attention_heads} heads cannot share {self.num_key_value_heads} key/value "
                             "heads evenly")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen3TextConfig:
        """transformers 5 keeps the rotary settings in ``rope_parameters``, earlier versions ``rope_theta`` at the
        top level. Only the default rotation is served; an ``mrope_section`` is accepted and ignored, since its
        three position streams are equal for audio and text (it reduces to plain 1-D rotary positions)."""
        rope = values.get("rope_parameters") or values.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise ValueError(f"rotary embeddings of type {rope_type!r} are not supported (only 'default')")
        if values.get("use_sliding_window"):
            raise ValueError("sliding-window attention (use_sliding_window) is not supported")
        kwargs = _known_fields(cls, values)
        theta = rope.get("rope_theta", values.get("rope_theta"))
        if theta is not None:
            kwargs["rope_theta"] = float(theta)
        if kwargs.get("head_dim") is None:
            hidden = kwargs.get("hidden_size", cls.hidden_size)
            kwargs["head_dim"] = hidden // kwargs.get("num_attention_heads", cls.num_attention_heads)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["rope_parameters"] = {"rope_theta": values.pop("rope_theta"), "rope_type": "default"}
        return {**values, "model_type": "qwen3"}


# transformers' defaults for the 1.7B language model (``Qwen3ASRConfig.sub_configs_defaults``).
_TEXT_DEFAULTS = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=65_536, tie_word_embeddings=True)


@dataclass(frozen=True)
class Qwen3ASRConfig:
    audio_config: Qwen3AudioEncoderConfig = dataclasses.field(default_factory=Qwen3AudioEncoderConfig)
    text_config: Qwen3TextConfig = dataclasses.field(default_factory=lambda: Qwen3TextConfig(**_TEXT_DEFAULTS))
    audio_token_id: int = 151_676  # <|audio_pad|>: the prompt positions the audio embeddings take
    pad_token_id: int | None = 151_645
    eos_token_id: tuple[int, ...] = (151_643, 151_645)

    def __post_init__(self) -> None:
        if self.audio_config.output_dim != self.text_config.hidden_size:
            raise ValueError(f"the projector gives {self.audio_config.output_dim}-wide audio embeddings, the "
                             f"language model takes {self.text_config.hidden_size}")

    @property
    def num_mel_bins(self) -> int:
        return self.audio_config.num_mel_bins

    @property
    def chunk_frames(self) -> int:
        return self.audio_config.chunk_frames

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Qwen3ASRConfig:
        audio = Qwen3AudioEncoderConfig.from_dict(values.get("audio_config") or {})
        text_values = {**_TEXT_DEFAULTS, **(values.get("text_config") or {})}
        if "tie_word_embeddings" in values and "tie_word_embeddings" not in (values.get("text_config") or {}):
            text_values["tie_word_embeddings"] = values["tie_word_embeddings"]
        kwargs = _known_fields(cls, values)
        eos = kwargs.get("eos_token_id", cls.eos_token_id)
        kwargs["eos_token_id"] = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(audio_config=audio, text_config=Qwen3TextConfig.from_dict(text_values), **{
            k: v for k, v in kwargs.items() if k not in ("audio_config", "text_config")})

    def to_dict(self) -> dict[str, Any]:
        return {
            "audio_config": {**dataclasses.asdict(self.audio_config), "model_type": "qwen3_asr_encoder"},
            "text_config": self.text_config.to_dict(),
            "audio_token_id": self.audio_token_id,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": list(self.eos_token_id),
            "tie_word_embeddings": self.text_config.tie_word_embeddings,
            "model_type": "qwen3_asr",
        }


def tiny_qwen3_asr_config() -> Qwen3ASRConfig:
    """A few-thousand-parameter model with every module of the real one: grouped key/value heads (4 over 2), two
    chunks per attention window, 16 mels, and a vocabulary of 272 ids (256 bytes, the prompt's specials and a
    few merges)."""
    audio = Qwen3AudioEncoderConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=4,
                                    encoder_ffn_dim=64, downsample_hidden_size=8, output_dim=48, n_window=50,
                                    n_window_infer=200)
    text = Qwen3TextConfig(vocab_size=272, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    return Qwen3ASRConfig(audio_config=audio, text_config=text, audio_token_id=261, pad_token_id=258,
                          eos_token_id=(258,))
