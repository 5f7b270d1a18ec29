"""A transcript with speakers in each output format, shared by ``oasr transcribe --diarization-model`` and the
server's ``/v1/audio/transcriptions`` (with ``oasr serve --diarization-model``).

- ``diarized_json``: OpenAI's shape (the ``openai`` package's ``TranscriptionDiarized``: ``task``, ``duration``,
  ``text``, ``segments`` of ``{"type": "transcript.text.segment", "id", "start", "end", "text", "speaker"}``,
  optional ``usage``), one segment per speaker turn.
- ``verbose_json`` and the CLI's ``json``: the usual segments, each with the ``speaker`` talking most within it,
  and each word with its own ``speaker``.
- ``vtt``: one cue per speaker turn, its text in a WebVTT voice span, ``<v Speaker A>text``.
- ``srt``: SubRip has no voice markup (its cue text knows only b, i, u and font), so each cue's text starts with
  the speaker in brackets, ``[Speaker A] text``, the way caption style guides identify an off-screen speaker
  and WhisperX's subtitle writer labels its speakers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel
from starlette.responses import JSONResponse, PlainTextResponse, Response

from oasr.diarization.assign import (
    DiarizedTranscription,
    SpeakerTurn,
    speaker_letter,
    speaker_of,
    speaker_turns,
    word_speakers,
)
from oasr.diarization.types import SpeakerSegment
from oasr.serving.formats import clock
from oasr.types import Transcription, Word

DIARIZED_FORMATS = ("diarized_json", "json", "jsonl", "srt", "vtt")  # the CLI's formats that carry speakers


class DiarizedSegment(BaseModel):
    """``TranscriptionDiarizedSegment``; streamed alone, the same fields are ``transcript.text.segment``."""

    type: Literal["transcript.text.segment"] = "transcript.text.segment"
    id: str
    start: float
    end: float
    text: str
    speaker: str


def diarized_segments(turns: Sequence[SpeakerTurn]) -> list[DiarizedSegment]:
    return [DiarizedSegment(id=f"seg_{i}", start=round(t.start, 3), end=round(t.end, 3), text=t.text,
                            speaker=t.label) for i, t in enumerate(turns)]


def diarized_json(turns: Sequence[SpeakerTurn], duration: float, text: str, usage_seconds: float | None = None
                  ) -> dict[str, Any]:
    body: dict[str, Any] = {"task": "transcribe", "duration": duration, "text": text,
                            "segments": [s.model_dump() for s in diarized_segments(turns)]}
    if usage_seconds is not None:
        body["usage"] = {"type": "duration", "seconds": usage_seconds}
    return body


def voice_name(turn: SpeakerTurn) -> str:
    return f"Speaker {turn.label}"


def _vtt_text(text: str) -> str:
    """Cue text as WebVTT reads it: ``&`` and ``<`` start markup, and ``-->`` would end the cue's timing."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def turns_srt(turns: Sequence[SpeakerTurn]) -> str:
    cues = [f"{i}\n{clock(t.start, ',')} --> {clock(t.end, ',')}\n[{voice_name(t)}] {t.text.replace('-->', '->')}\n"
            for i, t in enumerate(turns, start=1)]
    return "\n".join(cues)


def turns_vtt(turns: Sequence[SpeakerTurn]) -> str:
    cues = [f"{clock(t.start, '.')} --> {clock(t.end, '.')}\n<v {voice_name(t)}>{_vtt_text(t.text)}\n"
            for t in turns]
    return "WEBVTT\n\n" + "\n".join(cues)


def with_speakers(body: dict[str, Any], activity: Sequence[SpeakerSegment]) -> dict[str, Any]:
    """A ``verbose_json`` (or the CLI's ``json``) body whose segments and words each carry their speaker; the
    words may sit at the top (``words``) or in each segment."""
    for segment in body.get("segments") or ():
        segment["speaker"] = speaker_letter(speaker_of(segment["start"], segment["end"], activity))
        _label_words(segment.get("words") or [], activity)
    _label_words(body.get("words") or [], activity)
    return body


def _label_words(words: list[dict[str, Any]], activity: Sequence[SpeakerSegment]) -> None:
    timed = [Word(w["word"], w["start"], w["end"], 0.0) for w in words]
    for word, speaker in zip(words, word_speakers(timed, activity)):
        word["speaker"] = speaker


def labelled_dict(result: DiarizedTranscription) -> dict[str, Any]:
    """The CLI's ``json`` object of the transcript, each segment and word with its speaker."""
    return with_speakers(result.transcription.to_dict(), result.activity)


def render_diarized(result: DiarizedTranscription, fmt: str) -> str:
    """One transcript with speakers in one of ``DIARIZED_FORMATS``."""
    transcription = result.transcription
    if fmt == "diarized_json":
        body = diarized_json(result.turns(), transcription.duration_s, transcription.text)
        return json.dumps(body, ensure_ascii=False, indent=2) + "\n"
    if fmt in ("json", "jsonl"):
        return json.dumps(labelled_dict(result), ensure_ascii=False, indent=2 if fmt == "json" else None) + "\n"
    if fmt == "srt":
        return turns_srt(result.turns())
    if fmt == "vtt":
        return turns_vtt(result.turns())
    raise ValueError(f"output format {fmt!r} carries no speakers; choose one of {', '.join(DIARIZED_FORMATS)}")


def diarized_response(fmt: str, transcription: Transcription, activity: Sequence[SpeakerSegment],
                      usage_seconds: float | None) -> Response:
    """The server's answer in ``diarized_json``, ``srt`` or ``vtt`` (``verbose_json`` goes through
    ``with_speakers``)."""
    turns = speaker_turns(transcription.segments, activity)
    if fmt == "diarized_json":
        return JSONResponse(diarized_json(turns, transcription.duration_s, transcription.text, usage_seconds))
    if fmt == "srt":
        return PlainTextResponse(turns_srt(turns))
    if fmt == "vtt":
        return PlainTextResponse(turns_vtt(turns))
    raise ValueError(f"response_format {fmt!r} carries no speakers")
