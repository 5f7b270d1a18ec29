"""TDT (token-and-duration transducer) beam search on the device, batched over rows and beams.

A TDT joint predicts a token and, separately, how many frames to move on. Hypotheses then sit on different
frames, so the search is label-synchronous rather than frame-synchronous: each step expands every open
hypothesis by one (token, duration) pair at its own frame, scored by the token's plus the duration's
log-probability, and ranks those expansions together with the hypotheses that have finished their frames; the
``beam_size`` best are kept. After a step every hypothesis has made the same number of joint decisions (or has
finished), so scores compare like with like.

Greedy decoding's rules hold for every hypothesis: a blank never moves 0 frames (it moves 1), and after
``max_symbols_per_step`` tokens on one frame the hypothesis is moved one frame on. The best pair of one
hypothesis is the best token with the best duration (the scores add), so with one beam every step takes
greedy's choice and ``beam_size = 1`` gives greedy's tokens. Hypotheses are not merged; the score is the
log-probability of the hypothesis' own decisions.

Model contract: ``oasr.decode.transducer_greedy``'s TDT one, plus ``predictor_gather(state, index [N])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.pending import LaunchesEagerly
from oasr.decode.transducer_beam import TransducerBeamOptions
from oasr.decode.transducer_greedy import TDTModel
from oasr.types import Hotword

_NEG_INF = float("-inf")


@dataclass
class _Hypotheses:
    """[B, K] per row and beam (flattened to B * K rows for the predictor): score (-inf: empty slot), the frame
    it sits on, tokens emitted on that frame, tokens emitted so far and the tokens themselves ([B, K, L]); the
    predictor's output [B * K, H] and opaque state."""

    score: torch.Tensor
    position: torch.Tensor
    run: torch.Tensor
    count: torch.Tensor
    tokens: torch.Tensor
    predictor_out: torch.Tensor
    state: Any


def _expand(model: TDTModel, hyps: _Hypotheses, frames: torch.Tensor, lengths: torch.Tensor,
            durations: torch.Tensor, max_symbols: int, zero: int | None, one: int | None) -> _Hypotheses:
    """One label step: every open hypothesis takes one (token, duration); the ``K`` best of those and of the
    finished hypotheses are kept. frames: [B, T, H]; lengths: [B]; durations: [D] frames per duration output,
    ``zero`` / ``one`` the indices of durations 0 and 1 (None: not among them)."""
    b, k = hyps.score.shape
    v, d = model.vocab_size, durations.shape[0]
    blank = model.blank_id
    rows = torch.arange(b, device=frames.device)[:, None]
    open_ = (hyps.position < lengths[:, None]) & (hyps.score > _NEG_INF)
    at = frames[rows, hyps.position.clamp(max=frames.shape[1] - 1)]  # [B, K, H]
    logits = model.joint(at.reshape(b * k, -1), hyps.predictor_out).float()
    token_lp = logits[:, :v].log_softmax(-1).view(b, k, v, 1)
    duration_lp = logits[:, v:].log_softmax(-1).view(b, k, 1, d).expand(b, k, v, d)
    if zero is not None and one is not None:
        # Where staying is not allowed (a blank; a token past the frame's max_symbols), duration 0 moves one
        # frame, the same move as duration 1: the two are one candidate, scored by the likelier (greedy's pick
        # when duration 0 is its argmax), so no beam holds a duplicate.
        moved = torch.zeros(b, k, v, dtype=torch.bool, device=frames.device)
        moved[..., blank] = True
        moved |= (hyps.run + 1 >= max_symbols)[..., None]
        merged = torch.maximum(duration_lp[..., zero], duration_lp[..., one])
        duration_lp = duration_lp.clone()
        duration_lp[..., one] = torch.where(moved, merged, duration_lp[..., one])
        duration_lp[..., zero] = torch.where(moved, _NEG_INF, duration_lp[..., zero])
    expanded = torch.where(open_[..., None, None], hyps.score[..., None, None] + token_lp + duration_lp, _NEG_INF)
    finished = torch.where(open_, _NEG_INF, hyps.score)  # carried as they are
    score, index = torch.cat([expanded.reshape(b, k * v * d), finished], dim=1).topk(k, dim=1)
    is_step = index < k * v * d
    parent = torch.where(is_step, index // (v * d), index - k * v * d)
    token = torch.where(is_step, (index // d) % v, blank)
    advance = torch.where(is_step, durations[index % d], 0)
    emit = is_step & (token != blank)
    advance = torch.where(is_step & ~emit & (advance == 0), 1, advance)  # a blank never stays on its frame
    run = torch.where(emit & (advance == 0), hyps.run.gather(1, parent) + 1, 0)
    forced = run >= max_symbols  # NeMo's guard, as greedy decoding applies it
    advance = torch.where(forced, 1, advance)
    run = torch.where(forced, 0, torch.where(is_step, run, hyps.run.gather(1, parent)))
    count = hyps.count.gather(1, parent)
    tokens = hyps.tokens.gather(1, parent[..., None].expand(-1, -1, hyps.tokens.shape[2])).clone()
    tokens.scatter_(2, count[..., None], torch.where(emit, token, -1)[..., None])  # the last slot absorbs blanks
    flat_parent = (parent + rows * k).reshape(-1)
    state = model.predictor_gather(hyps.state, flat_parent)
    out = hyps.predictor_out[flat_parent]
    flat_emit = emit.reshape(-1)
    new_out, new_state = model.predictor_step(token.reshape(-1), state)
    out = torch.where(flat_emit[:, None], new_out, out)
    state = model.predictor_select(flat_emit, new_state, state)
    return _Hypotheses(score, hyps.position.gather(1, parent) + advance, run, count + emit.long(), tokens, out,
                       state)


def tdt_beam_search(model: TDTModel, encoder_output: EncoderOutput, beam_size: int,
                    max_symbols: int) -> tuple[list[list[int]], torch.Tensor]:
    """encoder_output: hidden [B, T, D], lengths [B] -> (best token ids per row, their log-probability [B])."""
    frames = model.project_encoder(encoder_output.hidden)
    b, t, _ = frames.shape
    k = beam_size
    device = frames.device
    lengths = encoder_output.lengths.to(device)
    durations = torch.tensor(model.durations, dtype=torch.long, device=device)
    zero, one = (model.durations.index(n) if n in model.durations else None for n in (0, 1))
    out, state = model.predictor_init(b * k, device)
    score = torch.full((b, k), _NEG_INF, device=device)
    score[:, 0] = 0.0
    zeros = torch.zeros(b, k, dtype=torch.long, device=device)
    # Each frame holds at most max_symbols tokens; the extra slot takes the writes of steps that emit nothing.
    tokens = torch.full((b, k, t * max_symbols + 1), -1, dtype=torch.long, device=device)
    hyps = _Hypotheses(score, zeros, zeros.clone(), zeros.clone(), tokens, out, state)
    # Every step moves an open hypothesis on or adds one of at most max_symbols tokens to its frame.
    for _ in range(t * (max_symbols + 1)):
        if not bool(((hyps.position < lengths[:, None]) & (hyps.score > _NEG_INF)).any()):  # one sync a step
            break
        hyps = _expand(model, hyps, frames, lengths, durations, max_symbols, zero, one)
    best = hyps.score.argmax(dim=1)
    chosen = hyps.tokens[torch.arange(b, device=device), best].cpu()  # the one read-back of the tokens
    counts = hyps.count.gather(1, best[:, None]).squeeze(1).tolist()
    return [row[:n].tolist() for row, n in zip(chosen, counts, strict=True)], hyps.score.gather(1, best[:, None])[:, 0]


@DECODE_STRATEGIES.register("tdt_beam")
class TDTBeam(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    searches: ClassVar[bool] = True  # serves DecodeOptions.beam_size (no hotwords: biases stays False)

    def __init__(self, options: TransducerBeamOptions | None = None) -> None:
        # the RNN-T beam's options: beam size and symbols per frame mean the same here; no hotwords
        self.options = options or TransducerBeamOptions()
        if self.options.hotwords:  # check_options refuses them first (biases is False); this guards direct callers
            raise ValueError("TDT beam search takes no hotwords")

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple[Hotword, ...] = (), contexts=None) -> TDTBeam:
        return cls(TransducerBeamOptions(beam_size=beam_size, hotwords=hotwords))

    def decode(self, model: TDTModel, encoder_output: EncoderOutput) -> list[list[int]]:
        max_symbols = self.options.max_symbols_per_step or model.max_symbols_per_step
        ids, _ = tdt_beam_search(model, encoder_output, self.options.beam_size, max_symbols)
        return ids
