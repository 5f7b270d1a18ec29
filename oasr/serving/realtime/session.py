"""One realtime session's input buffer and turns, with no engine, socket or torch in sight.

Audio arrives as 16 kHz samples on one session timeline (milliseconds from the session's first sample). The
buffer holds what has not been committed yet. A turn is committed by the client (``commit``) or, with server
VAD on, by the session itself when speech stops (``detect``); either way it becomes a ``Committed`` event
carrying the turn's samples and the id of the conversation item its transcript will belong to.

Server VAD (the turn-boundary policy, all of it here): the detector's per-chunk speech probabilities of the
audio since the last turn boundary go through ``oasr.vad.segmenter.speech_segments`` with OpenAI's knobs:
``threshold`` starts speech (hysteresis below it, as the segmenter does), ``silence_duration_ms`` of silence
ends it, and no minimum speech length (OpenAI has none). The first segment found opens a turn
(``SpeechStarted``, ``audio_start_ms`` = its start less ``prefix_padding_ms``, as OpenAI counts it); once the
segmenter closes that segment (it ends before the scanned audio does) the turn ends ``silence_duration_ms``
after the speech did (``SpeechStopped``, ``audio_end_ms``: the end of the audio sent to the model, as OpenAI
counts it) and is committed. While no speech is open, audio older than the prefix padding is dropped, so an idle
session holds a fraction of a second.

A detector that decides its own segments (FSMN-VAD: its state machine has its own start look-back and end silence)
hands the session ``StreamSegments`` instead of probabilities, and its edges are the turns as they are: a start
opens one (``audio_start_ms`` = the segment's start), an end stops and commits it (``audio_end_ms`` = the
segment's end). OpenAI's three knobs do not apply then; audio before the detector's ``settled`` sample is dropped
while no speech is open.

A streaming model hears a turn while it is spoken, so its item id and its first sample are known before the
commit: ``turn_item_id`` and ``turn_start_sample`` (the open speech's, or in commit mode the buffer's), and
``samples_from`` the audio since. A commit then cuts the turn from that same first sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import count

import numpy as np

from oasr.vad.segmenter import SegmenterOptions, speech_segments
from oasr.vad.stream import StreamSegments

SAMPLE_RATE = 16_000
SAMPLES_PER_MS = SAMPLE_RATE // 1000


@dataclass(frozen=True)
class TurnDetection:
    """OpenAI's ``server_vad``: its three knobs, with its defaults."""

    threshold: float = 0.5  # speech probability that starts speech
    prefix_padding_ms: int = 300  # audio kept before the detected start
    silence_duration_ms: int = 500  # silence that ends a turn

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.prefix_padding_ms < 0:
            raise ValueError(f"prefix_padding_ms must be >= 0, got {self.prefix_padding_ms}")
        if self.silence_duration_ms < 1:
            raise ValueError(f"silence_duration_ms must be >= 1, got {self.silence_duration_ms}")

    def segmenter_options(self) -> SegmenterOptions:
        return SegmenterOptions(threshold=self.threshold, min_speech_s=0.0,
                                min_silence_s=self.silence_duration_ms / 1000, speech_pad_s=0.0)


@dataclass(frozen=True)
class SpeechStarted:
    item_id: str
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class Committed:
    item_id: str
    previous_item_id: str | None
    audio: np.ndarray  # the turn's 16 kHz samples
    start_ms: int  # on the session timeline
    end_ms: int

    @property
    def duration_s(self) -> float:
        return len(self.audio) / SAMPLE_RATE


SessionEvent = SpeechStarted | SpeechStopped | Committed


class EmptyBufferError(ValueError):
    """A commit with nothing buffered."""


class BufferFullError(ValueError):
    """An append that would take the buffer past its limit."""


class BacklogFullError(ValueError):
    """A turn that would take the session's committed-but-unanswered turns past their limit."""


class TurnBacklog:
    """A session's committed turns not yet answered (queued, transcribing or finishing their stream) and their
    samples, each bounded: a client that sends audio faster than it is transcribed is refused, not queued."""

    def __init__(self, max_turns: int, max_samples: int) -> None:
        self.max_turns = max_turns
        self.max_samples = max_samples
        self.num_turns = 0
        self.num_samples = 0

    def check(self, num_samples: int) -> None:
        """Raises ``BacklogFullError`` when one more turn of ``num_samples`` would not fit."""
        if self.num_turns >= self.max_turns:
            raise BacklogFullError(f"{self.num_turns} committed turns are still being transcribed, the most one "
                                   "session may have")
        if self.num_turns and self.num_samples + num_samples > self.max_samples:
            # One turn alone always fits (the input buffer bounds it), so a long turn is never refused forever.
            raise BacklogFullError(f"the committed turns still being transcribed hold "
                                   f"{self.num_samples / SAMPLE_RATE:.1f} s of audio; with this turn's "
                                   f"{num_samples / SAMPLE_RATE:.1f} s they would pass the session's "
                                   f"{self.max_samples / SAMPLE_RATE:g} s")

    def add(self, num_samples: int) -> None:
        """Counts a turn in, checked or not (a commit checked before its resampler's tail was added)."""
        self.num_turns += 1
        self.num_samples += num_samples

    def remove(self, num_samples: int) -> None:
        self.num_turns -= 1
        self.num_samples -= num_samples


def random_item_ids() -> Callable[[], str]:
    """OpenAI-looking item ids: ``item_`` and 24 hex digits, random per session, counted within it."""
    prefix = np.random.default_rng().bytes(8).hex()
    numbers = count()
    return lambda: f"item_{prefix}{next(numbers):08x}"


class TurnBuffer:
    """The buffer, its turns and their item ids. ``chunk_samples``: the VAD detector's chunk."""

    def __init__(self, max_buffer_samples: int, *, chunk_samples: int = 512,
                 new_item_id: Callable[[], str] | None = None) -> None:
        self.max_buffer_samples = max_buffer_samples
        self.chunk_samples = chunk_samples
        self._new_item_id = new_item_id or random_item_ids()
        self._pieces: list[np.ndarray] = []
        self._buffer_start = 0  # session sample of the buffer's first sample
        self._end = 0  # session samples received
        self._last_item_id: str | None = None
        self._pending_item: str | None = None  # handed out by turn_item_id() before a commit uses it
        self.turn_detection: TurnDetection | None = None
        self._reset_vad()

    # ------------------------------------------------------------------ buffer

    @property
    def num_buffered_samples(self) -> int:
        return self._end - self._buffer_start

    @property
    def speech_item_id(self) -> str | None:
        """The item of the speech the VAD has open, if any."""
        return self._speech_item

    @property
    def turn_start_sample(self) -> int:
        """The session sample where the turn being buffered begins: the open speech's (its prefix padding
        included), else the buffer's first."""
        return self._turn_start if self._speech_item is not None else self._buffer_start

    @property
    def open_item_id(self) -> str | None:
        """The item id the buffered turn has been given so far (the open speech's, or ``turn_item_id``'s)."""
        return self._speech_item or self._pending_item

    def turn_item_id(self) -> str:
        """The item id the buffered audio will be committed as, given now (for deltas before the commit)."""
        if self._speech_item is not None:
            return self._speech_item
        if self._pending_item is None:
            self._pending_item = self._new_item_id()
        return self._pending_item

    @property
    def settled_end(self) -> int:
        """The session sample up to which the buffered audio surely belongs to the turn being buffered: all of
        it, except with speech open, where the turn may still end anywhere after the start of the detector's
        last scanned chunk (it ends ``silence_duration_ms`` after its speech, found only once that much
        silence has been scanned)."""
        if self._speech_item is None:
            return self._end
        if self._speech_until is not None:  # a detector's own segment: it says how far its speech surely goes
            return max(min(self._vad_origin + self._speech_until, self._end), self._turn_start)
        last_chunk = self._vad_origin + (self._scan_chunk + len(self._probs) - 1) * self.chunk_samples
        return max(min(last_chunk, self._end), self._turn_start)

    def samples_from(self, start: int, end: int | None = None) -> np.ndarray:
        """The buffered samples from session sample ``start`` to ``end`` (the buffer's end)."""
        start = max(start, self._buffer_start)
        return self._samples(start, max(start, self._end if end is None else min(end, self._end)))

    def append(self, samples: np.ndarray, *, bounded: bool = True) -> None:
        """``bounded=False``: samples the client already sent (a resampler's tail), taken past the limit."""
        if bounded and self.num_buffered_samples + len(samples) > self.max_buffer_samples:
            raise BufferFullError(f"the input audio buffer holds at most {self.max_buffer_samples / SAMPLE_RATE:g} "
                                  "s; commit or clear it first")
        if len(samples):
            self._pieces.append(np.asarray(samples, dtype=np.float32))
            self._end += len(samples)

    def commit(self) -> Committed:
        """The buffer as one turn: all of it, or with speech open, from that speech's turn start (the VAD's
        item id then)."""
        if self.num_buffered_samples == 0:
            raise EmptyBufferError("the input audio buffer is empty")
        committed = self._cut(self.turn_item_id(), self.turn_start_sample, self._end)
        self._reset_vad()
        return committed

    def clear(self) -> None:
        self._drop_before(self._end)
        self._pending_item = None
        self._reset_vad()

    def set_turn_detection(self, turn_detection: TurnDetection | None) -> None:
        """A new VAD (or none): the detector's chunks start again at the session's current end."""
        self.turn_detection = turn_detection
        self._reset_vad()

    # ------------------------------------------------------------------ server VAD

    def detect(self, probs: Sequence[float] | StreamSegments) -> list[SessionEvent]:
        """The detector's probabilities of its next chunks (in order, since ``set_turn_detection``), or what a
        detector that cuts its own segments found; the events they cause."""
        if self.turn_detection is None:
            raise RuntimeError("detect() without turn detection")
        if isinstance(probs, StreamSegments):
            return self._follow(probs)
        self._probs.extend(float(p) for p in probs)
        events: list[SessionEvent] = []
        while self._probs:
            found = self._scan()
            if found is None:
                break
            events.extend(found)
        if self._speech_item is None:
            self._drop_idle_audio()
        return events

    def _scan(self) -> list[SessionEvent] | None:
        """Events from the scanned chunks, or None when nothing more can happen until more chunks come."""
        td = self.turn_detection
        assert td is not None
        chunk = self.chunk_samples
        scan_start = self._vad_origin + self._scan_chunk * chunk
        num_scanned = len(self._probs) * chunk
        segments = speech_segments(self._probs, num_scanned, td.segmenter_options(), chunk)
        if not segments:  # no speech, none begun: these chunks can never start one
            self._scan_chunk += len(self._probs)
            self._probs = []
            return None
        speech = segments[0]
        events: list[SessionEvent] = []
        if self._speech_item is None:
            self._speech_item = self._new_item_id()
            self._turn_start = max(scan_start + speech.start - td.prefix_padding_ms * SAMPLES_PER_MS,
                                   self._buffer_start)
            events.append(SpeechStarted(self._speech_item, self._turn_start // SAMPLES_PER_MS))
        if speech.end >= num_scanned:  # still open
            return events or None
        turn_end = min(scan_start + speech.end + td.silence_duration_ms * SAMPLES_PER_MS, self._end)
        item_id = self._speech_item
        events.append(SpeechStopped(item_id, turn_end // SAMPLES_PER_MS))
        events.append(self._cut(item_id, self._turn_start, turn_end))
        # Every chunk from the speech's end to the one that closed it is below the threshold, so scanning
        # again from the turn's end (in a fresh state) finds what the segmenter would have found.
        restart = -(-(turn_end - scan_start) // chunk)
        self._probs = self._probs[restart:]
        self._scan_chunk += restart
        self._speech_item = None
        return events

    def _follow(self, found: StreamSegments) -> list[SessionEvent]:
        """A detector's own segment edges (stream samples counted from ``_vad_origin``) as turns."""
        events: list[SessionEvent] = []
        for edge in found.edges:
            sample = self._vad_origin + edge.sample
            if edge.starts and self._speech_item is None:
                self._speech_item = self._new_item_id()
                self._turn_start = min(max(sample, self._buffer_start), self._end)
                events.append(SpeechStarted(self._speech_item, self._turn_start // SAMPLES_PER_MS))
            elif not edge.starts and self._speech_item is not None:
                item_id, turn_end = self._speech_item, min(max(sample, self._turn_start), self._end)
                events.append(SpeechStopped(item_id, turn_end // SAMPLES_PER_MS))
                events.append(self._cut(item_id, self._turn_start, turn_end))
                self._speech_item = None
        self._speech_until = found.speech_until
        if self._speech_item is None:
            self._drop_before(min(self._vad_origin + found.settled, self._end))
        return events

    def _drop_idle_audio(self) -> None:
        td = self.turn_detection
        assert td is not None
        scanned_to = self._vad_origin + self._scan_chunk * self.chunk_samples
        self._drop_before(min(scanned_to, self._end) - td.prefix_padding_ms * SAMPLES_PER_MS)

    def _reset_vad(self) -> None:
        self._vad_origin = self._end  # session sample where the detector's chunk 0 begins
        self._scan_chunk = 0  # first chunk of the scan (the audio since the last turn boundary)
        self._probs: list[float] = []
        self._speech_item: str | None = None
        self._turn_start = 0
        self._speech_until: int | None = None  # set by a detector that cuts its own segments (``_follow``)

    # ------------------------------------------------------------------ samples

    def _cut(self, item_id: str, start: int, end: int) -> Committed:
        """Samples [start, end) of the session as a turn; the buffer keeps what follows."""
        audio = self._samples(start, end)
        self._drop_before(end)
        committed = Committed(item_id, self._last_item_id, audio, start // SAMPLES_PER_MS, end // SAMPLES_PER_MS)
        self._last_item_id = item_id
        self._pending_item = None
        return committed

    def _samples(self, start: int, end: int) -> np.ndarray:
        whole = np.concatenate(self._pieces) if self._pieces else np.zeros(0, dtype=np.float32)
        self._pieces = [whole] if len(whole) else []
        return whole[start - self._buffer_start : end - self._buffer_start].copy()

    def _drop_before(self, sample: int) -> None:
        sample = min(max(sample, self._buffer_start), self._end)
        if sample == self._buffer_start:
            return
        whole = np.concatenate(self._pieces) if self._pieces else np.zeros(0, dtype=np.float32)
        rest = whole[sample - self._buffer_start :]
        self._pieces = [rest] if len(rest) else []
        self._buffer_start = sample
