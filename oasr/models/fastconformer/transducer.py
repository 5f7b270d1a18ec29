"""Parakeet RNN-T and TDT: the FastConformer encoder, an LSTM prediction network and a joint network.

Key layout of transformers' ``ParakeetForRNNT`` / ``ParakeetForTDT``: ``encoder.*``, ``encoder_projector``,
``decoder.{embedding,lstm,decoder_projector}`` (the prediction network) and ``joint.head``. The TDT joint's head
is wider: ``vocab_size`` token logits, then one logit per entry of ``durations``.

The methods below are what the transducer strategies (``oasr.decode.transducer_greedy``) call. The predictor state
is opaque to them: they only create it, step it, and keep or drop its rows with a mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from oasr.layers import LSTM, Embedding, Linear, activation
from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.fastconformer.config import ParakeetRNNTConfig, ParakeetTDTConfig, tiny_rnnt_config, tiny_tdt_config
from oasr.models.fastconformer.encoder import FastConformerEncoder, example_features
from oasr.models.frame_sync import FrameSyncModel
from oasr.streaming.geometry import StateField


@dataclass
class LSTMPredictorState:
    """hidden, cell: [num_layers, B, H]."""

    hidden: torch.Tensor
    cell: torch.Tensor


class PredictionNetwork(nn.Module):
    """Embeds the last emitted token and runs one LSTM step; the output is projected for the joint."""

    def __init__(self, config: ParakeetRNNTConfig) -> None:
        super().__init__()
        h = config.decoder_hidden_size
        self.embedding = Embedding(config.vocab_size, h)
        self.lstm = LSTM(h, h, num_layers=config.num_decoder_layers, batch_first=True)
        self.decoder_projector = Linear(h, h)

    def forward(self, tokens: torch.Tensor, state: LSTMPredictorState) -> tuple[torch.Tensor, LSTMPredictorState]:
        """tokens: [B] -> (output [B, H], state after the step)."""
        out, (hidden, cell) = self.lstm(self.embedding(tokens)[:, None], (state.hidden, state.cell))
        return self.decoder_projector(out[:, 0]), LSTMPredictorState(hidden, cell)


class JointNetwork(nn.Module):
    """(projected encoder frame [B, H], predictor output [B, H]) -> logits [B, num_joint_outputs]."""

    def __init__(self, config: ParakeetRNNTConfig) -> None:
        super().__init__()
        self.activation = activation(config.hidden_act)
        self.head = Linear(config.decoder_hidden_size, config.num_joint_outputs)

    def forward(self, encoder_frame: torch.Tensor, predictor_output: torch.Tensor) -> torch.Tensor:
        return self.head(self.activation(encoder_frame + predictor_output))


@ARCHITECTURES.register("parakeet_rnnt")
class ParakeetForRNNT(FrameSyncModel):
    config_class: ClassVar[type] = ParakeetRNNTConfig
    feature_extractor = "nemo_logmel"
    tokenizer = "parakeet_hf_json"
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("transducer_greedy", "transducer_beam"))
    tied_keys: ClassVar[dict[str, str]] = {}
    # Built from config.encoder_config; a variant with the same heads names its own encoder here.
    encoder_class: ClassVar[type[nn.Module]] = FastConformerEncoder

    def __init__(self, config: ParakeetRNNTConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = self.encoder_class(config.encoder_config)
        self.encoder_projector = Linear(config.encoder_config.hidden_size, config.decoder_hidden_size)
        self.decoder = PredictionNetwork(config)
        self.joint = JointNetwork(config)  # called by the strategies: model.joint(encoder_frame, predictor_output)

    @classmethod
    def from_config(cls, config: ParakeetRNNTConfig) -> ParakeetForRNNT:
        return cls(config)

    @staticmethod
    def tiny_config() -> ParakeetRNNTConfig:
        return tiny_rnnt_config()

    @staticmethod
    def example_inputs(config: ParakeetRNNTConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [B, n_mels, T], lengths [B]) for ``forward``: what a smoke test calls the model with."""
        return example_features(config.encoder_config, batch_size)

    @property
    def blank_id(self) -> int:
        return self.config.blank_id

    @property
    def vocab_size(self) -> int:
        """Token logits (blank included) at the front of the joint's output."""
        return self.config.vocab_size

    @property
    def max_symbols_per_step(self) -> int:
        return self.config.max_symbols_per_step

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """features: [B, n_mels, T]; lengths: [B] real feature frames -> EncoderOutput ([B, T', D], [B])."""
        return self.encoder(features.to(self.encoder_projector.compute_dtype), lengths)

    def project_encoder(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, T, D] -> joint-space frames [B, T, H]; done once per utterance, not per label step."""
        return self.encoder_projector(hidden)

    def predictor_init(self, batch_size: int, device: torch.device) -> tuple[torch.Tensor, LSTMPredictorState]:
        """The predictor after the start-of-sequence context: (output [B, H], state).

        The start token is the blank, as in NeMo (whose blank embedding is the zero padding row) and in
        transformers' generate (``decoder_start_token_id`` = blank).
        """
        c = self.config
        dtype = self.encoder_projector.compute_dtype
        zeros = torch.zeros(c.num_decoder_layers, batch_size, c.decoder_hidden_size, device=device, dtype=dtype)
        start = torch.full((batch_size,), self.blank_id, dtype=torch.long, device=device)
        return self.predictor_step(start, LSTMPredictorState(zeros, zeros.clone()))

    def predictor_step(
        self, tokens: torch.Tensor, state: LSTMPredictorState
    ) -> tuple[torch.Tensor, LSTMPredictorState]:
        """tokens: [B] last emitted token per row -> (output [B, H], new state). Every row steps."""
        return self.decoder(tokens, state)

    @staticmethod
    def predictor_select(
        keep_new: torch.Tensor, new: LSTMPredictorState, old: LSTMPredictorState
    ) -> LSTMPredictorState:
        """keep_new: bool [B] -> per row, ``new`` where True else ``old`` (rows that emitted a token advance)."""
        rows = keep_new[None, :, None]
        return LSTMPredictorState(torch.where(rows, new.hidden, old.hidden), torch.where(rows, new.cell, old.cell))

    def predictor_fields(self) -> tuple[StateField, ...]:
        """The predictor context a stream carries from one chunk to the next (per stream, as ``predictor_rows``
        lays it out)."""
        layers, width = self.config.num_decoder_layers, self.config.decoder_hidden_size
        return (StateField("predictor.out", (width,)), StateField("predictor.hidden", (layers, width)),
                StateField("predictor.cell", (layers, width)))

    @staticmethod
    def predictor_rows(out: torch.Tensor, state: LSTMPredictorState) -> dict[str, torch.Tensor]:
        """(out [B, H], state) -> ``predictor_fields``' tensors, batch first."""
        return {"predictor.out": out, "predictor.hidden": state.hidden.transpose(0, 1),
                "predictor.cell": state.cell.transpose(0, 1)}

    @staticmethod
    def predictor_from_rows(rows: dict[str, torch.Tensor]) -> tuple[torch.Tensor, LSTMPredictorState]:
        """The inverse of ``predictor_rows`` (the LSTM wants its state layer first and contiguous)."""
        return rows["predictor.out"], LSTMPredictorState(rows["predictor.hidden"].transpose(0, 1).contiguous(),
                                                         rows["predictor.cell"].transpose(0, 1).contiguous())

    @staticmethod
    def predictor_gather(state: LSTMPredictorState, index: torch.Tensor) -> LSTMPredictorState:
        """index: [N] rows of ``state`` -> a state of N rows (beam search reorders hypotheses with this)."""
        return LSTMPredictorState(state.hidden[:, index], state.cell[:, index])

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Joint logits [B, T', num_joint_outputs] of every frame against the start-of-sequence context (tests),
        under the default prompt."""
        frames = self.project_encoder(self.fuse_prompt(self.encode(features, lengths).hidden, None))
        start, _ = self.predictor_init(frames.shape[0], frames.device)
        return self.joint(frames, start[:, None, :])


@ARCHITECTURES.register("parakeet_tdt")
class ParakeetForTDT(ParakeetForRNNT):
    """RNN-T with a duration head: the joint also predicts how many frames to advance (``durations``)."""

    config_class: ClassVar[type] = ParakeetTDTConfig
    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("tdt_greedy", "tdt_beam"))

    @staticmethod
    def tiny_config() -> ParakeetTDTConfig:
        return tiny_tdt_config()

    @property
    def durations(self) -> tuple[int, ...]:
        """Frames to advance per duration logit (the joint's outputs after ``vocab_size``)."""
        return self.config.durations
