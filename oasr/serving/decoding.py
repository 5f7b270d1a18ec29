"""One upload's windows decoded concurrently through the engine, and the text that streams out of them."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import numpy as np

from oasr.engine.request import BULK_PRIORITY, RequestOutput
from oasr.hosting.engine_client import EngineClient
from oasr.transcription.spans import Span
from oasr.transcription.parallel import CoverPlan, WindowCover, window_covers
from oasr.transcription.results import DecodedWindow
from oasr.types import DecodeOptions

_REPLACEMENT = "\ufffd"  # what a byte-level BPE piece ending inside a UTF-8 character decodes to


@dataclass(frozen=True)
class WindowProgress:
    """A window's text so far, as token ids that will not change; ``finished`` once the window is covered.
    ``output``: the engine's final output of the decode that just ended, if one did (for the metrics)."""

    token_ids: list[int]
    finished: bool
    output: RequestOutput | None = None


class WindowedDecode:
    """Decodes every window at once, each as ``oasr.transcription.parallel`` plans it (follow-ups of a window
    that stopped short, fallback temperatures, silence). Their progress arrives interleaved on one queue, so a
    failure in any window (the engine's queue full, say) is seen at once. With ``partial``, a window decoded
    once as asked streams its tokens as they come unless it may still turn out to be silence; other windows
    report each decode once it is kept (a retried or continued decode would take back streamed text). Every
    engine request goes in at ``priority`` (a live turn's goes ahead of uploads' windows). ``cancel()`` closes
    every window's output iterator, which aborts its engine request and frees its rows; it is safe to call at
    any time."""

    def __init__(self, engine: EngineClient, audio: np.ndarray, spans: list[Span], plan: CoverPlan, *,
                 partial: bool, priority: int = BULK_PRIORITY) -> None:
        self.windows = [audio[start:end] for start, end in spans]
        self.covers = window_covers(engine.tokenizer, spans, audio, plan)
        self._engine = engine
        self._events: asyncio.Queue[tuple[int, WindowProgress | Exception]] = asyncio.Queue()
        self._num_finished = 0
        self._partial = partial
        self._priority = priority
        self._tasks = [asyncio.create_task(self._pump(cover)) for cover in self.covers]

    @property
    def num_windows(self) -> int:
        return len(self.windows)

    @property
    def done(self) -> bool:
        return self._num_finished == self.num_windows

    def results(self) -> list[DecodedWindow]:
        return [cover.result() for cover in self.covers]

    async def _pump(self, cover: WindowCover) -> None:
        try:
            final = None
            while (piece := cover.next_request()) is not None:
                final = await self._decode(cover, piece.options, cover.samples[piece.start : piece.end])
                cover.accept(final)
                if not cover.done:
                    self._events.put_nowait((cover.index, WindowProgress(list(cover.token_ids), False, final)))
                    final = None
            self._events.put_nowait((cover.index, WindowProgress(list(cover.token_ids), True, final)))
        except Exception as exc:  # handed to the reader, which decides what the client hears
            self._events.put_nowait((cover.index, exc))

    async def _decode(self, cover: WindowCover, options: DecodeOptions, audio: np.ndarray) -> RequestOutput:
        live = self._partial and not cover.plan.continued
        final = None
        outputs = self._engine.generate(audio, options, partial=live, priority=self._priority)
        async with contextlib.aclosing(outputs) as outputs:
            async for output in outputs:
                if output.finished:
                    final = output
                elif _cannot_be_silence(cover, output):
                    self._events.put_nowait((cover.index, WindowProgress(list(output.token_ids), False)))
        return final

    async def next(self, deadline: float) -> tuple[int, WindowProgress]:
        """The next progress of any window. Raises what a window raised, or ``TimeoutError`` once the event
        loop's clock passes ``deadline``."""
        timeout = deadline - asyncio.get_running_loop().time()
        if timeout <= 0:
            raise TimeoutError
        index, item = await asyncio.wait_for(self._events.get(), timeout)
        if isinstance(item, Exception):
            raise item
        if item.finished:
            self._num_finished += 1
        return index, item

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()


def _cannot_be_silence(cover: WindowCover, output: RequestOutput) -> bool:
    """A decode whose <|nospeech|> probability is under the threshold is kept whatever its text."""
    threshold = cover.plan.fallback.no_speech_threshold
    return threshold is None or output.no_speech_prob is None or output.no_speech_prob <= threshold


class IncrementalDetokenizer:
    """A growing token list's text, handed out in pieces that never change afterwards.

    A byte-level BPE token may end inside a multi-byte UTF-8 character; the text then ends in U+FFFD until a
    later token completes it. Such a tail is held back, and the next piece is decoded from the first token not
    yet handed out, so the pieces join to exactly ``tokenizer.decode(all tokens)``.
    """

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._offset = 0

    def update(self, token_ids: list[int], finished: bool) -> str:
        piece = self._tokenizer.decode(token_ids[self._offset :])
        if piece.endswith(_REPLACEMENT) and not finished:
            return ""
        self._offset = len(token_ids)
        return piece


class OrderedText:
    """The transcript's text as it grows, window after window in order, stripped like the final text
    (``"".join(window texts).strip()``): leading whitespace is dropped, trailing whitespace held back until
    more text follows, so the pieces join to exactly the final text. Later windows decode concurrently; their
    outputs wait here until the windows before them finish."""

    def __init__(self, tokenizer, num_windows: int) -> None:
        self._detokenizers = [IncrementalDetokenizer(tokenizer) for _ in range(num_windows)]
        self._latest: dict[int, RequestOutput | WindowProgress] = {}
        self._current = 0
        self._started = False
        self._held = ""

    def add(self, index: int, output: RequestOutput | WindowProgress) -> str:
        """Records one window's output or progress; returns the text that became stable (maybe empty)."""
        self._latest[index] = output
        pieces = []
        while self._current in self._latest:
            latest = self._latest[self._current]
            pieces.append(self._detokenizers[self._current].update(latest.token_ids, latest.finished))
            if not latest.finished:
                break
            del self._latest[self._current]
            self._current += 1
        return self._trim("".join(pieces))

    def _trim(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept) :]
        return kept


class StreamedText:
    """A live stream's transcript as its events decide it (each event carries the whole text so far), handed
    out in pieces that join to the final ``text.strip()``: leading whitespace dropped, trailing whitespace and
    a tail inside a UTF-8 character held back until more follows."""

    def __init__(self) -> None:
        self.sent = ""

    def add(self, text: str, final: bool) -> str:
        """The piece of ``text`` (the transcript so far; ``final``: all of it) not handed out yet."""
        text = text.strip() if final else text.lstrip().rstrip().removesuffix(_REPLACEMENT).rstrip()
        if not text.startswith(self.sent):  # a tokenizer whose text changed behind what was sent: wait for more
            return ""
        piece, self.sent = text[len(self.sent) :], text
        return piece
