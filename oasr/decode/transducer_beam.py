"""RNN-T beam search on the device, frame by frame, batched over rows and beams.

Each row keeps ``beam_size`` hypotheses (token history, alignment log-probability, predictor state). On a frame
a hypothesis either takes the blank (it is done with the frame) or emits a token and stays on the frame; after
``max_symbols_per_step`` tokens on one frame it is moved on without a blank, as greedy decoding forces it. Each
symbol step ranks, per row, the hypotheses already done with the frame, the blank of every hypothesis still on
it and all its token extensions together, and keeps the ``beam_size`` best: with one beam this is the greedy
label loop's choice at every step, so beam 1 gives greedy's tokens. With ``max_symbols_per_step = 1`` it is the
"modified beam search" of k2 and icefall (one symbol per frame). Hypotheses are not merged: two alignments of
one token sequence hold two beams, and the score is the best alignment's log-probability (the greedy path's,
at one beam).

Hotwords (``oasr.decode.hotwords``) rank hypotheses by their score plus the boost their tokens earned, as in the
CTC prefix search.

Model contract: ``oasr.decode.transducer_greedy``'s, plus ``predictor_gather(state, index [N])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.back_pointers import follow_back_pointers
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.hotwords import ContextGraph, ContextGraphCache
from oasr.decode.pending import LaunchesEagerly
from oasr.decode.transducer_greedy import TransducerModel
from oasr.types import Hotword

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class TransducerBeamOptions:
    beam_size: int = 4
    max_symbols_per_step: int | None = None  # None: the checkpoint's own value
    hotwords: tuple[Hotword, ...] = ()  # phrases to boost (``oasr.decode.hotwords``)

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")
        if self.max_symbols_per_step is not None and self.max_symbols_per_step < 1:
            raise ValueError("max_symbols_per_step must be at least 1")


@dataclass
class _Beams:
    """[B, K] per row and beam (flattened to B * K rows for the predictor): score (-inf: empty), done with the
    current frame; the predictor's output [B * K, H] and state; the hotword automaton's state and the boost
    earned (zeros without hotwords)."""

    score: torch.Tensor
    done: torch.Tensor
    predictor_out: torch.Tensor
    state: Any
    context_state: torch.Tensor
    context_score: torch.Tensor


def _symbol_step(model: TransducerModel, beams: _Beams, frame: torch.Tensor, forced: bool,
                 context: ContextGraph | None = None) -> tuple[_Beams, torch.Tensor, torch.Tensor]:
    """One symbol step on the current frame. frame: [B, H] -> (beams, parent [B, K], token [B, K], -1: none).
    With ``context`` (hotwords), hypotheses are ranked by score plus boost; scores stay acoustic."""
    b, k = beams.score.shape
    v = model.vocab_size
    blank = model.blank_id
    logits = model.joint(frame[:, None, :].expand(b, k, -1).reshape(b * k, -1), beams.predictor_out)
    log_probs = logits[:, :v].float().log_softmax(-1).view(b, k, v)
    open_ = ~beams.done & (beams.score > _NEG_INF)
    kept = torch.where(beams.done, beams.score, _NEG_INF)  # done with the frame: carried as they are
    blanked = torch.where(open_, beams.score + log_probs[..., blank], _NEG_INF)
    extended = torch.where(open_[..., None], beams.score[..., None] + log_probs, _NEG_INF)
    extended[..., blank] = _NEG_INF
    pool = torch.cat([kept, blanked, extended.reshape(b, k * v)], dim=1)
    if context is None:
        score, index = pool.topk(k, dim=1)
    else:
        held = beams.context_score
        boost = torch.cat([held, held, (held[..., None] + context.gain[beams.context_state]).reshape(b, k * v)], 1)
        _, index = (pool + boost).topk(k, dim=1)
        score = pool.gather(1, index)
    is_token = index >= 2 * k
    parent = torch.where(is_token, (index - 2 * k) // v, index % k)
    token = torch.where(is_token, (index - 2 * k) % v, -1)
    context_state = beams.context_state.gather(1, parent)
    context_score = beams.context_score.gather(1, parent)
    if context is not None:
        context_state, context_score = context.advance(context_state, context_score, token, is_token)
    flat_parent = (parent + torch.arange(b, device=parent.device)[:, None] * k).reshape(-1)
    state = model.predictor_gather(beams.state, flat_parent)
    out = beams.predictor_out[flat_parent]
    emit = is_token.reshape(-1)
    new_out, new_state = model.predictor_step(token.clamp(min=0).reshape(-1).masked_fill(~emit, blank), state)
    out = torch.where(emit[:, None], new_out, out)
    state = model.predictor_select(emit, new_state, state)
    # A token keeps its hypothesis on the frame, unless it was the last symbol the frame allows.
    done = ~is_token | forced | (score == _NEG_INF)
    return _Beams(score, done, out, state, context_state, context_score), parent, token


def transducer_beam_search(model: TransducerModel, encoder_output: EncoderOutput, beam_size: int,
                           max_symbols: int, context: ContextGraph | None = None
                           ) -> tuple[list[list[int]], torch.Tensor]:
    """encoder_output: hidden [B, T, D], lengths [B] -> (best token ids per row, their log-probability [B]).
    With ``context``, the best is the hypothesis whose score plus completed phrases' boost is highest."""
    frames = model.project_encoder(encoder_output.hidden)
    b, t, _ = frames.shape
    k = beam_size
    device = frames.device
    lengths = encoder_output.lengths.to(device)
    out, state = model.predictor_init(b * k, device)
    score = torch.full((b, k), _NEG_INF, device=device)
    score[:, 0] = 0.0
    zeros = torch.zeros(b, k, dtype=torch.long, device=device)
    beams = _Beams(score, zeros.bool(), out, state, zeros, torch.zeros(b, k, device=device))
    parents, tokens = [], []
    for frame_index in range(t):
        # Rows past their frames start the frame done: every step carries their beams unchanged.
        beams.done = (frame_index >= lengths)[:, None].expand(b, k).clone()
        for symbol in range(max_symbols):
            beams, parent, token = _symbol_step(model, beams, frames[:, frame_index], symbol == max_symbols - 1,
                                                context)
            parents.append(parent)
            tokens.append(token)
            if bool(beams.done.all()):  # one host sync per symbol step
                break
    rank = beams.score
    if context is not None:  # an unfinished phrase gives its boost back
        rank = rank + context.kept(beams.context_state, beams.context_score)
    best = rank.argmax(dim=1)
    return _trace(parents, tokens, best), beams.score.gather(1, best[:, None]).squeeze(1)


def _trace(parents: list[torch.Tensor], tokens: list[torch.Tensor], best: torch.Tensor) -> list[list[int]]:
    """Back-pointers per step ([B, K] each) from each row's ``best`` beam -> the token ids per row."""
    if not parents:
        return [[] for _ in range(best.shape[0])]
    (path,) = follow_back_pointers(torch.stack(parents), best, torch.stack(tokens))
    return [row[row >= 0].tolist() for row in path.T.cpu()]  # the one read-back


@DECODE_STRATEGIES.register("transducer_beam")
class TransducerBeam(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = True  # serves DecodeOptions.beam_size
    biases: ClassVar[bool] = True  # and its hotwords

    def __init__(self, options: TransducerBeamOptions | None = None, contexts: ContextGraphCache | None = None) -> None:
        self.options = options or TransducerBeamOptions()
        if self.options.hotwords and contexts is None:
            raise ValueError("hotwords need the runner's ContextGraphCache (contexts)")
        self.contexts = contexts

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple[Hotword, ...] = (),
                 contexts: ContextGraphCache | None = None) -> TransducerBeam:
        return cls(TransducerBeamOptions(beam_size=beam_size, hotwords=hotwords), contexts)

    def decode(self, model: TransducerModel, encoder_output: EncoderOutput) -> list[list[int]]:
        max_symbols = self.options.max_symbols_per_step or model.max_symbols_per_step
        context = None
        if self.options.hotwords:
            context = self.contexts.get(self.options.hotwords, model.vocab_size, encoder_output.hidden.device)
        ids, _ = transducer_beam_search(model, encoder_output, self.options.beam_size, max_symbols, context)
        return ids
