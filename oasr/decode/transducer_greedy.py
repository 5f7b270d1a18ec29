"""Greedy transducer decoding, RNN-T and TDT, batched on the device.

Label looping: every row sits at its own encoder frame; one step runs the joint once for all rows, takes the
best token (and, for TDT, the best duration), records it where it is not blank, steps the predictor and keeps
its new state only on those rows, then moves each row forward by its advance:

- RNN-T: a blank advances one frame, a token stays on the frame;
- TDT: the predicted duration (a blank advances at least one frame);
- both: after ``max_symbols_per_step`` tokens on one frame the row is forced one frame forward (NeMo's guard).

No step reads a tensor on the host: rows that are done are masked. The loop checks whether every row is done
once per chunk of steps (one host sync each, normally one or two per batch) and reads the tokens back once.

Model contract (architectures listing these strategies), the predictor state opaque to the loop:

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
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput, power_of_two_bucket
from oasr.decode.pending import LaunchesEagerly

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


@dataclass
class _Loop:
    """The label loop's state, updated in place by every step (so a CUDA graph of steps can be replayed)."""

    frames: torch.Tensor  # [B, T, H] projected encoder frames
    lengths: torch.Tensor  # [B] valid frames per row (0 for padding rows)
    position: torch.Tensor  # [B] current frame
    run: torch.Tensor  # [B] tokens emitted on the current frame
    count: torch.Tensor  # [B] tokens emitted so far
    tokens: torch.Tensor  # [B, T * max_symbols + 1] emitted tokens (the last slot absorbs non-emissions)
    predictor_out: torch.Tensor  # [B, H]
    state: Any  # the predictor's opaque state: a dataclass or tuple of tensors
    rows: torch.Tensor  # [B] 0 .. B-1, to pick each row's frame and token slot
    token_frames: torch.Tensor | None = None  # [B, like tokens] the frame each token was emitted on, if kept

    @classmethod
    def start(cls, model: TransducerModel, frames: torch.Tensor, lengths: torch.Tensor, max_symbols: int) -> _Loop:
        predictor_out, state = model.predictor_init(frames.shape[0], frames.device)
        return cls.resume(frames, lengths, predictor_out, state, max_symbols)

    @classmethod
    def resume(cls, frames: torch.Tensor, lengths: torch.Tensor, predictor_out: torch.Tensor, state: Any,
               max_symbols: int, *, keep_frames: bool = False) -> _Loop:
        """A loop over new frames that continues from a predictor context (a stream's next chunk)."""
        batch, num_frames, _ = frames.shape
        position = torch.zeros(batch, dtype=torch.long, device=frames.device)
        tokens = torch.full((batch, num_frames * max_symbols + 1), -1, dtype=torch.long, device=frames.device)
        rows = torch.arange(batch, device=frames.device)
        return cls(frames, lengths, position, position.clone(), position.clone(), tokens, predictor_out, state, rows,
                   tokens.clone() if keep_frames else None)

    def reset(self, model: TransducerModel) -> None:
        """Back to the start of every row (frames and lengths stay)."""
        for counter in (self.position, self.run, self.count):
            counter.zero_()
        out, state = model.predictor_init(self.frames.shape[0], self.frames.device)
        self.predictor_out.copy_(out)
        for old, new in zip(_state_tensors(self.state), _state_tensors(state), strict=True):
            old.copy_(new)

    def unfinished(self) -> torch.Tensor:
        return (self.position < self.lengths).any()

    def results(self, num_rows: int) -> list[list[int]]:
        tokens, count = self.tokens[:num_rows].cpu(), self.count[:num_rows].cpu()  # the one read of the tokens
        return [row[:n].tolist() for row, n in zip(tokens, count.tolist(), strict=True)]


def _state_tensors(state: Any) -> list[torch.Tensor]:
    if is_dataclass(state):
        return [getattr(state, f.name) for f in fields(state)]
    return list(state)


def _step(model: TransducerModel, loop: _Loop, rule: Rule, max_symbols: int) -> None:
    """One label step for every row, in place; rows past their frames are masked, so it never reads the host."""
    frames, rows = loop.frames, loop.rows
    active = loop.position < loop.lengths
    logits = model.joint(frames[rows, loop.position.clamp(max=frames.shape[1] - 1)], loop.predictor_out)
    token, advance = rule(logits)
    emit = active & (token != model.blank_id)
    run = torch.where(emit & (advance == 0), loop.run + 1, 0)
    forced = run >= max_symbols
    loop.run.copy_(torch.where(forced, 0, run))
    if loop.token_frames is not None:  # where this step's token sits, before the row moves on
        loop.token_frames[rows, loop.count] = loop.position
    loop.position.add_(torch.where(active, torch.where(forced, 1, advance), 0))
    loop.tokens[rows, loop.count] = token  # overwritten by the next emission unless this one counts
    loop.count.add_(emit.long())
    new_out, new_state = model.predictor_step(token, loop.state)
    loop.predictor_out.copy_(torch.where(emit[:, None], new_out, loop.predictor_out))
    selected = model.predictor_select(emit, new_state, loop.state)
    for old, new in zip(_state_tensors(loop.state), _state_tensors(selected), strict=True):
        old.copy_(new)


def label_loop(
    model: TransducerModel, encoder_output: EncoderOutput, rule: Rule, *, max_symbols: int, max_advance: int
) -> list[list[int]]:
    """encoder_output: hidden [B, T, D], lengths [B] -> token ids per row (blanks excluded). Eager steps."""
    frames = model.project_encoder(encoder_output.hidden)
    loop = _Loop.start(model, frames, encoder_output.lengths.to(frames.device), max_symbols)
    run_steps(model, loop, rule, max_symbols=max_symbols, max_advance=max_advance)
    return loop.results(frames.shape[0])


def run_steps(model: TransducerModel, loop: _Loop, rule: Rule, *, max_symbols: int, max_advance: int) -> None:
    """Eager label steps until every row of ``loop`` is past its frames."""
    num_frames = loop.frames.shape[1]
    # Each step advances a frame or emits a token on it, at most max_symbols per frame: a bound on the steps.
    max_steps = num_frames * max_symbols
    chunk = max(1, math.ceil(num_frames / max_advance))  # the fewest steps the longest row can need
    steps = 0
    while steps < max_steps:
        for _ in range(min(chunk, max_steps - steps)):
            _step(model, loop, rule, max_symbols)
        steps += chunk
        if not bool(loop.unfinished()):  # the once-per-chunk host sync
            break


class LabelLoopGraphs:
    """The label loop as CUDA graphs of ``steps_per_graph`` steps, one per (rows, frames) bucket.

    Eager label steps are a few dozen small kernels each, so a batch spends its time launching them. Here each
    bucket's loop state lives in static buffers; a batch is copied in (padding rows get no frames), the graph is
    replayed until every row is done (checked on the host after the fewest replays the longest row can need,
    then after each replay), and the tokens are read once.
    """

    def __init__(self, steps_per_graph: int = 32) -> None:
        self.steps_per_graph = steps_per_graph
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, _Loop, Rule]] = {}
        self._pool: Any = None

    def run(
        self, model: TransducerModel, encoder_output: EncoderOutput, rule: Rule, *, max_symbols: int,
        max_advance: int,
    ) -> list[list[int]]:
        frames = model.project_encoder(encoder_output.hidden)
        batch, num_frames, _ = frames.shape
        key = (power_of_two_bucket(batch), power_of_two_bucket(num_frames, 64))
        if key not in self._graphs:
            self._graphs[key] = self._capture(model, frames, key, rule, max_symbols)
        graph, loop, _ = self._graphs[key]
        loop.frames[:batch, :num_frames].copy_(frames)
        loop.lengths.zero_()
        loop.lengths[:batch].copy_(encoder_output.lengths)
        loop.reset(model)
        replays = math.ceil(num_frames / max_advance / self.steps_per_graph)
        limit = math.ceil(num_frames * max_symbols / self.steps_per_graph)
        done = 0
        while done < limit:
            for _ in range(min(replays, limit - done)):
                graph.replay()
            done += replays
            replays = 1
            if not bool(loop.unfinished()):
                break
        return loop.results(batch)

    def _capture(
        self, model: TransducerModel, frames: torch.Tensor, key: tuple[int, int], rule: Rule, max_symbols: int
    ) -> tuple[torch.cuda.CUDAGraph, _Loop, Rule]:
        rows, num_frames = key
        device = frames.device
        static = torch.zeros(rows, num_frames, frames.shape[2], dtype=frames.dtype, device=device)
        loop = _Loop.start(model, static, torch.zeros(rows, dtype=torch.long, device=device), max_symbols)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up: lazy initialisation must not happen during capture
            _step(model, loop, rule, max_symbols)
        torch.cuda.current_stream(device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            for _ in range(self.steps_per_graph):
                _step(model, loop, rule, max_symbols)
        # The rule's tensors (e.g. TDT durations) were captured by address: keep the rule alive with the graph.
        return graph, loop, rule


def greedy_rule(model: TransducerModel) -> Rule:
    """RNN-T: the best token; a blank moves one frame on, a token stays."""
    blank, vocab_size = model.blank_id, model.vocab_size

    def rule(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        token = logits[:, :vocab_size].argmax(dim=-1)
        return token, (token == blank).long()

    return rule


def _max_symbols(options: TransducerGreedyOptions, model: TransducerModel) -> int:
    return options.max_symbols_per_step or model.max_symbols_per_step


@DECODE_STRATEGIES.register("transducer_greedy")
class TransducerGreedy(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = False  # serves DecodeOptions.beam_size
    graph_capturable: ClassVar[bool] = True

    def __init__(self, options: TransducerGreedyOptions | None = None, *, cuda_graphs: bool = False) -> None:
        self.options = options or TransducerGreedyOptions()
        self._graphs = LabelLoopGraphs() if cuda_graphs else None

    def _loop(
        self, model: TransducerModel, encoder_output: EncoderOutput, rule: Rule, max_advance: int
    ) -> list[list[int]]:
        """The graphed loop on CUDA when enabled, else eager steps; both give the same tokens."""
        run = self._graphs.run if self._graphs is not None and encoder_output.hidden.is_cuda else label_loop
        return run(model, encoder_output, rule, max_symbols=_max_symbols(self.options, model), max_advance=max_advance)

    def decode(self, model: TransducerModel, encoder_output: EncoderOutput) -> list[list[int]]:
        return self._loop(model, encoder_output, greedy_rule(model), max_advance=1)


@DECODE_STRATEGIES.register("tdt_greedy")
class TDTGreedy(TransducerGreedy):
    def decode(self, model: TDTModel, encoder_output: EncoderOutput) -> list[list[int]]:
        blank, vocab_size = model.blank_id, model.vocab_size
        durations = torch.tensor(model.durations, dtype=torch.long, device=encoder_output.hidden.device)

        def rule(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            token = logits[:, :vocab_size].argmax(dim=-1)
            advance = durations[logits[:, vocab_size:].argmax(dim=-1)]
            # A blank that predicts no movement would loop forever on its frame.
            return token, torch.where((token == blank) & (advance == 0), 1, advance)

        max_advance = max(1, max(model.durations))
        return self._loop(model, encoder_output, rule, max_advance)
