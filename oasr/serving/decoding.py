"""One upload's windows decoded concurrently through the engine, and the text that streams out of them."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from oasr.transcription.offline import split_windows
from oasr.engine.request import RequestOutput
from oasr.serving.engine_client import EngineClient
from oasr.types import DecodeOptions

_REPLACEMENT = "\ufffd"  # what a byte-level BPE piece ending inside a UTF-8 character decodes to


class WindowedDecode:
    """Starts one engine request per window, all at once. Their outputs arrive interleaved on one queue, so a
    failure in any window (the engine's queue full, say) is seen at once. Without ``partial`` only each window's
    finished output comes (a response that is not streamed needs no more). ``cancel()`` closes every window's
    output iterator, which aborts its engine request and frees its rows; it is safe to call at any time."""

    def __init__(self, engine: EngineClient, audio: np.ndarray, options: DecodeOptions, *, partial: bool) -> None:
        self.windows = split_windows(audio, engine.window_samples)
        self._engine = engine
        self._events: asyncio.Queue[tuple[int, RequestOutput | Exception]] = asyncio.Queue()
        self._num_finished = 0
        self._partial = partial
        self._tasks = [asyncio.create_task(self._pump(i, w, options)) for i, w in enumerate(self.windows)]

    @property
    def num_windows(self) -> int:
        return len(self.windows)

    @property
    def done(self) -> bool:
        return self._num_finished == self.num_windows

    async def _pump(self, index: int, audio: np.ndarray, options: DecodeOptions) -> None:
        try:
            async with contextlib.aclosing(self._engine.generate(audio, options, partial=self._partial)) as outputs:
                async for output in outputs:
                    self._events.put_nowait((index, output))
        except Exception as exc:  # handed to the reader, which decides what the client hears
            self._events.put_nowait((index, exc))

    async def next(self, deadline: float) -> tuple[int, RequestOutput]:
        """The next output of any window. Raises what a window raised, or ``TimeoutError`` once the event
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
        self._latest: dict[int, RequestOutput] = {}
        self._current = 0
        self._started = False
        self._held = ""

    def add(self, index: int, output: RequestOutput) -> str:
        """Records one window's output; returns the text that became stable (maybe empty)."""
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
