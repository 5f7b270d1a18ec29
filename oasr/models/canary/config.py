"""Canary and Cohere Transcribe configurations: a FastConformer encoder and one transformer decoder.

Field names follow transformers' ``CanaryConfig`` (encoder and decoder nested under ``encoder_config`` and
``decoder_config``) and ``CohereAsrConfig`` (the decoder's fields at the top level), so a ``config.json`` written
by ``save_pretrained`` loads as is; ``to_dict`` writes the same layout back. The two checkpoints share one decoder
and differ in three switches (``AEDDecoderConfig.positions``, ``encoder_hidden_size``, ``tie_word_embeddings``).
The feature settings come from ``preprocessor_config.json`` (the converter merges them in under ``preprocessor``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from oasr.models.fastconformer.config import FastConformerEncoderConfig, _known_fields, tiny_encoder_config

Positions = Literal["sinusoidal", "learned"]
# The switches that tell the two decoders apart; they follow from model_type and are not written to config.json.
_SWITCHES = ("positions", "encoder_hidden_size", "tie_word_embeddings")
# Encoder fields a config.json may leave out, at transformers' values for each family (``sub_configs_defaults``):
# these differ from a Parakeet encoder's defaults (no input scaling, 128 mels).
_CANARY_ENCODER_DEFAULTS = {"num_hidden_layers": 32, "num_mel_bins": 128, "scale_input": False}
_COHERE_ENCODER_DEFAULTS = {"hidden_size": 1280, "num_hidden_layers": 48, "intermediate_size": 5120,
                            "num_mel_bins": 128, "scale_input": False}


@dataclass(frozen=True)
class AEDDecoderConfig:
    vocab_size: int = 16384
    hidden_size: int = 1024
    intermediate_size: int = 4096  # feed-forward width
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 8  # must equal num_attention_heads: the waist's attention has no grouped heads
    head_dim: int = 128  # must be hidden_size / num_attention_heads, for the same reason
    hidden_act: str = "relu"
    max_position_embeddings: int = 1024
    attention_bias: bool = True  # only True is served: the waist's attention always has q/v/out biases
    # Canary adds NeMo's fixed sinusoidal table; Cohere Transcribe learns an embedding (``pos_emb.weight``).
    positions: Positions = "sinusoidal"
    # Width of the encoder output when it differs from the decoder's: a Linear (``decoder.proj``) maps one to the
    # other (Cohere Transcribe). None: no projection (Canary, where the widths agree).
    encoder_hidden_size: int | None = None
    tie_word_embeddings: bool = True  # the vocabulary head reuses the token embedding (Canary)

    def __post_init__(self) -> None:
        heads = self.num_attention_heads
        if self.hidden_size % heads or self.head_dim != self.hidden_size // heads:
            raise ValueError(f"head_dim {self.head_dim} must be hidden_size {self.hidden_size} / {heads} heads")
        if self.num_key_value_heads != heads:
            raise ValueError(f"grouped key/value heads ({self.num_key_value_heads} for {heads}) are not supported")
        if not self.attention_bias:
            raise ValueError("decoders without attention biases (attention_bias=False) are not supported")
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {self.positions!r}")
        if self.positions == "sinusoidal" and self.hidden_size % 2:
            raise ValueError("sinusoidal positions need an even hidden_size")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AEDDecoderConfig:
        return cls(**_known_fields(cls, values))


@dataclass(frozen=True)
class FrontendSettings:
    """The log-mel frontend a checkpoint was trained with (``preprocessor_config.json``; its field names)."""

    feature_size: int = 128  # mel bins
    sampling_rate: int = 16_000
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    preemphasis: float = 0.97
    # Cohere's extractor adds this much Gaussian noise at inference, seeded per input (Parakeet's adds none).
    dither: float = 0.0

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> FrontendSettings:
        return cls(**_known_fields(cls, values or {}))


@dataclass(frozen=True)
class CanaryConfig:
    encoder_config: FastConformerEncoderConfig = dataclasses.field(default_factory=FastConformerEncoderConfig)
    decoder_config: AEDDecoderConfig = dataclasses.field(default_factory=AEDDecoderConfig)
    pad_token_id: int | None = 2
    bos_token_id: int | None = 4
    eos_token_id: int | None = 3
    decoder_start_token_id: int | None = 7
    preprocessor: FrontendSettings = dataclasses.field(default_factory=FrontendSettings)
    # A language to use when a request names none; None: requests must name one (a NeMo archive's prompt_defaults
    # may declare one).
    default_language: str | None = None
    # Pieces before <|startofcontext|> in the prompt, by name; None: the architecture's own (nothing for Canary).
    # NeMo encodes a canary2 prompt as one string, so its SentencePiece model's dummy prefix '▁' comes first.
    prompt_prefix: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        decoder, encoder = self.decoder_config, self.encoder_config
        width = decoder.encoder_hidden_size or decoder.hidden_size
        if width != encoder.hidden_size:
            raise ValueError(
                f"the decoder expects {width}-wide encoder states, the encoder gives {encoder.hidden_size}"
            )
        if self.preprocessor.feature_size != encoder.num_mel_bins:
            raise ValueError(
                f"the feature extractor gives {self.preprocessor.feature_size} mels, the encoder takes "
                f"{encoder.num_mel_bins}"
            )

    @property
    def num_mel_bins(self) -> int:
        return self.encoder_config.num_mel_bins

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CanaryConfig:
        encoder = _encoder_from(values, _CANARY_ENCODER_DEFAULTS)
        decoder_values = values.get("decoder_config") or {}
        # "learned": a table read from the checkpoint (a NeMo archive's own sinusoidal table, oasr.models.converters.
        # nemo_canary); transformers' Canary computes its table.
        decoder = _decoder_from(decoder_values, positions=decoder_values.get("positions") or "sinusoidal",
                                encoder_hidden_size=None, tie_word_embeddings=values.get("tie_word_embeddings", True))
        return cls._build(values, encoder, decoder)

    @classmethod
    def _build(cls, values: dict[str, Any], encoder: FastConformerEncoderConfig, decoder: AEDDecoderConfig):
        kwargs = _known_fields(cls, values)
        kwargs.update(encoder_config=encoder, decoder_config=decoder)
        # A checkpoint without preprocessor_config.json gets the default frontend at the encoder's mel count.
        frontend = values.get("preprocessor") or {"feature_size": encoder.num_mel_bins}
        kwargs["preprocessor"] = FrontendSettings.from_dict(frontend)
        if kwargs.get("prompt_prefix") is not None:  # a JSON list
            kwargs["prompt_prefix"] = tuple(kwargs["prompt_prefix"])
        return cls(**kwargs)

    def _common_dict(self) -> dict[str, Any]:
        return {
            "encoder_config": self.encoder_config.to_dict(),
            "pad_token_id": self.pad_token_id,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "decoder_start_token_id": self.decoder_start_token_id,
            "tie_word_embeddings": self.decoder_config.tie_word_embeddings,
            "vocab_size": self.decoder_config.vocab_size,
            "preprocessor": dataclasses.asdict(self.preprocessor),
            "default_language": self.default_language,
            **({"prompt_prefix": list(self.prompt_prefix)} if self.prompt_prefix is not None else {}),
        }

    def _decoder_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self.decoder_config).items() if k not in _SWITCHES}

    def to_dict(self) -> dict[str, Any]:
        decoder = self._decoder_dict()
        if self.decoder_config.positions != "sinusoidal":
            decoder["positions"] = self.decoder_config.positions
        return {**self._common_dict(), "decoder_config": decoder, "model_type": "canary"}


@dataclass(frozen=True)
class CohereAsrConfig(CanaryConfig):
    """Cohere Transcribe: the same fields; in ``config.json`` the decoder's sit at the top level."""

    decoder_start_token_id: int | None = None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CohereAsrConfig:
        encoder = _encoder_from(values, _COHERE_ENCODER_DEFAULTS)
        decoder = _decoder_from(values, positions="learned", encoder_hidden_size=encoder.hidden_size,
                                tie_word_embeddings=values.get("tie_word_embeddings", False))
        return cls._build(values, encoder, decoder)

    def to_dict(self) -> dict[str, Any]:
        return {**self._common_dict(), **self._decoder_dict(), "model_type": "cohere_asr"}


def _encoder_from(values: dict[str, Any], defaults: dict[str, Any]) -> FastConformerEncoderConfig:
    return FastConformerEncoderConfig.from_dict({**defaults, **(values.get("encoder_config") or {})})


def _decoder_from(values: dict[str, Any], **switches: Any) -> AEDDecoderConfig:
    """The decoder's fields of a transformers config; a null head_dim or key/value head count means the
    default transformers derives (hidden_size / heads, and as many key/value heads as heads)."""
    kwargs = {**values, **switches}
    heads = values.get("num_attention_heads") or AEDDecoderConfig.num_attention_heads
    if kwargs.get("head_dim") is None:
        kwargs["head_dim"] = (values.get("hidden_size") or AEDDecoderConfig.hidden_size) // heads
    if kwargs.get("num_key_value_heads") is None:
        kwargs["num_key_value_heads"] = heads
    return AEDDecoderConfig.from_dict(kwargs)


def tiny_decoder_fields() -> dict[str, Any]:
    """A few-thousand-parameter decoder: every module of the real one, random weights."""
    return dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, head_dim=8, max_position_embeddings=64)


def tiny_canary_config() -> CanaryConfig:
    encoder = dataclasses.replace(tiny_encoder_config(), scale_input=False)
    return CanaryConfig(
        encoder_config=encoder,
        decoder_config=AEDDecoderConfig(**tiny_decoder_fields()),
        preprocessor=FrontendSettings(feature_size=encoder.num_mel_bins),
    )


def tiny_cohere_config() -> CohereAsrConfig:
    # An encoder wider than the decoder, so the encoder-to-decoder projection is exercised.
    encoder = dataclasses.replace(tiny_encoder_config(), hidden_size=40, num_attention_heads=4, scale_input=False)
    decoder = AEDDecoderConfig(**tiny_decoder_fields(), positions="learned", encoder_hidden_size=40,
                               tie_word_embeddings=False)
    return CohereAsrConfig(encoder_config=encoder, decoder_config=decoder,
                           preprocessor=FrontendSettings(feature_size=encoder.num_mel_bins, dither=1e-5))
