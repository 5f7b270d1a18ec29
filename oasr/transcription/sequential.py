"""Sequential long-form transcription: openai-whisper's ``transcribe()`` loop, for many inputs at once.

Each input walks its audio one 30 s window at a time. A window starts where the previous one's last complete
segment ended (its last timestamp), is conditioned on the text decoded so far (``<|startofprev|>``, the newest
223 tokens), is decoded again at a higher temperature when its text repeats itself or its tokens are
improbable, and is skipped as silence when ``<|nospeech|>`` is likely. Features are sliced from one log-mel of
the whole input (openai-whisper normalises over the whole input and zero-pads the last window's features).

Each input has at most one window in the engine; many inputs proceed together, so the engine's batch stays
full. This is host-side logic: the engine sees ordinary requests carrying features and a prompt. With
``beam_size``, a window is beam-searched at temperature 0 and sampled at the fallback temperatures above it, as
openai-whisper's ``transcribe()`` does.

With ``word_timestamps``, each decoded window's segments are aligned to its features by the word aligner the
model's capability record names (``oasr.models.aligners``; Whisper's: alignment heads and DTW), all windows that finish in one engine step in one call, before the cursor
moves: a window that stops mid-speech is resumed from its last word's end rather than from its last timestamp,
and each window's first word is placed after where speech ended in the window before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from oasr.audio import SAMPLE_RATE, audio_duration
from oasr.engine.engine import ASREngine
from oasr.engine.request import RequestOutput
from oasr.transcription.fallback import HIGH_TEMPERATURE, is_silence, needs_fallback  # noqa: F401 (re-exported)
from oasr.transcription.results import segment_of
from oasr.transcription.segments import (
    FRAMES_PER_SECOND,
    HOP_SAMPLES,
    compression_ratio,
    ends_on_single_timestamp,
    split_window,
)
from oasr.errors import AudioDecodeError, UnsupportedOptionError
from oasr.models.aligners import WORD_ALIGNERS, WordAligner
from oasr.models.base import AlignmentRow, TextSpan
from oasr.models.capabilities import capabilities_of
from oasr.models.loader import LoadedModel
from oasr.types import (
    DecodeOptions,
    FallbackOptions,
    Segment,
    TranscribeOptions,
    Transcription,
)

@dataclass(frozen=True)
class WindowRequest:
    audio: np.ndarray
    features: torch.Tensor  # [n_mels, n_frames]
    options: DecodeOptions


def aligner_of(loaded: LoadedModel) -> WordAligner | None:
    """The word aligner the model's capability record names, or None for a model that times no words."""
    name = capabilities_of(type(loaded.model)).aligner
    return WORD_ALIGNERS.get(name) if name is not None else None


@dataclass(frozen=True)
class UnalignedWindow:
    """A decoded window waiting for its word timings before the cursor moves past it."""

    segments: list[Segment]  # every segment of the window, empty and instantaneous ones included
    features: torch.Tensor  # [n_mels, n_frames], the window's features as decoded
    num_frames: int  # feature frames that hold audio
    advance: int  # frames the cursor moves without word timings
    single_ending: bool  # the window ended on a lone timestamp: it is consumed whole whatever its words say
    temperature: float


class LongFormCursor:
    """One input's walk through its audio. ``next_request()`` -> the window to decode (None when done);
    ``accept(output)`` applies its result and moves the cursor."""

    def __init__(self, source: str, samples: np.ndarray, mel: torch.Tensor, *, loaded: LoadedModel,
                 options: TranscribeOptions, window_frames: int) -> None:
        self.source = source
        self.samples = samples
        self.mel = mel  # [n_mels, content frames + one window of silence]
        self.tokenizer = loaded.tokenizer
        self.options = options
        self.window_frames = window_frames
        self.content_frames = mel.shape[-1] - window_frames
        self.sample_len = loaded.config.max_target_positions // 2
        self.multilingual = loaded.config.is_multilingual
        initial = self.tokenizer.encode(" " + options.prompt.strip()) if options.prompt is not None else []
        self.num_initial = len(initial)
        self.all_tokens: list[int] = list(initial)
        self.prompt_reset_since = 0
        self.segments: list[Segment] = []
        self.seek = 0
        self.attempt = 0  # index into the fallback temperatures
        self.language = options.language if self.multilingual else "en"
        self._detecting = False
        self._features: torch.Tensor | None = None  # the window in the engine, kept for word timings
        self.unaligned: UnalignedWindow | None = None
        self.last_speech_end = 0.0  # where the last aligned word ended (seconds), carried across windows
        self.aligner: WordAligner | None = aligner_of(loaded)

    @property
    def done(self) -> bool:
        return self.seek >= self.content_frames

    @property
    def progress_s(self) -> float:
        """Seconds of the input behind the cursor (all of them once it is done)."""
        num_samples = len(self.samples) if self.done else min(self.seek * HOP_SAMPLES, len(self.samples))
        return num_samples / SAMPLE_RATE

    def _segment_size(self) -> int:
        return min(self.window_frames, self.content_frames - self.seek)

    def next_request(self) -> WindowRequest | None:
        if self.done:
            return None
        if self.language is None:
            # openai-whisper detects once, on the first 30 s, then keeps that language for every window.
            self._detecting = True
            options = DecodeOptions(task=self.options.task, max_new_tokens=1)
            return WindowRequest(self.samples[: self.window_frames * HOP_SAMPLES],
                                 self.mel[:, : self.window_frames], options)
        size = self._segment_size()
        features = F.pad(self.mel[:, self.seek : self.seek + size], (0, self.window_frames - size))
        audio = self.samples[self.seek * HOP_SAMPLES : (self.seek + size) * HOP_SAMPLES]
        temperature = self.options.fallback.temperatures[self.attempt]
        search = temperature == 0 and self.options.beam_size is not None
        options = DecodeOptions(
            language=self.language if self.multilingual else None,
            task=self.options.task,
            timestamps=True,
            temperature=temperature,
            prompt_token_ids=tuple(self.all_tokens[self.prompt_reset_since :]),
            max_new_tokens=self.sample_len,
            beam_size=self.options.beam_size if search else None,
            patience=self.options.patience if search else None,
            length_penalty=self.options.length_penalty if search else None,
        )
        self._features = features if self.options.word_timestamps else None
        return WindowRequest(audio, features, options)

    def accept(self, output: RequestOutput) -> None:
        if self._detecting:
            self._detecting = False
            self.language = output.language
            return
        fallback = self.options.fallback
        tokens = list(output.token_ids)
        avg_logprob = output.avg_logprob
        no_speech_prob = output.no_speech_prob if output.no_speech_prob is not None else 0.0
        ratio = compression_ratio(self.tokenizer.decode(tokens).strip())
        temperature = fallback.temperatures[self.attempt]
        retry = self.attempt + 1 < len(fallback.temperatures)
        if retry and needs_fallback(fallback, ratio, avg_logprob, no_speech_prob):
            self.attempt += 1
            return
        self.attempt = 0
        size = self._segment_size()
        if is_silence(fallback, avg_logprob, no_speech_prob):
            self.seek += size
            return
        timestamp_begin = self.tokenizer.special.timestamp_begin
        split = split_window(tokens, timestamp_begin, size * HOP_SAMPLES / SAMPLE_RATE)
        offset_s = self.seek * HOP_SAMPLES / SAMPLE_RATE
        segments = [
            segment_of(self.tokenizer, tokens, span, offset_s, temperature=temperature, avg_logprob=avg_logprob,
                       compression_ratio=ratio, no_speech_prob=no_speech_prob)
            for span in split.spans
        ]
        consumed = split.consumed_frames
        advance = consumed if consumed else size  # a closed timestamp is never at 0: the guard never bites
        if self.options.word_timestamps:
            self.unaligned = UnalignedWindow(segments, self._features, size, advance,
                                             ends_on_single_timestamp(tokens, timestamp_begin), temperature)
            return
        self._commit(segments, advance, temperature)

    def alignment_row(self) -> AlignmentRow:
        """The waiting window's text tokens (those of its segments; an unfinished tail is decoded again from
        the next window) as a row to align."""
        window = self.unaligned
        return AlignmentRow(tuple(t for s in window.segments for t in s.token_ids), window.num_frames,
                            language=self.language if self.multilingual else None, task=self.options.task,
                            time_offset=self.seek * HOP_SAMPLES / SAMPLE_RATE)

    def place(self, alignment: list) -> None:
        """Gives the waiting window's segments their words (``alignment``: its words in window seconds, from the
        aligner's ``window_words``) and moves the cursor, as openai-whisper's ``transcribe(word_timestamps=True)``
        does."""
        window, self.unaligned = self.unaligned, None
        offset_s = self.seek * HOP_SAMPLES / SAMPLE_RATE
        eot = self.tokenizer.special.eot
        spans = [TextSpan(s.start, s.end, sum(t < eot for t in s.token_ids)) for s in window.segments]
        timed, _ = self.aligner.place_words(alignment, spans, offset_s, self.last_speech_end)
        segments = [replace(s, start=t.start, end=t.end, words=t.words)
                    for s, t in zip(window.segments, timed, strict=True)]
        # The last word's end, or the last segment's end when no segment has words (empty ones included).
        last_end = next((w.end for s in reversed(segments) for w in reversed(s.words)), segments[-1].end)
        advance = window.advance
        # A window that stopped mid-speech resumes where its words end, not at its last timestamp.
        if not window.single_ending and last_end > offset_s:
            advance = round(last_end * FRAMES_PER_SECOND) - self.seek
        self.last_speech_end = last_end
        self._commit(segments, advance, window.temperature)

    def _commit(self, segments: list[Segment], advance: int, temperature: float) -> None:
        for segment in segments:
            # An instantaneous or empty segment is dropped, and its tokens are not used as a prompt.
            if segment.start != segment.end and segment.text:
                self.segments.append(segment)
                self.all_tokens.extend(segment.token_ids)
        self.seek += advance
        if not self.options.condition_on_previous_text or temperature > HIGH_TEMPERATURE:
            self.prompt_reset_since = len(self.all_tokens)

    def result(self) -> Transcription:
        token_ids = self.all_tokens[self.num_initial :]
        return Transcription(
            source=self.source,
            text=self.tokenizer.decode(token_ids).strip(),
            language=self.language,
            duration_s=round(audio_duration(self.samples, SAMPLE_RATE), 3),
            token_ids=token_ids,
            segments=list(self.segments),
        )


class SequentialTranscriber:
    def __init__(self, loaded: LoadedModel, engine: ASREngine, options: TranscribeOptions) -> None:
        capabilities = capabilities_of(type(loaded.model))
        if "sequential" not in capabilities.long_form:
            raise UnsupportedOptionError(f"{loaded.name}: sequential long-form decoding needs a Whisper model")
        engine.runner.check(DecodeOptions(language=options.language, task=options.task, prompt=options.prompt,
                                          beam_size=options.beam_size, patience=options.patience,
                                          length_penalty=options.length_penalty))
        self.loaded = loaded
        self.engine = engine
        self.options = options
        self.aligner = aligner_of(loaded)
        self.window_frames = loaded.features.config.n_frames
        # Inputs in flight: each holds one window, of beam_size rows when searching.
        self.max_active = max(engine.config.scheduler.max_num_seqs // (options.beam_size or 1), 1)

    def whole_mel(self, samples: np.ndarray) -> torch.Tensor:
        """Log-mel of the input followed by one window of silence, normalised over all of it: [n_mels, frames]."""
        silence = np.zeros(self.window_frames * HOP_SAMPLES, np.float32)
        padded = np.concatenate([samples.astype(np.float32, copy=False), silence])
        waveform = torch.from_numpy(padded)[None].to(self.loaded.device)
        return self.loaded.features.log_mel(waveform)[0]

    def run(self, decoded: Iterable[tuple[int, str, np.ndarray | AudioDecodeError]],
            on_progress: Callable[[float, float], None] | None = None) -> Iterator[Transcription]:
        """``decoded``: (index, name, samples or the error that decoding raised), in input order. Yields one
        result per input, in input order. ``on_progress(found_s, done_s)``: as ``offline.ProgressCallback``,
        ``done_s`` being how far a window moved its input's cursor."""
        report = on_progress or (lambda found_s, done_s: None)
        order: deque[LongFormCursor | Transcription] = deque()
        in_engine: dict[str, LongFormCursor] = {}
        pending = iter(decoded)
        exhausted = False
        ids = iter(range(1 << 62))
        while True:
            while not exhausted and len(in_engine) < self.max_active:
                item = next(pending, None)
                if item is None:
                    exhausted = True
                    break
                _, name, samples = item
                if isinstance(samples, AudioDecodeError):
                    order.append(Transcription(source=name, text="", language=None, duration_s=0.0, error=str(samples)))
                    continue
                cursor = LongFormCursor(name, samples, self.whole_mel(samples), loaded=self.loaded,
                                        options=self.options, window_frames=self.window_frames)
                order.append(cursor)
                report(len(samples) / SAMPLE_RATE, 0.0)
                self._submit(cursor, f"lf-{next(ids)}", in_engine)
            yield from self._drain(order)
            if not self.engine.has_unfinished():
                if exhausted:
                    return
                continue
            finished = []
            for output in self.engine.step():
                if output.finished:
                    cursor = in_engine.pop(output.request_id)
                    finished.append((cursor, cursor.progress_s))
                    cursor.accept(output)
            self._align([cursor for cursor, _ in finished if cursor.unaligned is not None])
            for cursor, before_s in finished:
                report(0.0, cursor.progress_s - before_s)
                self._submit(cursor, f"lf-{next(ids)}", in_engine)

    def _align(self, cursors: list[LongFormCursor]) -> None:
        """Word timings for the windows that just finished, all in one call (their encoder outputs are computed
        again from the features they were decoded from: the engine has freed its own)."""
        if not cursors:
            return
        features = torch.stack([cursor.unaligned.features for cursor in cursors])
        rows = [cursor.alignment_row() for cursor in cursors]
        alignments = self.aligner.window_words(self.loaded, rows, features)
        for cursor, alignment in zip(cursors, alignments, strict=True):
            cursor.place(alignment)

    def _submit(self, cursor: LongFormCursor, request_id: str, in_engine: dict[str, LongFormCursor]) -> None:
        window = cursor.next_request()
        if window is None:
            return
        self.engine.add_request(window.audio, window.options, request_id=request_id, features=window.features)
        in_engine[request_id] = cursor

    @staticmethod
    def _drain(order: deque[LongFormCursor | Transcription]) -> Iterator[Transcription]:
        while order and (isinstance(order[0], Transcription) or order[0].done):
            head = order.popleft()
            yield head if isinstance(head, Transcription) else head.result()
