"""Word timestamps for Whisper from the cross-attention of its alignment heads (openai-whisper's recipe, batched).

For each row, one teacher-forced decoder pass over ``<|sot|> [<|lang|> <|task|>] <|notimestamps|> text
<|endoftext|>`` in which a ``CrossAttentionProbe`` reads the alignment heads' attention logits. Then, per row:
softmax over the window's audio frames, each head standardised over tokens, a median filter along time, the
mean over heads. Dynamic time warping through the negated matrix (all rows at once, one anti-diagonal per
step, on the model's device) gives the frame at which each token starts; a word spans from its first token's
start to the next word's (``words.py`` groups tokens into words and adjusts the times).

Rows are whatever the caller decoded: only the rows that asked for word timestamps are passed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from oasr.layers.cache import DenseCross, FullContext
from oasr.models.aligners import WORD_ALIGNERS
from oasr.models.base import AlignmentRow, TextSpan
from oasr.models.whisper.alignment_probe import CrossAttentionProbe
from oasr.models.whisper.prompt import WhisperPrompter
from oasr.models.whisper.words import (
    APPEND_PUNCTUATION,
    PREPEND_PUNCTUATION,
    TimedSegment,
    WordTiming,
    place_words,
    split_words,
)
from oasr.tokenizers.whisper import WhisperTokenizer
from oasr.types import DecodeOptions, Task, Word

SAMPLE_RATE = 16_000
HOP_LENGTH = 160
FEATURE_FRAME_S = HOP_LENGTH / SAMPLE_RATE
ENCODER_STRIDE = 2  # the encoder's second convolution halves the frame rate
ALIGNMENT_STEPS_PER_S = SAMPLE_RATE // (HOP_LENGTH * ENCODER_STRIDE)  # 50: one encoder position per 20 ms


@dataclass(frozen=True)
class WordTimingOptions:
    median_filter_width: int = 7  # odd; frames of encoder output (20 ms each)
    qk_scale: float = 1.0  # multiplies the attention logits before the softmax over frames
    prepend_punctuations: str = PREPEND_PUNCTUATION
    append_punctuations: str = APPEND_PUNCTUATION
    max_rows: int = 16  # rows per decoder pass (bounds the cross K/V and attention memory)

    def __post_init__(self) -> None:
        if self.median_filter_width < 1 or self.median_filter_width % 2 == 0:
            raise ValueError(f"median_filter_width must be a positive odd number, got {self.median_filter_width}")
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")


@WORD_ALIGNERS.register("whisper")
class WhisperAligner:
    """Whisper's ``WordAligner``: alignment heads, median filter and DTW, openai-whisper's word rules."""

    @staticmethod
    def align_words(loaded, rows: Sequence[AlignmentRow], features: torch.Tensor) -> list[list[Word]]:
        return word_timings(loaded.model, loaded.tokenizer, rows, features=features)

    @staticmethod
    def window_words(loaded, rows: Sequence[AlignmentRow], features: torch.Tensor) -> list[list[WordTiming]]:
        return row_alignments(loaded.model, loaded.tokenizer, rows, features=features)

    @staticmethod
    def place_words(words: list[WordTiming], spans: Sequence[TextSpan], time_offset: float,
                    last_speech_end: float) -> tuple[list[TimedSegment], float]:
        return place_words(words, spans, time_offset, last_speech_end)


def frames_of(num_samples: int, max_frames: int) -> int:
    """Feature frames holding ``num_samples`` of 16 kHz audio, capped at one window."""
    return min(num_samples // HOP_LENGTH, max_frames)


def word_timings(
    model,
    tokenizer: WhisperTokenizer,
    rows: Sequence[AlignmentRow],
    *,
    features: torch.Tensor | None = None,
    encoder_out: torch.Tensor | None = None,
    cross_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    options: WordTimingOptions | None = None,
) -> list[list[Word]]:
    """The words of every row, in order. Pass the rows' audio as exactly one of ``features`` [B, mels, frames],
    ``encoder_out`` [B, S, d_model] or ``cross_kv`` (each [layers, B, H, S, D])."""
    segments = align_words(
        model, tokenizer, rows, features=features, encoder_out=encoder_out, cross_kv=cross_kv, options=options
    )
    return [[w for segment in row for w in segment.words] for row in segments]


@torch.inference_mode()
def align_words(
    model,
    tokenizer: WhisperTokenizer,
    rows: Sequence[AlignmentRow],
    *,
    features: torch.Tensor | None = None,
    encoder_out: torch.Tensor | None = None,
    cross_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    options: WordTimingOptions | None = None,
) -> list[list[TimedSegment]]:
    """Like ``word_timings``, keeping each row's segments (bounds adjusted to their words, as openai-whisper's
    ``transcribe`` does)."""
    options = options or WordTimingOptions()
    alignments = row_alignments(
        model, tokenizer, rows, features=features, encoder_out=encoder_out, cross_kv=cross_kv, options=options
    )
    placed, speech_end = [], 0.0
    for row, alignment in zip(rows, alignments, strict=True):
        last = speech_end if row.last_speech_end is None else row.last_speech_end
        segments, speech_end = _place(tokenizer, row, alignment, last, options)
        placed.append(segments)
    return placed


@torch.inference_mode()
def row_alignments(
    model,
    tokenizer: WhisperTokenizer,
    rows: Sequence[AlignmentRow],
    *,
    features: torch.Tensor | None = None,
    encoder_out: torch.Tensor | None = None,
    cross_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    options: WordTimingOptions | None = None,
) -> list[list[WordTiming]]:
    """Each row's words in window seconds, before any adjustment (``words.place_words`` adjusts and places
    them); the audio is passed as for ``word_timings``."""
    options = options or WordTimingOptions()
    sources = [x for x in (features, encoder_out, cross_kv) if x is not None]
    if len(sources) != 1:
        raise ValueError("pass exactly one of features, encoder_out or cross_kv")
    num_rows = (cross_kv[0].shape[1] if cross_kv is not None else sources[0].shape[0])
    if num_rows != len(rows):
        raise ValueError(f"{len(rows)} rows but the audio input holds {num_rows}")
    alignments: list[list[WordTiming]] = []
    for start in range(0, len(rows), options.max_rows):
        chunk = slice(start, start + options.max_rows)
        if cross_kv is not None:
            k, v = cross_kv[0][:, chunk], cross_kv[1][:, chunk]
        else:
            encoded = model.encode(features[chunk]).hidden if features is not None else encoder_out[chunk]
            k, v = model.cross_kv(encoded)
        alignments.extend(find_alignments(model, tokenizer, rows[chunk], k, v, options))
    return alignments


def _place(tokenizer: WhisperTokenizer, row: AlignmentRow, alignment: list[WordTiming], last_speech_end: float,
           options: WordTimingOptions) -> tuple[list[TimedSegment], float]:
    text = [t for t in row.token_ids if t < tokenizer.special.eot]
    spans = row.spans or (TextSpan(row.time_offset, row.time_offset + row.num_frames * FEATURE_FRAME_S, len(text)),)
    if sum(s.num_tokens for s in spans) != len(text):
        raise ValueError(f"spans hold {sum(s.num_tokens for s in spans)} text tokens, the row has {len(text)}")
    segments, speech_end = place_words(
        alignment, spans, row.time_offset, last_speech_end,
        prepend=options.prepend_punctuations, append=options.append_punctuations,
    )
    # Like openai-whisper's transcribe: a segment without length or without text keeps no words.
    bounds = np.cumsum([0] + [s.num_tokens for s in spans])
    kept = [
        segment
        if segment.start != segment.end and tokenizer.decode(text[a:b]).strip()
        else TimedSegment(segment.start, segment.end, ())
        for segment, a, b in zip(segments, bounds[:-1], bounds[1:], strict=True)
    ]
    return kept, speech_end


@torch.inference_mode()
def find_alignments(
    model,
    tokenizer: WhisperTokenizer,
    rows: Sequence[AlignmentRow],
    cross_k: torch.Tensor,
    cross_v: torch.Tensor,
    options: WordTimingOptions,
) -> list[list[WordTiming]]:
    """Words with times in window seconds, before any adjustment, for rows whose cross K/V are given
    (each [layers, len(rows), H, S, D]). Rows without text or without audio get no words and cost nothing."""
    special = tokenizer.special
    prompter = WhisperPrompter(model.config, tokenizer, "model")
    texts = [[t for t in row.token_ids if t < special.eot] for row in rows]
    live = [i for i, (row, text) in enumerate(zip(rows, texts, strict=True)) if text and row.num_frames // 2 > 0]
    result: list[list[WordTiming]] = [[] for _ in rows]
    if not live:
        return result
    prompts = [
        prompter.prompt(DecodeOptions(language=rows[i].language, task=rows[i].task), None).token_ids
        for i in live
    ]
    max_positions = model.config.max_target_positions
    sequences = []
    for i, prompt in zip(live, prompts, strict=True):
        sequence = [*prompt, *texts[i], special.eot]
        # A text that filled every decoder position leaves no room for <|endoftext|>; its query row is never
        # read, it only joins the per-head standardisation.
        sequences.append(sequence if len(sequence) <= max_positions else sequence[:-1])
    index = torch.tensor(live, device=cross_k.device)
    scores, hidden = _alignment_pass(
        model, sequences, cross_k.index_select(1, index), cross_v.index_select(1, index), special.eot
    )
    matrices, probabilities = [], []
    for b, (i, prompt, sequence) in enumerate(zip(live, prompts, sequences, strict=True)):
        first = len(prompt) - 1  # the <|notimestamps|> position predicts the first text token
        num_text = len(texts[i])
        frames = rows[i].num_frames // 2
        weights = scores[b, :, : len(sequence), :frames]
        matrices.append(_attention_matrix(weights, options)[first : first + num_text + 1])
        logits = model.proj_out(hidden[b, first : first + num_text])[:, : special.eot]
        chosen = torch.tensor(texts[i], device=logits.device)[:, None]
        probabilities.append(logits.softmax(dim=-1).gather(1, chosen)[:, 0].tolist())
    for b, (text_indices, time_indices) in enumerate(dtw([-m for m in matrices])):
        i = live[b]
        result[i] = _words(tokenizer, texts[i], rows[i].language, text_indices, time_indices, probabilities[b])
    return result


def _alignment_pass(
    model, sequences: list[list[int]], cross_k: torch.Tensor, cross_v: torch.Tensor, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced decoder pass over right-padded sequences (causal attention keeps padding out of the
    real positions) -> (alignment heads' logits float32 [B, h, T, S], hidden states [B, T, d_model])."""
    device = cross_k.device
    length = max(len(s) for s in sequences)
    tokens = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    for b, sequence in enumerate(sequences):
        tokens[b, : len(sequence)] = torch.tensor(sequence)
    tokens = tokens.to(device)
    positions = torch.arange(length, device=device).expand_as(tokens)
    probe = CrossAttentionProbe(model.config.word_alignment_heads, device)
    hidden = model.model.decoder(tokens, positions, FullContext(), DenseCross(cross_k, cross_v), probe)
    return probe.scores(), hidden


def _attention_matrix(weights: torch.Tensor, options: WordTimingOptions) -> torch.Tensor:
    """weights: one row's logits [heads, tokens, frames] -> filtered attention averaged over heads [tokens, frames]."""
    weights = (weights * options.qk_scale).softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, correction=0)
    weights = median_filter((weights - mean) / std, options.median_filter_width)
    return weights.mean(dim=0)


def median_filter(x: torch.Tensor, width: int) -> torch.Tensor:
    """Median over a sliding window of odd ``width`` along the last dimension of x [..., N] (at least 3-D),
    edges reflect-padded. Inputs too short to reflect are returned as they are."""
    half = width // 2
    if x.shape[-1] <= half:
        return x
    padded = F.pad(x, (half, half), mode="reflect")
    return padded.unfold(-1, width, 1).sort(dim=-1).values[..., half]


def dtw(costs: Sequence[torch.Tensor]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Cheapest monotonic path through each cost matrix [N_b, M_b] (all on one device) from the first cell to the
    last -> per matrix (row indices, column indices) along the path. openai-whisper's recurrence and tie-breaking:
    a diagonal step only when strictly cheapest, then a row step when strictly cheapest, else a column step.

    All matrices advance together, one anti-diagonal of the cost table per step. Each step is a handful of tiny
    ops, so the loop runs in numpy on CPU and in torch on an accelerator (where it is launch-bound)."""
    if not costs:
        return []
    device = costs[0].device
    num_rows = max(c.shape[0] for c in costs)
    num_cols = max(c.shape[1] for c in costs)
    padded = torch.full((len(costs), num_rows, num_cols), torch.inf, dtype=torch.float32, device=device)
    for b, cost in enumerate(costs):
        padded[b, : cost.shape[0], : cost.shape[1]] = cost
    skewed = _skew(padded)
    if device.type == "cpu":
        steps = _dtw_steps(skewed.numpy(), np.full(skewed.shape, 2, dtype=np.int8), np)
    else:
        steps = _dtw_steps(skewed, torch.full(skewed.shape, 2, dtype=torch.int8, device=device), torch).cpu().numpy()
    return [_backtrace(steps[b], c.shape[0], c.shape[1]) for b, c in enumerate(costs)]


def _skew(x: torch.Tensor) -> torch.Tensor:
    """x: [B, N, M] -> [B, N + M + 1, N + 1] where entry [b, d, i] is the cost of cell (i, d - i) of the
    (N+1) x (M+1) table, i.e. x[b, i - 1, d - i - 1]; the table's first row and column cost infinity."""
    batch, n, m = x.shape
    i = torch.arange(n + 1, device=x.device)
    col = torch.arange(n + m + 1, device=x.device)[:, None] - i - 1
    valid = (i >= 1) & (col >= 0) & (col < m)
    flat = torch.where(valid, (i - 1).clamp(min=0) * m + col.clamp(0, m - 1), 0)
    skewed = x.reshape(batch, n * m)[:, flat.reshape(-1)].reshape(batch, n + m + 1, n + 1)
    return torch.where(valid, skewed, torch.inf)


def _dtw_steps(skewed, steps, xp):
    """Fills the cost table one anti-diagonal at a time. skewed: float32 [B, D, N + 1] cell costs per
    anti-diagonal (see ``_skew``); steps: int8 [B, D, N + 1], filled with the step that reached each cell
    (0 diagonal, 1 from the row above, 2 from the column to the left). ``xp`` is numpy or torch, whichever
    holds the arrays. Cells past a matrix's own size cost infinity and never reach back into it."""
    batch, num_diagonals, _ = skewed.shape
    # Running cost per anti-diagonal, with a leading infinite column standing for row -1.
    table = xp.full((batch, num_diagonals, skewed.shape[2] + 1), xp.inf, dtype=skewed.dtype)
    if xp is torch:
        table = table.to(skewed.device)
    table[:, 0, 1] = 0.0  # the empty start cell (0, 0)
    for d in range(2, num_diagonals):
        c0 = table[:, d - 2, :-1]  # (i - 1, j - 1)
        c1 = table[:, d - 1, :-1]  # (i - 1, j)
        c2 = table[:, d - 1, 1:]  # (i, j - 1)
        diagonal = c0 < xp.minimum(c1, c2)
        up = c1 < xp.minimum(c0, c2)
        table[:, d, 1:] = skewed[:, d] + xp.where(diagonal, c0, xp.where(up, c1, c2))
        steps[:, d] = xp.where(diagonal, 0, xp.where(up, 1, 2))
    return steps


def _backtrace(steps: np.ndarray, n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """steps [D, N + 1] of one matrix -> (row indices, column indices) of its path from (0, 0) to (n-1, m-1)."""
    i, j = n, m
    rows, cols = [], []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        step = 2 if i == 0 else 1 if j == 0 else steps[i + j, i]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def _words(
    tokenizer: WhisperTokenizer,
    text: list[int],
    language: str | None,
    text_indices: np.ndarray,
    time_indices: np.ndarray,
    probabilities: list[float],
) -> list[WordTiming]:
    """Words from the DTW path: each token starts where the path first reaches its row."""
    words, word_tokens = split_words(tokenizer, [*text, tokenizer.special.eot], language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / ALIGNMENT_STEPS_PER_S
    return [
        WordTiming(word, tokens, float(jump_times[a]), float(jump_times[b]), float(np.mean(probabilities[a:b])))
        for word, tokens, a, b in zip(words, word_tokens, boundaries[:-1], boundaries[1:])
    ]
