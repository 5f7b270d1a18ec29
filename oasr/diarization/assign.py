"""Speakers on a transcript: each transcript segment, and each word where the ASR model timed its words, gets
the speaker whose activity overlaps it most; a segment whose words change speaker is split there into speaker
turns (so overlapped speech is cut as finely as the word times allow, and no finer).

Speakers are lettered A, B, ... in order of first arrival, as OpenAI letters speakers it was not told the names
of (``diarized_json``'s ``speaker``); every output format of one transcript uses the same letters.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from oasr.diarization.types import SpeakerSegment
from oasr.types import Segment, Transcription, Word


def speaker_of(start: float, end: float, activity: Sequence[SpeakerSegment]) -> int | None:
    """The speaker talking longest within [start, end); ties go to the earlier arrival. A span nobody talks in
    (or of no length, a word DTW gave no duration) takes the speaker of the nearest activity, the one it lies
    deepest in when several contain it (None when there is no activity at all)."""
    overlap: dict[int, float] = {}
    for seg in activity:
        shared = min(end, seg.end) - max(start, seg.start)
        if shared > 0:
            overlap[seg.speaker] = overlap.get(seg.speaker, 0.0) + shared
    if overlap:
        return min(overlap, key=lambda speaker: (-overlap[speaker], speaker))
    if not activity:
        return None
    nearest = min(activity, key=lambda seg: (max(seg.start - end, start - seg.end), seg.speaker))
    return nearest.speaker


def speaker_letter(speaker: int | None) -> str:
    """0 -> "A", 25 -> "Z", 26 -> "AA"; None (no speech found anywhere) -> "A"."""
    index, letters = speaker or 0, ""
    while True:
        index, rest = divmod(index, 26)
        letters = string.ascii_uppercase[rest] + letters
        if index == 0:
            return letters
        index -= 1


@dataclass(frozen=True)
class SpeakerTurn:
    """A stretch of transcript with one speaker: a whole segment, or the part of one between speaker changes.
    ``words``: its words (empty where the ASR model gave no word times)."""

    start: float
    end: float
    text: str
    speaker: int | None
    words: tuple[Word, ...] = ()

    @property
    def label(self) -> str:
        return speaker_letter(self.speaker)


def segment_turns(segment: Segment, activity: Sequence[SpeakerSegment]) -> list[SpeakerTurn]:
    """One segment as speaker turns: split between two words of different speakers. The first turn starts at
    the segment's start, the last ends at its end, and a cut lies where the next turn's first word starts."""
    if not segment.words:
        return [SpeakerTurn(segment.start, segment.end, segment.text, speaker_of(segment.start, segment.end,
                                                                                  activity))]
    groups: list[list[Word]] = []
    speakers: list[int | None] = []
    for word in segment.words:
        speaker = speaker_of(word.start, word.end, activity)
        if not groups or speaker != speakers[-1]:
            groups.append([])
            speakers.append(speaker)
        groups[-1].append(word)
    turns = []
    for i, (words, speaker) in enumerate(zip(groups, speakers)):
        start = segment.start if i == 0 else words[0].start
        end = segment.end if i == len(groups) - 1 else groups[i + 1][0].start
        turns.append(SpeakerTurn(start, max(end, start), "".join(w.word for w in words).strip(), speaker,
                                 tuple(words)))
    return turns


def speaker_turns(segments: Sequence[Segment], activity: Sequence[SpeakerSegment]) -> list[SpeakerTurn]:
    """Every segment's turns, in order; segments without text give none."""
    return [turn for segment in segments if segment.text.strip() for turn in segment_turns(segment, activity)]


def word_speakers(words: Sequence[Word], activity: Sequence[SpeakerSegment]) -> list[str]:
    """Each word's speaker letter."""
    return [speaker_letter(speaker_of(w.start, w.end, activity)) for w in words]


@dataclass(frozen=True)
class DiarizedTranscription:
    """A transcript with the speaker activity of the same input (what ``oasr transcribe --diarization-model``
    renders, through ``oasr.serving.diarization_formats``)."""

    transcription: Transcription
    activity: tuple[SpeakerSegment, ...]

    @property
    def error(self) -> str | None:
        return self.transcription.error

    @property
    def source(self) -> str:
        return self.transcription.source

    @property
    def text(self) -> str:
        return self.transcription.text

    @property
    def ok(self) -> bool:
        return self.transcription.ok

    def turns(self) -> list[SpeakerTurn]:
        return speaker_turns(self.transcription.segments, self.activity)
