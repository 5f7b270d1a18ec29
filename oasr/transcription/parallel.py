"""Parallel long-form windows that cover their audio: a window whose decode stops short is continued.

A 30 s window decoded on its own may stop before its end: its last complete segment closes at 23 s and
end-of-text follows, or the decoder writes "3." and stops; the speech after that point is never decoded.
openai-whisper's sequential loop loses none of it, because its next window starts at the last closed timestamp.
Parallel windows apply that rule inside each window: a decode that did not end on a lone timestamp drops the
tokens after its last closed timestamp pair, and a follow-up request decodes the window's audio from that
timestamp to the window's end (conditioned on the text the window has so far), until the window is covered.
Follow-ups of every window go through the engine together, as the windows themselves do, so the batch stays
parallel; a window needs at most one or two of them, each only a few seconds of audio.

Continuation rather than overlapping windows merged afterwards: a merge has to align two texts that disagree
exactly where they overlap (a word cut by the boundary, one sentence punctuated two ways), and it does not help
a window whose decode stops in its middle; a continuation needs only the timestamps the decoder already wrote,
costs an encoder pass only where a window stopped short, and keeps each word in one place.

Each decode is checked as openai-whisper checks its windows (``FallbackOptions``, with ``needs_fallback`` and
``is_silence`` of the sequential loop): text that is improbable, or that repeats itself in a decode that ran
out of tokens (a loop), is decoded again at the next fallback temperature, and when no temperature passes the
likeliest decode is kept; a decode where ``<|nospeech|>`` is likely and the text improbable is silence, gives
no text and covers the rest of its window. Two departures from openai-whisper, both for speech that truly
repeats itself (its text compresses as a loop does): a decode that ended by itself is not retried for its
compression alone, and a window that fails at every temperature keeps its likeliest decode, not the last.
Audio that is digital silence (every sample rounds to zero in 16-bit PCM) is not decoded at all: Whisper writes
"you" into zeros with a log-probability no threshold rejects.

These rules need timestamp tokens, so windows carry them whenever timestamps are asked for and in every input
longer than one window, whatever the output format. A lone window decoded without timestamps is decoded once,
as asked (openai-whisper's ``decode()``, and a server can stream its tokens as they come), and only dropped
when it is silence. Host logic only: requests in, ``RequestOutput`` back, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from oasr.audio import SAMPLE_RATE
from oasr.engine.request import FinishReason, RequestOutput
from oasr.transcription.results import DecodedWindow, segment_of, timestamp_begin_of, window_spans
from oasr.transcription.segments import HOP_SAMPLES, TokenSpan, compression_ratio, split_window
from oasr.transcription.fallback import HIGH_TEMPERATURE, is_silence, needs_fallback
from oasr.types import DecodeOptions, FallbackOptions, Segment, word_search_fields

SILENT_AMPLITUDE = 1 / 32768  # one step of 16-bit PCM: quieter audio holds no recorded sound


def is_digital_silence(samples: np.ndarray) -> bool:
    return samples.size == 0 or float(np.abs(samples).max()) < SILENT_AMPLITUDE


@dataclass(frozen=True)
class CoverPlan:
    """How the windows of one input are decoded. ``options``: every window's first decode (its prompt, beam
    and language as asked); ``fallback``: the temperatures and thresholds each decode is checked against;
    ``segments_from_timestamps``: the result's segments are the timestamp tokens' (else one per window)."""

    options: DecodeOptions
    fallback: FallbackOptions
    segments_from_timestamps: bool
    condition_on_previous_text: bool = True
    prompt_token_ids: tuple[int, ...] = ()  # the user's prompt as tokens, which follow-ups are conditioned on too

    @property
    def continued(self) -> bool:
        return self.options.timestamps


def cover_plan(tokenizer, options: DecodeOptions, fallback: FallbackOptions, *, num_windows: int,
               serves_timestamps: bool, condition_on_previous_text: bool = True) -> CoverPlan:
    """The plan for an input of ``num_windows`` windows (offline and the server build it alike, so that they
    decode alike): timestamps when asked, or when the input is long and the model serves them."""
    timestamps = options.timestamps or (num_windows > 1 and serves_timestamps)
    prompt_ids = options.prompt_token_ids
    if options.prompt:  # as the prompter tokenizes a text prompt
        prompt_ids = tuple(tokenizer.encode(" " + options.prompt.strip()))
    return CoverPlan(replace(options, timestamps=timestamps), fallback, segments_from_timestamps=options.timestamps,
                     condition_on_previous_text=condition_on_previous_text, prompt_token_ids=prompt_ids)


def window_covers(tokenizer, spans: list[tuple[int, int]], samples: np.ndarray, plan: CoverPlan) -> list[WindowCover]:
    return [WindowCover(tokenizer, i, start, end, samples, plan) for i, (start, end) in enumerate(spans)]


@dataclass(frozen=True)
class PieceRequest:
    """One decode of part of a window: samples ``[start, end)`` of the input."""

    start: int
    end: int
    options: DecodeOptions


@dataclass(frozen=True)
class Continuation:
    """What one accepted timestamped decode keeps: ``tokens[:num_kept]`` as ``spans``, and how many samples of
    the piece they cover (None: the whole piece, nothing to continue)."""

    num_kept: int
    spans: tuple[TokenSpan, ...]
    resume_samples: int | None


def plan_continuation(tokens: list[int], timestamp_begin: int, piece_samples: int) -> Continuation:
    """openai-whisper's seek rule for one decode of a piece of ``piece_samples``: continue from the last closed
    timestamp pair unless the decode ended on a lone timestamp, held no pair, or closed no time at all (a pair
    at 0 s would continue forever); what is not continued keeps its unfinished last segment."""
    piece_s = piece_samples / SAMPLE_RATE
    split = split_window(tokens, timestamp_begin, piece_s)
    consumed = split.consumed_frames
    if consumed and consumed * HOP_SAMPLES < piece_samples:
        return Continuation(split.spans[-1].stop, split.spans, consumed * HOP_SAMPLES)
    return Continuation(len(tokens), tuple(window_spans(tokens, timestamp_begin, piece_s)), None)


class WindowCover:
    """One window's decodes until its audio is covered: ``next_request()`` gives the decode to run (None once
    the window is covered), ``accept(output)`` applies its result; ``result()`` is the window decoded."""

    def __init__(self, tokenizer, index: int, start: int, end: int, samples: np.ndarray, plan: CoverPlan) -> None:
        self.tokenizer = tokenizer
        self.index = index
        self.start, self.end = start, end
        self.samples = samples  # the whole input; the window reads samples[start:end]
        self.plan = plan
        self.timestamp_begin = timestamp_begin_of(tokenizer) if plan.continued else None
        self.cursor = start  # samples before it are covered
        self.attempt = 0  # index into the fallback temperatures
        self.best: tuple[RequestOutput, int] | None = None  # the likeliest failed decode and its attempt
        self.language = plan.options.language
        self.token_ids: list[int] = []  # every decode's kept tokens, timestamps included
        self.segments: list[Segment] = []
        self.previous: list[int] = []  # the window's text so far, which a follow-up is conditioned on
        self.first: Segment | None = None  # the first decode's details, for a window-wide segment
        self._skip_silence()

    @property
    def done(self) -> bool:
        return self.cursor >= self.end

    def _skip_silence(self) -> None:
        if not self.done and is_digital_silence(self.samples[self.cursor : self.end]):
            self.cursor = self.end

    def _temperature(self) -> float:
        return self.plan.fallback.temperatures[self.attempt]

    def next_request(self) -> PieceRequest | None:
        if self.done:
            return None
        base, temperature = self.plan.options, self._temperature()
        search = temperature == 0 and base.beam_size is not None
        # Word-level fields go with the beam: a sampled window drops them as it drops beam_size.
        options = replace(base, temperature=temperature, beam_size=base.beam_size if search else None,
                          patience=base.patience if search else None,
                          length_penalty=base.length_penalty if search else None,
                          **word_search_fields(base, keep=search))
        if self.cursor > self.start:  # a follow-up: the window's language, conditioned on its text so far
            previous = tuple(self.previous) if self.plan.condition_on_previous_text else ()
            options = replace(options, language=self.language, prompt=None,
                              prompt_token_ids=self.plan.prompt_token_ids + previous)
        return PieceRequest(self.cursor, self.end, options)

    def _ratio(self, output: RequestOutput) -> float:
        return compression_ratio(self.tokenizer.decode(list(output.token_ids)).strip())

    def _settled(self, output: RequestOutput) -> RequestOutput | None:
        """The decode to keep, or None while the next fallback temperature is to be tried. Families that report
        no log-probabilities, and windows decoded once as asked, keep what they decoded."""
        if output.avg_logprob is None or not self.plan.continued:
            return output
        fallback = self.plan.fallback
        if output.finish_reason != FinishReason.LENGTH:
            # A decode that ended by itself did not loop, however well its text compresses: speech that repeats
            # itself decodes to such text, and sampling it again only garbles it.
            fallback = replace(fallback, compression_ratio_threshold=None)
        if not needs_fallback(fallback, self._ratio(output), output.avg_logprob, output.no_speech_prob or 0.0):
            return output
        if self.best is None or output.avg_logprob > self.best[0].avg_logprob:
            self.best = (output, self.attempt)
        if self.attempt + 1 < len(self.plan.fallback.temperatures):
            self.attempt += 1
            return None
        # No temperature passed: keep the likeliest decode. openai-whisper keeps the last, the most random one,
        # which for speech that truly repeats itself (its text compresses well) throws the right text away.
        output, self.attempt = self.best
        return output

    def accept(self, output: RequestOutput) -> None:
        settled = self._settled(output)
        if settled is None:
            return
        output, temperature = settled, self._temperature()
        self.attempt, self.best = 0, None
        tokens, ratio = list(output.token_ids), self._ratio(output)
        avg_logprob, no_speech_prob = output.avg_logprob, output.no_speech_prob or 0.0
        self.language = self.language or output.language
        if avg_logprob is not None and is_silence(self.plan.fallback, avg_logprob, no_speech_prob):
            self.cursor = self.end
            return
        details = {"temperature": temperature, "avg_logprob": avg_logprob, "compression_ratio": ratio,
                   "no_speech_prob": output.no_speech_prob}
        offset_s, piece_s = self.cursor / SAMPLE_RATE, (self.end - self.cursor) / SAMPLE_RATE
        if self.timestamp_begin is None:
            kept, spans, resume = tokens, (TokenSpan(0, len(tokens), 0.0, piece_s),), None
        else:
            plan = plan_continuation(tokens, self.timestamp_begin, self.end - self.cursor)
            kept, spans, resume = tokens[: plan.num_kept], plan.spans, plan.resume_samples
        segments = [segment_of(self.tokenizer, tokens, span, offset_s, **details) for span in spans]
        if self.first is None:
            self.first = Segment(self.start / SAMPLE_RATE, self.end / SAMPLE_RATE, "", **details)
        self.segments += [s for s in segments if s.text]
        self.token_ids += kept
        self.previous = [] if temperature > HIGH_TEMPERATURE else self.previous + kept
        self.cursor = self.end if resume is None else self.cursor + resume
        self._skip_silence()

    def result(self) -> DecodedWindow:
        """The window as decoded; its text is that of all its tokens at once, as a server streams it."""
        start_s, end_s = self.start / SAMPLE_RATE, self.end / SAMPLE_RATE
        text = self.tokenizer.decode(self.token_ids)
        segments = tuple(self.segments)
        if not self.plan.segments_from_timestamps:  # one segment for the window, with its first decode's details
            whole = self.first or Segment(start_s, end_s, "")
            segments = (replace(whole, text=text.strip(), token_ids=tuple(self.token_ids),
                                compression_ratio=compression_ratio(text.strip())),) if text.strip() else ()
        return DecodedWindow(index=self.index, start_sample=self.start, start_s=start_s, end_s=end_s,
                             token_ids=list(self.token_ids), text=text, language=self.language, segments=segments)
