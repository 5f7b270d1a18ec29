"""The two-pass final: an offline model beside the streaming one transcribes each finished utterance's audio,
and its text becomes the utterance's final one (FunASR's 2-pass server: the online Paraformer's partials while
the words are spoken, the offline Paraformer over each endpointed utterance).

``StreamingEngine`` (``oasr.engine.streams``) hands this pass every stream's samples as they arrive and each
utterance's online final event when the utterance ends (an endpoint, or the stream's end). The utterance's audio
(its samples since the previous endpoint) becomes requests of the final model's own ``ASREngine``, which the
streaming engine steps in its own step, so every utterance that ended batches with the others; the online
final event is held until they finish, and the reader gets in its place a partial with the tokens that event
decided (the deltas stay the online ones), then the final event with the final model's text and token ids
(``StreamEvent.final_model`` names it). Each stream's finals come out in utterance order, the one that closes
the stream last; the next utterance's partials do not wait for them.

Nothing here knows either model's family: the final model is any checkpoint whose capability record serves
``transcribe`` (and, per stream, the stream's language), checked when the pass is built and when a stream opens.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from oasr.engine.engine import ASREngine
from oasr.engine.stats import FinalPassStats
from oasr.errors import OASRError, UnsupportedOptionError
from oasr.models.capabilities import capabilities_of
from oasr.models.loader import LoadedModel, from_pretrained
from oasr.streaming.types import StreamEvent
from oasr.streaming.utterances import UtteranceAudio
from oasr.types import DecodeOptions

log = logging.getLogger(__name__)

OPTION = "final_model"  # how users name this pass (``--final-model``, ``StreamingConfig.final_model``)


@dataclass
class _HeldFinal:
    """One utterance's online final event, waiting for the final model's transcript of its audio."""

    event: StreamEvent
    request_ids: list[str] = field(default_factory=list)  # the audio's windows, in order
    token_ids: dict[str, list[int]] = field(default_factory=dict)  # finished windows
    fallback: bool = False  # the final model could not take the audio: the online final stands

    @property
    def done(self) -> bool:
        return self.fallback or len(self.token_ids) == len(self.request_ids)


class FinalPass:
    def __init__(self, final: LoadedModel) -> None:
        self.loaded = final
        capabilities = capabilities_of(type(final.model))
        if "transcribe" not in capabilities.tasks:
            raise UnsupportedOptionError(
                f"{OPTION} {final.name} cannot transcribe (it serves {', '.join(capabilities.tasks)}): the two-pass "
                "final needs a model that transcribes whole utterances")
        self.engine = ASREngine(final)
        self._audio: dict[str, UtteranceAudio] = {}  # open streams: the current utterance's samples
        self._options: dict[str, DecodeOptions] = {}
        self._held: dict[str, deque[_HeldFinal]] = {}  # per stream, its utterances' finals in order
        self._by_request: dict[str, _HeldFinal] = {}  # unfinished request -> the final it is part of
        self._ids = itertools.count()
        # Finals handed out since the pass was built, by whose text they carry (``stats``: the server's /metrics).
        self._num_completed = 0
        self._num_fallbacks = 0

    @classmethod
    def load(cls, name: str, beside: LoadedModel) -> FinalPass:
        """The pass of model ``name``, loaded on ``beside``'s device in its dtype (a model that does not load is
        refused naming this pass)."""
        try:
            final = from_pretrained(name, device=beside.device, dtype=beside.dtype)
        except OASRError as exc:
            raise OASRError(f"{OPTION} {name}: {exc}") from None
        return cls(final)

    def check(self, stream_id: str, language: str | None) -> None:
        """Refuses a stream the pass cannot take: a language its model does not serve (naming this pass), or
        the id of a closed stream whose finals are still being transcribed."""
        if stream_id in self._held:
            raise OASRError(f"stream id {stream_id!r} is still in use (its final is being transcribed)")
        try:
            self.engine.runner.check(DecodeOptions(language=language))
        except UnsupportedOptionError as exc:
            raise UnsupportedOptionError(f"{OPTION} {self.loaded.name}: {exc}") from None

    def open(self, stream_id: str, language: str | None) -> None:
        """A new stream (``check`` it first)."""
        self._audio[stream_id] = UtteranceAudio()
        self._options[stream_id] = DecodeOptions(language=language)
        self._held[stream_id] = deque()

    def push(self, stream_id: str, audio: np.ndarray) -> None:
        self._audio[stream_id].push(audio)

    def end_utterance(self, event: StreamEvent, end_sample: int) -> StreamEvent | None:
        """``event``, an utterance's online final, is held; its audio (up to ``end_sample``, or all of it once
        the stream is closed) goes to the final model. Returns what the reader gets now: a partial with the
        tokens the event decided, or None when it decided none."""
        stream_id = event.stream_id
        audio = self._audio[stream_id].cut(None if event.closed else end_sample)
        held = _HeldFinal(event)
        try:
            self._transcribe(held, audio, self._options[stream_id])
        except OASRError as exc:  # the online final is better than none
            log.warning("the final model could not transcribe an utterance of %s: %s", stream_id, exc)
            for request_id in held.request_ids:
                self._forget(request_id)
            held.fallback = True
        self._held[stream_id].append(held)
        if event.closed:
            del self._audio[stream_id], self._options[stream_id]
        if not event.new_token_ids:
            return None
        return replace(event, final=False, closed=False, endpoint=None)

    def _transcribe(self, held: _HeldFinal, audio: np.ndarray, options: DecodeOptions) -> None:
        """The utterance's audio as requests: one, or equal parts that each fit the model's window."""
        window = self.engine.runner.window_samples
        num_parts = -(-len(audio) // window)  # an utterance with no audio needs none: its text is empty
        for part in np.array_split(audio, num_parts) if num_parts else ():
            request_id = self.engine.add_request(part, options, f"final-{next(self._ids)}")
            held.request_ids.append(request_id)
            self._by_request[request_id] = held

    def _forget(self, request_id: str) -> None:
        if self._by_request.pop(request_id, None) is not None:
            self.engine.abort(request_id)

    def abort(self, stream_id: str) -> bool:
        """Drops the stream's audio and unfinished finals; False when the pass holds nothing of it."""
        self._audio.pop(stream_id, None)
        self._options.pop(stream_id, None)
        held = self._held.pop(stream_id, None)
        for final in held or ():
            for request_id in final.request_ids:
                self._forget(request_id)
        return held is not None

    def has_unfinished(self) -> bool:
        """Whether a final is waiting (for the final model, or to be handed out)."""
        return any(self._held.values())

    def stats(self) -> FinalPassStats:
        engine = self.engine.stats()
        return FinalPassStats(num_waiting=sum(len(queue) for queue in self._held.values()),
                              num_completed=self._num_completed, num_fallbacks=self._num_fallbacks,
                              num_requests_waiting=engine.num_waiting, num_requests_running=engine.num_running)

    def step(self) -> list[StreamEvent]:
        """One step of the final model's engine (every utterance waiting, batched); the finals now complete, each
        stream's in utterance order."""
        for output in self.engine.step() if self.engine.has_unfinished() else ():
            held = self._by_request.pop(output.request_id, None) if output.finished else None
            if held is not None:
                held.token_ids[output.request_id] = output.token_ids
        events = []
        for stream_id in [s for s, queue in self._held.items() if queue and queue[0].done]:
            queue = self._held[stream_id]
            while queue and queue[0].done:
                events.append(self._final(queue.popleft()))
            if not queue and stream_id not in self._audio:  # closed, and its last final handed out
                del self._held[stream_id]
        return events

    def _final(self, held: _HeldFinal) -> StreamEvent:
        if held.fallback:  # its tokens went out in the partial that stood in for it
            self._num_fallbacks += 1
            return replace(held.event, new_token_ids=())
        self._num_completed += 1
        token_ids = [t for request_id in held.request_ids for t in held.token_ids[request_id]]
        return replace(held.event, new_token_ids=(), token_ids=tuple(token_ids),
                       text=self.loaded.tokenizer.decode(token_ids), final_model=self.loaded.name)
