"""``oasr serve --lm / --lexicon / --decoding-graph``: a search the server runs every transcription with.

A request cannot name a file on the server (it could read any), so a language model, lexicon or WFST graph is
chosen when the server starts, and every transcription it makes (HTTP uploads, realtime turns, gRPC) decodes with
it: the engine client is wrapped so that each request's options gain the server's before they are checked or
decoded. A request still chooses its beam width (``beam_size``; the server's ``--beam-size`` where it sends none)
and its ``hotwords`` (words of the lexicon); the weights and pruning are the server's. What does not combine with
the server's search is refused naming the request's field: ``beam_size`` or ``hotwords`` beside a graph (searched
with its own beam).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from oasr.engine.request import BULK_PRIORITY, RequestOutput
from oasr.errors import UnsupportedOptionError
from oasr.hosting.engine_client import EngineClient
from oasr.models.capabilities import check_options
from oasr.types import DecodeOptions

DEFAULT_SERVER_BEAM_SIZE = 8
# The DecodeOptions fields of a word-level search that the server sets for every request.
_WORD_SEARCH = ("lm", "lexicon", "lm_weight", "word_bonus", "beam_size_token", "beam_threshold")


class ServerSearchConflict(UnsupportedOptionError):
    """A request field (``param``) that does not combine with the server's search."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ServerDecoding:
    """The server's search: a word-level beam search (``lm`` and/or ``lexicon``, with its weights and pruning,
    ``beam_size`` beams where a request names none) or decoding over ``decoding_graph``."""

    lm: str | None = None
    lexicon: str | None = None
    lm_weight: float | None = None
    word_bonus: float | None = None
    beam_size_token: int | None = None
    beam_threshold: float | None = None
    beam_size: int = DEFAULT_SERVER_BEAM_SIZE
    decoding_graph: str | None = None

    def __post_init__(self) -> None:
        if self.decoding_graph is None and not self.words:
            raise ValueError("ServerDecoding needs lm, lexicon or decoding_graph")
        # DecodeOptions' own rules: a graph stands alone (no file, weight or beam beside it), weights need a word search.
        DecodeOptions(decoding_graph=self.decoding_graph, beam_size=self.beam_size if self.words else None,
                      **self._word_search())

    @property
    def words(self) -> bool:
        return self.lm is not None or self.lexicon is not None

    def _word_search(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _WORD_SEARCH}

    def apply(self, options: DecodeOptions) -> DecodeOptions:
        """``options`` with the server's search; ``UnsupportedOptionError`` naming a request field that does not
        combine with it."""
        if self.decoding_graph is not None:
            for name in ("beam_size", "hotwords"):
                if getattr(options, name):
                    raise ServerSearchConflict(f"this server decodes every request over its WFST graph (oasr serve "
                                               f"--decoding-graph), which does not combine with {name}", name)
            return replace(options, decoding_graph=self.decoding_graph)
        return replace(options, beam_size=options.beam_size or self.beam_size, **self._word_search())

    def describe(self) -> str:
        if self.decoding_graph is not None:
            return f"WFST graph {self.decoding_graph}"
        files = ", ".join(f for f in (self.lm, self.lexicon) if f is not None)
        return f"word-level beam search ({files}), {self.beam_size} beams by default"


class ServerDecodingClient:
    """An engine client whose requests all decode with ``decoding``: options pass through ``decoding.apply`` on
    their way to ``check`` and ``generate``; everything else is the wrapped client's."""

    def __init__(self, engine: EngineClient, decoding: ServerDecoding) -> None:
        self._engine = engine
        self.decoding = decoding

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def check(self, options: DecodeOptions) -> None:
        await self._engine.check(self.decoding.apply(options))

    def generate(self, audio: np.ndarray, options: DecodeOptions, *, partial: bool = True,
                 priority: int = BULK_PRIORITY) -> AsyncIterator[RequestOutput]:
        return self._engine.generate(audio, self.decoding.apply(options), partial=partial, priority=priority)


def with_server_decoding(engine: EngineClient, decoding: ServerDecoding | None, model_name: str) -> EngineClient:
    """``engine`` itself without a server search; else wrapped, once the model is known to serve the search (its
    files are read by the first check, ``preflight``)."""
    if decoding is None:
        return engine
    check_options(engine.capabilities, decoding.apply(DecodeOptions()), model_name)
    return ServerDecodingClient(engine, decoding)  # type: ignore[return-value]


async def preflight(engine: EngineClient) -> None:
    """Reads the server search's files before the server listens: the engine loads them on this check, so a
    missing or unreadable file stops the server instead of failing its first request."""
    await engine.check(DecodeOptions())
