"""TDT (token-and-duration transducer) beam search on the device: frame-synchronous, batched over rows and beams.

A TDT joint predicts a token and, apart from it, how many frames to move on, so hypotheses jump frames. The
search walks the frames in order, as NeMo's TDT beam does: a hypothesis that moves ``d`` frames is parked
in the bucket of the frame it lands on, and a bucket keeps at most ``beam_size`` hypotheses, ranked only against
others on the same frame (they have all read the same frames, so their scores compare like with like). When the
search reaches a frame, its bucket's hypotheses are expanded by every (token, duration) pair, scored by the
token's plus the duration's log-probability: expansions that stay on the frame (a token with duration 0) form
the frame's next round, the others are ranked into the bucket they land on. A move past a row's last frame
lands on the frame after it, where the row's finished hypotheses gather; the best of them is the answer.

Greedy decoding's rules hold for every hypothesis: a blank never stays on its frame (duration 0 moves it one),
and after ``max_symbols_per_step`` tokens on one frame a token moves at least one. Where staying is not allowed,
durations 0 and 1 are one move: one candidate, scored by the likelier, so no bucket holds a duplicate.

Greedy's path is always one of the hypotheses: the expansion greedy decoding would take from it is kept in its
bucket whatever its rank, and the others compete for the remaining places. Ranking per frame makes the beam
better, but pruning still can drop greedy's path for ones that end up less likely; keeping it makes "never less
likely than greedy" a property of the search. With one beam only greedy's path is kept: ``beam_size = 1`` gives
greedy's tokens. Hypotheses are not merged; the score is the log-probability of the hypothesis' own decisions.

Hotwords (``oasr.decode.hotwords``) rank hypotheses by their score plus the boost their tokens earned, as in the
RNN-T beam: each hypothesis carries its automaton state and boost, a token advances them (a blank does not), and
the answer is the finished hypothesis whose score plus whole phrases' boost is highest; the reported score stays
the log-probability. With a boost a hypothesis staying on its frame can gain, so the cut of hopeless stays below
is not exact then, and is skipped.

Model contract: ``oasr.decode.transducer_greedy``'s TDT one, plus ``predictor_rows(out, state)`` and
``predictor_from_rows(rows)`` (the streaming contract's predictor context as batch-first tensors), with which
hypotheses are copied between buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.hotwords import ContextGraph, ContextGraphCache
from oasr.decode.pending import LaunchesEagerly
from oasr.decode.transducer_beam import TransducerBeamOptions
from oasr.decode.transducer_greedy import TDTModel
from oasr.types import Hotword

_NEG_INF = float("-inf")
_INF = float("inf")


@dataclass
class _Buckets:
    """The hypotheses parked by frame: frame ``f`` is bucket ``f % S``, with S the longest move plus one, so the
    frames a search step can land on never share a bucket. [B, S, K] per row, bucket and slot: score (-inf: an
    empty slot), tokens emitted on the current frame (``run``), tokens emitted so far, the token the predictor has
    not been fed yet (-1: none), whether it is greedy's path, its hotword automaton state and boost held (zeros
    without hotwords); the tokens themselves [B, S, K, L]; the predictor's context as batch-first rows
    [B * S * K, ...] (``predictor_rows``)."""

    score: torch.Tensor
    run: torch.Tensor
    count: torch.Tensor
    pending: torch.Tensor
    greedy: torch.Tensor
    context_state: torch.Tensor
    context_score: torch.Tensor
    tokens: torch.Tensor
    predictor: dict[str, torch.Tensor]

    @classmethod
    def start(cls, model: TDTModel, batch: int, num_buckets: int, beam_size: int, max_tokens: int,
              device: torch.device) -> _Buckets:
        """Every row's start-of-sequence hypothesis in slot 0 of frame 0's bucket; the other slots empty."""
        shape = (batch, num_buckets, beam_size)
        score = torch.full(shape, _NEG_INF, device=device)
        score[:, 0, 0] = 0.0
        greedy = torch.zeros(shape, dtype=torch.bool, device=device)
        greedy[:, 0, 0] = True
        zeros = torch.zeros(shape, dtype=torch.long, device=device)
        tokens = torch.full((*shape, max_tokens), -1, dtype=torch.long, device=device)
        predictor = model.predictor_rows(*model.predictor_init(batch * num_buckets * beam_size, device))
        return cls(score, zeros, zeros.clone(), zeros - 1, greedy, zeros.clone(), torch.zeros(shape, device=device),
                   tokens, dict(predictor))


def _feed_pending(model: TDTModel, hyps: _Buckets, bucket: int) -> torch.Tensor:
    """Feeds ``bucket``'s pending tokens to the predictor, in place -> its predictor output [B * K, H].

    A new hypothesis copies its parent's predictor context and its token waits here: the predictor then steps
    the K hypotheses being expanded, not every slot an expansion was ranked into."""
    b, s, k = hyps.score.shape
    device = hyps.score.device
    flat = ((torch.arange(b, device=device)[:, None] * s + bucket) * k + torch.arange(k, device=device)).reshape(-1)
    out, state = model.predictor_from_rows({name: rows[flat] for name, rows in hyps.predictor.items()})
    pending = hyps.pending[:, bucket].reshape(-1)
    fed = pending >= 0
    new_out, new_state = model.predictor_step(torch.where(fed, pending, model.blank_id), state)
    out = torch.where(fed[:, None], new_out, out)
    state = model.predictor_select(fed, new_state, state)
    for name, rows in model.predictor_rows(out, state).items():
        hyps.predictor[name][flat] = rows
    hyps.pending[:, bucket] = -1
    return out


def _expansions(model: TDTModel, logits: torch.Tensor, run: torch.Tensor, durations: torch.Tensor,
                max_symbols: int, zero: int | None, one: int | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits: [B, K, V + D] of the hypotheses being expanded; run: [B, K] -> (log-probability of every (token,
    duration) [B, K, V, D], the frames each moves on [B, K, V, D], greedy's pick [B, K] as token * D + duration).
    ``zero`` / ``one``: the indices of durations 0 and 1 (None: not among them)."""
    b, k, _ = logits.shape
    v, d = model.vocab_size, durations.shape[0]
    token_lp = logits[..., :v].log_softmax(-1)[..., None]
    duration_lp = logits[..., v:].log_softmax(-1)[:, :, None, :].expand(b, k, v, d)
    must_move = torch.zeros(b, k, v, dtype=torch.bool, device=logits.device)
    must_move[..., model.blank_id] = True
    must_move |= (run + 1 >= max_symbols)[..., None]  # NeMo's guard, as greedy decoding applies it
    advance = torch.where(must_move[..., None] & (durations == 0), 1, durations.expand(b, k, v, d))
    # Greedy's pick, taken as TDTGreedy's rule takes it (the argmax of the logits), so beam 1 is greedy exactly.
    token, duration = logits[..., :v].argmax(-1), logits[..., v:].argmax(-1)
    if zero is not None and one is not None:
        # Where staying is not allowed, duration 0 is duration 1's move: one candidate, scored by the likelier
        # (greedy's pick when duration 0 is its argmax).
        merged = torch.maximum(duration_lp[..., zero], duration_lp[..., one])
        duration_lp = duration_lp.clone()
        duration_lp[..., one] = torch.where(must_move, merged, duration_lp[..., one])
        duration_lp[..., zero] = torch.where(must_move, _NEG_INF, duration_lp[..., zero])
        greedy_moves = (token == model.blank_id) | (run + 1 >= max_symbols)
        duration = torch.where(greedy_moves & (duration == zero), one, duration)
    return token_lp + duration_lp, advance, token * d + duration


def _rank(hyps: _Buckets, t: int, lengths: torch.Tensor, score: torch.Tensor, lands: torch.Tensor,
          protected: torch.Tensor, moves: torch.Tensor,
          boost: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ranks frame ``t``'s expansions into the buckets they land on.

    score / lands / protected: [B, 1, N] the expansions' scores (-inf: none), frames moved (0: another round on
    this frame) and whether it is greedy's; moves: [M] the moves a hypothesis can make (durations, 0 as 1);
    boost: [B, 1, N] the hotword boost each expansion holds (None: no hotwords), added to the ranking.
    -> per bucket, in frame order t, t + 1, ... ([B, S, K] each): the kept scores, their index among the
    bucket's present hypotheses (< K) and the expansions (K + n), and whether each is greedy's path."""
    b, s, k = hyps.score.shape
    order = (t + torch.arange(s, device=score.device)) % s
    present = hyps.score[:, order]
    # The current frame's hypotheses are all expanded; a row past its frames keeps its finished ones as they are.
    present[:, 0] = torch.where((lengths > t)[:, None], _NEG_INF, present[:, 0])
    to = torch.arange(s, device=score.device)[None, :, None]
    pool = torch.cat([present, torch.where(lands == to, score, _NEG_INF)], dim=2)  # [B, S, K + N]
    greedy = torch.cat([hyps.greedy[:, order], protected & (lands == to)], dim=2) & (pool > _NEG_INF)
    ranked = pool
    if boost is not None:
        ranked = pool + torch.cat([hyps.context_score[:, order], boost.expand(b, s, -1)], dim=2)
    # Greedy's path ranks first in its bucket; with one beam nothing else is kept.
    key = torch.where(greedy, _INF, ranked if k > 1 else _NEG_INF)
    top, index = key.topk(k, dim=2)
    kept = top > _NEG_INF
    score, greedy = torch.where(kept, pool.gather(2, index), _NEG_INF), greedy.gather(2, index) & kept
    if boost is not None:  # a stay can earn a boost: no cut is exact
        return score, index, greedy
    # A hypothesis staying on the frame only loses log-probability from here and lands within the longest move,
    # so one below the last kept score of every bucket it can land on could never be kept there: it is dropped
    # now (an exact cut), or every frame would run max_symbols rounds of hopeless tokens.
    floor = score.amin(dim=2)  # [B, S]: -inf while a bucket has room
    lands_on = torch.minimum(moves[None, :], (lengths - t).clamp(min=1)[:, None])  # [B, M]
    hopeless = (score[:, 0] < floor.gather(1, lands_on).amin(dim=1)[:, None]) & (index[:, 0] >= k) & ~greedy[:, 0]
    score[:, 0] = torch.where(hopeless, _NEG_INF, score[:, 0])
    return score, index, greedy


def _round(model: TDTModel, hyps: _Buckets, frames: torch.Tensor, t: int, lengths: torch.Tensor,
           durations: torch.Tensor, max_symbols: int, zero: int | None, one: int | None,
           context: ContextGraph | None = None) -> _Buckets:
    """One round on frame ``t``: its bucket's hypotheses take every (token, duration); each bucket keeps its
    ``K`` best of what it held and what lands on it. frames: [B, T, H]; lengths: [B]; durations: [D]."""
    moves = durations.clamp(min=1)
    b, s, k = hyps.score.shape
    v, d = model.vocab_size, durations.shape[0]
    device = frames.device
    current = t % s
    out = _feed_pending(model, hyps, current)
    logits = model.joint(frames[:, t, None].expand(b, k, -1).reshape(b * k, -1), out).float().view(b, k, -1)
    lp, advance, pick = _expansions(model, logits, hyps.run[:, current], durations, max_symbols, zero, one)
    parent_score = hyps.score[:, current]
    open_ = (lengths > t)[:, None] & (parent_score > _NEG_INF)
    score = torch.where(open_[..., None, None], parent_score[..., None, None] + lp, _NEG_INF)
    # A move past the row's last frame lands on the frame after it, where the finished hypotheses gather.
    lands = torch.minimum(advance, (lengths - t).clamp(min=0)[:, None, None, None])
    protected = hyps.greedy[:, current, :, None] & (torch.arange(v * d, device=device) == pick[..., None])
    boost = None
    if context is not None:  # what each (token, duration) would hold: a blank keeps its parent's boost
        gain = context.gain[hyps.context_state[:, current]].masked_fill(
            torch.arange(v, device=device) == model.blank_id, 0.0)  # [B, K, V]
        boost = (hyps.context_score[:, current, :, None] + gain)[..., None].expand(b, k, v, d).reshape(b, 1, -1)
    new_score, index, greedy = _rank(hyps, t, lengths, score.reshape(b, 1, -1), lands.reshape(b, 1, -1),
                                     protected.reshape(b, 1, -1), moves, boost)
    # Back from frame order (t, t + 1, ...) to bucket order, then every field is one gather of its source slot.
    by_bucket = (torch.arange(s, device=device) - t) % s
    new_score, index, greedy = new_score[:, by_bucket], index[:, by_bucket], greedy[:, by_bucket]
    expanded = index >= k
    n = (index - k).clamp(min=0)
    token = (n // d) % v
    source_bucket = torch.where(expanded, current, torch.arange(s, device=device)[None, :, None])
    source = (torch.arange(b, device=device)[:, None, None] * s + source_bucket) * k
    source = (source + torch.where(expanded, n // (v * d), index)).reshape(-1)
    emit = expanded & (new_score > _NEG_INF) & (token != model.blank_id)
    run, count, pending, context_state, context_score = (
        field.reshape(-1)[source].view(b, s, k)
        for field in (hyps.run, hyps.count, hyps.pending, hyps.context_state, hyps.context_score))
    if context is not None:
        context_state, context_score = context.advance(context_state, context_score, token, emit)
    stays = expanded & (torch.arange(s, device=device)[None, :, None] == current)
    run = torch.where(stays, run + 1, torch.where(expanded, 0, run))
    pending = torch.where(expanded, torch.where(emit, token, -1), pending)
    tokens = hyps.tokens.view(b * s * k, -1)[source].view(b, s, k, -1)
    tokens.scatter_(3, count[..., None], torch.where(emit, token, -1)[..., None])  # slot `count` is unused
    predictor = {name: rows[source] for name, rows in hyps.predictor.items()}
    return _Buckets(new_score, run, count + emit.long(), pending, greedy, context_state, context_score, tokens,
                    predictor)


def tdt_beam_search(model: TDTModel, encoder_output: EncoderOutput, beam_size: int, max_symbols: int,
                    context: ContextGraph | None = None) -> tuple[list[list[int]], torch.Tensor]:
    """encoder_output: hidden [B, T, D], lengths [B] -> (best token ids per row, their log-probability [B]).
    With ``context``, the best is the hypothesis whose score plus completed phrases' boost is highest."""
    frames = model.project_encoder(encoder_output.hidden)
    b, t, _ = frames.shape
    device = frames.device
    lengths = encoder_output.lengths.to(device)
    durations = torch.tensor(model.durations, dtype=torch.long, device=device)
    zero, one = (model.durations.index(n) if n in model.durations else None for n in (0, 1))
    num_buckets = max(1, *model.durations) + 1  # frames t .. t + longest move
    # Each frame holds at most max_symbols tokens; the extra slot takes the writes of steps that emit nothing.
    hyps = _Buckets.start(model, b, num_buckets, beam_size, t * max_symbols + 1, device)
    for frame in range(t):
        # A round's expansions stay on the frame only as tokens, at most max_symbols of them: a bound on rounds.
        for _ in range(max_symbols):
            current = hyps.score[:, frame % num_buckets] > _NEG_INF
            if not bool((current & (lengths > frame)[:, None]).any()):  # one host sync a round
                break
            hyps = _round(model, hyps, frames, frame, lengths, durations, max_symbols, zero, one, context)
    rows = torch.arange(b, device=device)
    finished = lengths % num_buckets  # the bucket of the frame after each row's last
    score = hyps.score[rows, finished]  # [B, K]
    rank = score
    if context is not None:  # an unfinished phrase gives its boost back
        rank = score + context.kept(hyps.context_state[rows, finished], hyps.context_score[rows, finished])
    best = rank.argmax(dim=1)
    chosen = hyps.tokens[rows, finished, best].cpu()  # the one read-back of the tokens
    counts = hyps.count[rows, finished, best].tolist()
    return [row[:n].tolist() for row, n in zip(chosen, counts, strict=True)], score.gather(1, best[:, None])[:, 0]


@DECODE_STRATEGIES.register("tdt_beam")
class TDTBeam(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = True  # serves DecodeOptions.beam_size
    biases: ClassVar[bool] = True  # and its hotwords

    def __init__(self, options: TransducerBeamOptions | None = None, contexts: ContextGraphCache | None = None) -> None:
        # the RNN-T beam's options: beam size, symbols per frame and hotwords mean the same here
        self.options = options or TransducerBeamOptions()
        if self.options.hotwords and contexts is None:
            raise ValueError("hotwords need the runner's ContextGraphCache (contexts)")
        self.contexts = contexts

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple[Hotword, ...] = (),
                 contexts: ContextGraphCache | None = None) -> TDTBeam:
        return cls(TransducerBeamOptions(beam_size=beam_size, hotwords=hotwords), contexts)

    def decode(self, model: TDTModel, encoder_output: EncoderOutput) -> list[list[int]]:
        max_symbols = self.options.max_symbols_per_step or model.max_symbols_per_step
        context = None
        if self.options.hotwords:
            context = self.contexts.get(self.options.hotwords, model.vocab_size, encoder_output.hidden.device)
        ids, _ = tdt_beam_search(model, encoder_output, self.options.beam_size, max_symbols, context)
        return ids
