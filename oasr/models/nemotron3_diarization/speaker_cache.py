"""The arrival-order speaker cache and the FIFO of recent encoder frames that every chunk attends to.

A chunk's step input is ``[cache frames, FIFO frames, look-back, chunk, look-ahead]``. After the step the chunk's
own frames join the FIFO; once the FIFO would overflow, at least ``update_period`` of its oldest frames move to
the cache, and a cache over ``speaker_cache_length`` is compressed: each speaker keeps its best-scored frames (in
their order) and ``silence_frames`` slots of the learned silence embedding. Speakers keep their index across
chunks because the cache carries frames of every speaker heard so far, ordered by speaker.

``CacheState`` holds a group of rows that share their frame counts (every row of an offline batch; streams at the
same point): the tensors per row, the counts once. The counts follow from the chunk sizes alone, so the host knows
them without reading the device. The algorithm and its constants are transformers'
``Nemotron3DiarizationSpeakerCache`` (written here in the engine's own terms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from oasr.models.nemotron3_diarization.config import SpeakerCacheConfig

LOG_HALF = math.log(0.5)


@dataclass(frozen=True)
class CachePolicy:
    """The cache's sizes and score policy, derived once from ``SpeakerCacheConfig`` and the FIFO's sizes (the
    offline forward and streams size the FIFO differently)."""

    fifo_length: int
    update_period: int
    cache_length: int
    silence_frames: int
    score_threshold: float
    latest_boost: float
    num_speakers: int
    factor: int
    min_positive_scores: int
    num_strong_boosted: int
    num_weak_boosted: int

    @classmethod
    def build(cls, config: SpeakerCacheConfig, fifo_length: int, update_period: int) -> CachePolicy:
        # each speaker's share of the cache beside its silence slots, which the boosts and the overlap rule spend
        budget = config.speaker_cache_length // config.num_speakers - config.speaker_cache_silence_frames_per_speaker
        return cls(fifo_length=fifo_length, update_period=update_period, cache_length=config.speaker_cache_length,
                   silence_frames=config.speaker_cache_silence_frames_per_speaker,
                   score_threshold=config.prediction_score_threshold, latest_boost=config.latest_frames_score_boost,
                   num_speakers=config.num_speakers, factor=config.subsampling_factor,
                   min_positive_scores=math.floor(budget * config.min_positive_scores_rate),
                   num_strong_boosted=math.floor(budget * config.strong_boost_rate),
                   num_weak_boosted=math.floor(budget * config.weak_boost_rate))

    def num_popped(self, num_fifo_frames: int) -> int:
        """Frames that leave a FIFO holding ``num_fifo_frames`` for the cache: none until it overflows."""
        if num_fifo_frames <= self.fifo_length:
            return 0
        return min(max(self.update_period, num_fifo_frames - self.fifo_length), num_fifo_frames)


@dataclass(frozen=True)
class CacheState:
    """embeds: [B, cache_length, D]; probs: [B, cache_length, speakers]; fifo: [B, fifo_length, D]; the first
    ``num_cache`` / ``num_fifo`` of each are filled. ``compressed``: the cache was compressed at least once (its
    frames are out of time order and keep the probabilities stored with them)."""

    embeds: torch.Tensor
    probs: torch.Tensor
    fifo: torch.Tensor
    num_cache: int = 0
    num_fifo: int = 0
    compressed: bool = False

    @classmethod
    def empty(cls, policy: CachePolicy, batch: int, hidden: int, device: torch.device,
              dtype: torch.dtype) -> CacheState:
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(batch, *shape, device=device, dtype=dtype)

        return cls(zeros(policy.cache_length, hidden), zeros(policy.cache_length, policy.num_speakers),
                   zeros(policy.fifo_length, hidden))

    @property
    def num_cached(self) -> int:
        return self.num_cache + self.num_fifo

    def frames(self) -> torch.Tensor:
        """The cached frames a step reads before its own, [B, num_cache + num_fifo, D]."""
        return torch.cat([self.embeds[:, : self.num_cache], self.fifo[:, : self.num_fifo]], dim=1)


def pool_probs(logits: torch.Tensor, mask: torch.Tensor | None, factor: int) -> torch.Tensor:
    """logits [B, T * factor, S] -> speaker probabilities per encoder frame [B, T, S], zero on masked frames."""
    probs = nn.functional.avg_pool1d(logits.sigmoid().transpose(1, 2), factor, factor).transpose(1, 2)
    return probs if mask is None else probs * mask[..., None].to(probs.dtype)


def push(policy: CachePolicy, state: CacheState, step_embeds: torch.Tensor, logits: torch.Tensor,
         silence: torch.Tensor, chunk_start: int, num_chunk: int, mask: torch.Tensor | None) -> CacheState:
    """The state after a step. step_embeds: the step's input [B, T, D] (cached frames first); logits: its
    [B, T * factor, S]; chunk frames [chunk_start, chunk_start + num_chunk) join the FIFO; mask: bool [B, T]."""
    nc, nf = state.num_cache, state.num_fifo
    probs = pool_probs(logits, mask, policy.factor).to(state.probs.dtype)
    fifo = torch.cat([state.fifo[:, :nf], step_embeds[:, chunk_start : chunk_start + num_chunk]], dim=1)
    popped = policy.num_popped(fifo.shape[1])
    embeds_out, probs_out, num_cache, compressed = state.embeds, state.probs, nc, state.compressed
    if popped:
        # look-back frames sit between the FIFO's frames and the chunk's: they are pushed once, with their chunk
        fifo_probs = torch.cat([probs[:, nc : nc + nf], probs[:, chunk_start : chunk_start + num_chunk]], dim=1)
        # an uncompressed cache holds frames in time order, re-scored by this step; a compressed one keeps its own
        stored = state.probs[:, :nc] if state.compressed else probs[:, :nc]
        cache_embeds = torch.cat([state.embeds[:, :nc], fifo[:, :popped]], dim=1)
        cache_probs = torch.cat([stored, fifo_probs[:, :popped]], dim=1)
        fifo = fifo[:, popped:]
        if cache_embeds.shape[1] > policy.cache_length:
            cache_embeds, cache_probs = compress(policy, cache_embeds, cache_probs, silence)
            compressed = True
        num_cache = cache_embeds.shape[1]
        embeds_out = torch.cat([cache_embeds, state.embeds[:, num_cache:]], dim=1)
        probs_out = torch.cat([cache_probs, state.probs[:, num_cache:]], dim=1)
    fifo_out = torch.cat([fifo, state.fifo[:, fifo.shape[1]:]], dim=1)
    return replace(state, embeds=embeds_out, probs=probs_out, fifo=fifo_out, num_cache=num_cache,
                   num_fifo=fifo.shape[1], compressed=compressed)


def frame_scores(policy: CachePolicy, probs: torch.Tensor) -> torch.Tensor:
    """[B, N, S] probabilities -> how much each frame tells about each speaker; -inf where the speaker is silent,
    and, for a speaker with enough clean frames, where it overlaps others."""
    floor = policy.score_threshold
    log_probs = torch.log(probs.clamp(min=floor))
    log_rest = torch.log((1.0 - probs).clamp(min=floor))
    scores = log_probs - log_rest + log_rest.sum(dim=-1, keepdim=True) - LOG_HALF
    speech = probs > 0.5
    scores = scores.masked_fill(~speech, float("-inf"))
    positive = scores > 0
    enough = positive.sum(dim=1, keepdim=True) >= policy.min_positive_scores
    return scores.masked_fill(~positive & speech & enough, float("-inf"))


def _boost(scores: torch.Tensor, count: int, boost: float) -> torch.Tensor:
    _, best = torch.topk(scores, count, dim=1, sorted=False)
    return scores.scatter_add(1, best, scores.new_full(best.shape, boost))


def compress(policy: CachePolicy, embeds: torch.Tensor, probs: torch.Tensor,
             silence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """embeds [B, N, D], probs [B, N, S] with N > cache_length -> the kept cache_length frames, grouped by
    speaker, in time order within a speaker; unused picks and the silence slots read the silence embedding."""
    b, n, s = probs.shape
    scores = frame_scores(policy, probs)
    scores[:, policy.cache_length :] += policy.latest_boost  # the frames just popped from the FIFO
    scores = _boost(scores, policy.num_strong_boosted, -2.0 * LOG_HALF)
    scores = _boost(scores, policy.num_weak_boosted, -LOG_HALF)
    scores = nn.functional.pad(scores, (0, 0, 0, policy.silence_frames), value=float("inf"))
    embeds = torch.cat([embeds, silence.to(embeds).view(1, 1, -1).expand(b, 1, -1)], dim=1)
    probs = nn.functional.pad(probs, (0, 0, 0, 1))
    num_scored = n + policy.silence_frames
    sentinel = num_scored * s
    flat = scores.transpose(1, 2).reshape(b, -1)  # speaker-major: sorting the picks groups them by speaker
    best, picks = torch.topk(flat, policy.cache_length, dim=1, sorted=False)
    picks, _ = torch.sort(picks.masked_fill(best == float("-inf"), sentinel), dim=1)
    frames = torch.where(picks == sentinel, n, (picks % num_scored).clamp(max=n))
    rows = torch.arange(b, device=probs.device)[:, None]
    return embeds[rows, frames], probs[rows, frames]
