"""Speakers in ``/v1/realtime`` transcription sessions on a server with ``--diarization-model``.

Each completed item's speaker segments go out as OpenAI's ``conversation.item.input_audio_transcription.segment``
events (``id``, ``item_id``, ``content_index``, ``start``, ``end``, ``text``, ``speaker``), after the item's
deltas and before its ``completed``. OpenAI does not say what ``start`` and ``end`` count from; here they are
seconds from the start of the item's own audio, the audio the client committed as that item.

Speakers keep their letters across a session's items: the diarizer runs on the session's committed audio so far
(its turns one after another, up to ``MEMORY_S`` of the latest), and an item's speakers are read from its own
stretch of that. A speaker heard in the first item is therefore still ``A`` in the tenth, as long as the memory
reaches back to where the speakers were first heard. An item is split into speaker turns only as finely as its
transcript has times: a live turn's transcript has none, so each item gets the speaker who talks most in it,
unless its windows (30 s each) give segments of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import numpy as np

from oasr.diarization.assign import SpeakerTurn, speaker_turns
from oasr.diarization.types import SpeakerSegment
from oasr.errors import OASRError
from oasr.serving.diarization import DiarizationService
from oasr.serving.realtime.protocol import ServerEvent
from oasr.types import Segment

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MEMORY_S = 300.0  # committed audio the diarizer reads back over: how far back a speaker's letter is kept


class TranscriptSegmentEvent(ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.segment"] = \
        "conversation.item.input_audio_transcription.segment"
    item_id: str
    content_index: int = 0
    id: str
    start: float
    end: float
    text: str
    speaker: str


class SessionSpeakers:
    """One session's committed audio and the speakers of each item, in turn order (the session answers its
    items in that order, so this is called in it)."""

    def __init__(self, service: DiarizationService, memory_s: float = MEMORY_S) -> None:
        self.service = service
        self.max_samples = int(memory_s * SAMPLE_RATE)
        self._heard: list[np.ndarray] = []  # the latest committed turns, oldest first, within max_samples

    def _remember(self, audio: np.ndarray) -> tuple[np.ndarray, int]:
        """The session's audio to diarize with ``audio`` at its end, and where ``audio`` starts in it."""
        self._heard.append(np.asarray(audio, dtype=np.float32)[-self.max_samples :])
        while sum(len(a) for a in self._heard) > self.max_samples:
            self._heard.pop(0)
        joined = np.concatenate(self._heard)
        return joined, len(joined) - len(self._heard[-1])

    async def turns(self, audio: np.ndarray, segments: Sequence[Segment], transcript: str) -> list[SpeakerTurn]:
        """The item's speaker turns (times from its own audio's start); ``segments``: its transcript's, or none
        (the whole transcript is then one segment over the item). Empty when the diarizer failed (logged)."""
        if not transcript.strip():
            return []
        joined, offset = self._remember(audio)
        try:
            result = await self.service.run(joined, "realtime")
        except OASRError as exc:
            log.error("realtime speakers: the diarization model failed: %s", exc)
            return []
        start_s, end_s = offset / SAMPLE_RATE, len(joined) / SAMPLE_RATE
        # not rounded: a word shared between two speakers is decided on the session's own times
        activity = [SpeakerSegment(max(s.start, start_s) - start_s, min(s.end, end_s) - start_s, s.speaker)
                    for s in result.segments if s.end > start_s]
        duration_s = len(audio) / SAMPLE_RATE
        return speaker_turns(list(segments) or [Segment(0.0, round(duration_s, 3), transcript.strip())], activity)


def segment_events(item_id: str, turns: Sequence[SpeakerTurn]) -> list[TranscriptSegmentEvent]:
    return [TranscriptSegmentEvent(item_id=item_id, id=f"{item_id}_seg_{i}", start=round(t.start, 3),
                                   end=round(t.end, 3), text=t.text, speaker=t.label) for i, t in enumerate(turns)]
