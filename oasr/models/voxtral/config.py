"""Voxtral configuration, field for field as transformers' ``VoxtralConfig`` writes ``config.json``: Whisper's
encoder under ``audio_config`` (``VoxtralEncoderConfig``), the Mistral language model under ``text_config`` (a
``llama`` config), the id of ``[AUDIO]`` (``audio_token_id``) and the projector's activation at the top level.
Fields a config.json leaves out take transformers' defaults (Voxtral-Mini-3B-2507's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oasr.models.fastconformer.config import _known_fields
from oasr.models.voxtral.language_model import TextConfig

# transformers writes the encoder's sizes under these names; Whisper's own names (d_model ...) are aliases.
_ENCODER_ALIASES = {"d_model": "hidden_size", "encoder_layers": "num_hidden_layers",
                    "encoder_attention_heads": "num_attention_heads", "encoder_ffn_dim": "intermediate_size"}
FRAMES_PER_POSITION = 4  # encoder frames stacked into one language-model position (the adapter's downsampling)


@dataclass(frozen=True)
class VoxtralEncoderConfig:
    hidden_size: int = 1280
    intermediate_size: int = 5120
    num_hidden_layers: int = 32
    num_attention_heads: int = 20
    num_mel_bins: int = 128
    max_source_positions: int = 1500  # encoder frames of one 30 s window (3,000 feature frames, stride 2)
    activation_function: str = "gelu"
    scale_embedding: bool = False

    def __post_init__(self) -> None:
        if self.intermediate_size != FRAMES_PER_POSITION * self.hidden_size:
            # transformers reshapes the encoder output to rows of intermediate_size: four frames per row.
            raise ValueError(f"intermediate_size {self.intermediate_size} must be {FRAMES_PER_POSITION} x "
                             f"hidden_size ({self.hidden_size}): the projector reads {FRAMES_PER_POSITION} frames at once")
        if self.max_source_positions % FRAMES_PER_POSITION:
            raise ValueError(f"max_source_positions {self.max_source_positions} is not a multiple of "
                             f"{FRAMES_PER_POSITION}")
        if self.activation_function != "gelu" or self.scale_embedding:
            raise ValueError("only Whisper's encoder (activation gelu, no embedding scale) is supported")

    # Whisper's names, which oasr.models.whisper's encoder reads.
    @property
    def d_model(self) -> int:
        return self.hidden_size

    @property
    def encoder_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def encoder_attention_heads(self) -> int:
        return self.num_attention_heads

    @property
    def encoder_ffn_dim(self) -> int:
        return self.intermediate_size

    @property
    def window_frames(self) -> int:
        """Feature frames of one window (the encoder's fixed input)."""
        return 2 * self.max_source_positions

    @property
    def window_positions(self) -> int:
        """Language-model positions of one window (375 for 30 s)."""
        return self.max_source_positions // FRAMES_PER_POSITION

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> VoxtralEncoderConfig:
        values = {_ENCODER_ALIASES.get(k, k): v for k, v in values.items()}
        return cls(**_known_fields(cls, values))


# transformers' defaults for the language model (``VoxtralConfig.sub_configs_defaults``).
_TEXT_DEFAULTS = dict(vocab_size=131_072, hidden_size=3072, intermediate_size=8192, num_hidden_layers=30,
                      num_key_value_heads=8, max_position_embeddings=131_072, rms_norm_eps=1e-5,
                      rope_theta=100_000_000.0, head_dim=128)


@dataclass(frozen=True)
class VoxtralConfig:
    audio_config: VoxtralEncoderConfig = dataclasses.field(default_factory=VoxtralEncoderConfig)
    text_config: TextConfig = dataclasses.field(default_factory=lambda: TextConfig(**_TEXT_DEFAULTS))
    audio_token_id: int = 24  # [AUDIO]: the prompt positions the audio embeddings take
    projector_hidden_act: str = "gelu"
    eos_token_id: tuple[int, ...] = (2,)  # </s>

    @property
    def num_mel_bins(self) -> int:
        return self.audio_config.num_mel_bins

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> VoxtralConfig:
        audio = VoxtralEncoderConfig.from_dict(values.get("audio_config") or {})
        text_values = {**_TEXT_DEFAULTS, **(values.get("text_config") or {})}
        kwargs = _known_fields(cls, values)
        eos = kwargs.get("eos_token_id", text_values.get("eos_token_id", cls.eos_token_id))
        kwargs["eos_token_id"] = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        return cls(audio_config=audio, text_config=TextConfig.from_dict(text_values), **{
            k: v for k, v in kwargs.items() if k not in ("audio_config", "text_config")})

    def to_dict(self) -> dict[str, Any]:
        return {
            "audio_config": {**dataclasses.asdict(self.audio_config), "model_type": "voxtral_encoder"},
            "text_config": self.text_config.to_dict(),
            "audio_token_id": self.audio_token_id,
            "projector_hidden_act": self.projector_hidden_act,
            "eos_token_id": list(self.eos_token_id),
            "model_type": "voxtral",
        }


def tiny_voxtral_config() -> VoxtralConfig:
    """A few-thousand-parameter model with every module of the real one: Whisper's geometry in time (30 s
    windows of 1,500 encoder frames, 375 positions), 16 mels, grouped key/value heads (4 over 2), and a vocabulary
    of 300 ids (40 control tokens at their real ids, 256 bytes, four merges)."""
    audio = VoxtralEncoderConfig(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_mel_bins=16)
    text = TextConfig(vocab_size=300, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                      rope_theta=10_000.0)
    return VoxtralConfig(audio_config=audio, text_config=text)
