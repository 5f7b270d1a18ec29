"""Greedy transducer decoding, RNN-T and TDT, batched on the device.

Label looping: every row sits at its own encoder frame; one step runs the joint once for all rows, takes the
best token (and, for TDT, the best duration), records it where it is not blank, steps the predictor and keeps
its new state only on those rows, then moves each row forward by its advance:

- RNN-T: a blank advances one frame, a token stays on the frame;
- TDT: the predicted duration (a blank advances at least one frame);
- both: after ``max_symbols_per_step`` tokens on one frame the row is forced one frame forward (NeMo's guard).

No step reads a tensor on the host: rows that are done are masked. The loop checks whether every row is done
once per chunk of steps (one host sync each, normally one or two per batch) and reads the tokens back once.

Model contract (``decode_family`` "transducer" / "tdt"), the predictor state opaque to the loop:

- ``blank_id``, ``vocab_size`` (token logits, blank included, lead the joint's output), ``max_symbols_per_step``;
  TDT adds ``durations`` (frames per duration logit, which follow the token logits);
- ``project_encoder(hidden [B, T, D]) -> [B, T, H]``, once per batch;
- ``predictor_init(batch, device) -> (out [B, H], state)``: the start-of-sequence context;
- ``predictor_step(tokens [B], state) -> (out [B, H], state)``: every row steps;
- ``predictor_select(keep_new bool [B], new, old) -> state``; ``predictor_gather(state, index [N])`` (beams);
- ``joint(frames [B, H], predictor_out [B, H]) -> logits [B, vocab_size (+ len(durations))]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.models.base import EncoderOutput

# logits [B, num_joint_outputs] -> (token [B], frames to advance [B]); a blank never advances 0.
Rule = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class TransducerModel(Protocol):
    blank_id: int
    vocab_size: int
    max_symbols_per_step: int

    def project_encoder(self, hidden: torch.Tensor) -> torch.Tensor: ...
    def predictor_init(self, batch_size: int, device: torch.device) -> tuple[torch.Tensor, Any]: ...
    def predictor_step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]: ...
    def predictor_select(self, keep_new: torch.Tensor, new: Any, old: Any) -> Any: ...
    def joint(self, frames: torch.Tensor, predictor_out: torch.Tensor) -> torch.Tensor: ...


class TDTModel(TransducerModel, Protocol):
    durations: tuple[int, ...]


@dataclass(frozen=True)
class TransducerGreedyOptions:
    # Tokens one frame may emit before the row is forced forward; None: the checkpoint's own value.
    max_symbols_per_step: int | None = None

    def __post_init__(self) -> None:
        if self.max_symbols_per_step is not None and self.max_symbols_per_step < 1:
            raise ValueError("max_symbols_per_step must be at least 1")


def label_loop(
    model: TransducerModel, encoder_output: EncoderOutput, rule: Rule, *, max_symbols: int, max_advance: int
) -> list[list[int]]:
    """encoder_output: hidden [B, T, D], lengths [B] -> token ids per row (blanks excluded)."""
    frames = model.project_encoder(encoder_output.hidden)
    batch, num_frames, _ = frames.shape
    device = frames.device
    lengths = encoder_output.lengths.to(device)
    rows = torch.arange(batch, device=device)
    predictor_out, state = model.predictor_init(batch, device)
    position = torch.zeros(batch, dtype=torch.long, device=device)
    run = torch.zeros_like(position)  # tokens emitted on the current frame
    # Each step advances a frame or emits a token on it, at most max_symbols per frame: a bound on the steps.
    max_steps = num_frames * max_symbols
    tokens = torch.full((batch, max_steps + 1), -1, dtype=torch.long, device=device)
    count = torch.zeros_like(position)
    chunk = max(1, math.ceil(num_frames / max_advance))  # the fewest steps the longest row can need
    steps = 0
    while steps < max_steps:
        for _ in range(min(chunk, max_steps - steps)):
            active = position < lengths
            logits = model.joint(frames[rows, position.clamp(max=num_frames - 1)], predictor_out)
            token, advance = rule(logits)
            emit = active & (token != model.blank_id)
            run = torch.where(emit & (advance == 0), run + 1, 0)
            forced = run >= max_symbols
            advance = torch.where(forced, 1, advance)
            run = torch.where(forced, 0, run)
            position = position + torch.where(active, advance, 0)
            tokens[rows, count] = token  # overwritten by the next emission unless this one counts
            count = count + emit.long()
            new_out, new_state = model.predictor_step(token, state)
            predictor_out = torch.where(emit[:, None], new_out, predictor_out)
            state = model.predictor_select(emit, new_state, state)
        steps += chunk
        if not bool((position < lengths).any()):  # the once-per-chunk host sync
            break
    tokens, count = tokens.cpu(), count.cpu()
    return [row[:n].tolist() for row, n in zip(tokens, count.tolist(), strict=True)]


def _max_symbols(options: TransducerGreedyOptions, model: TransducerModel) -> int:
    return options.max_symbols_per_step or model.max_symbols_per_step


@DECODE_STRATEGIES.register("transducer_greedy")
class TransducerGreedy:
    consumes: ClassVar[str] = "encoder_hidden_states"
    incremental: ClassVar[bool] = False

    def __init__(self, options: TransducerGreedyOptions | None = None) -> None:
        self.options = options or TransducerGreedyOptions()

    def decode(self, model: TransducerModel, encoder_output: EncoderOutput) -> list[list[int]]:
        blank = model.blank_id

        def rule(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            token = logits[:, : model.vocab_size].argmax(dim=-1)
            return token, (token == blank).long()

        return label_loop(model, encoder_output, rule, max_symbols=_max_symbols(self.options, model), max_advance=1)


@DECODE_STRATEGIES.register("tdt_greedy")
class TDTGreedy:
    consumes: ClassVar[str] = "encoder_hidden_states"
    incremental: ClassVar[bool] = False

    def __init__(self, options: TransducerGreedyOptions | None = None) -> None:
        self.options = options or TransducerGreedyOptions()

    def decode(self, model: TDTModel, encoder_output: EncoderOutput) -> list[list[int]]:
        blank, vocab_size = model.blank_id, model.vocab_size
        durations = torch.tensor(model.durations, dtype=torch.long, device=encoder_output.hidden.device)

        def rule(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            token = logits[:, :vocab_size].argmax(dim=-1)
            advance = durations[logits[:, vocab_size:].argmax(dim=-1)]
            # A blank that predicts no movement would loop forever on its frame.
            return token, torch.where((token == blank) & (advance == 0), 1, advance)

        max_advance = max(1, max(model.durations))
        return label_loop(
            model, encoder_output, rule, max_symbols=_max_symbols(self.options, model), max_advance=max_advance
        )
