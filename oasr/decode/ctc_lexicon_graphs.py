"""The word-level CTC beam's frames as CUDA graphs, for searches whose language model scores on the device.

A frame of the search is a few hundred small tensor operations, so on a GPU the launches, not the arithmetic, set
its pace. Here the search's state for a bucket of rows lives in static buffers, and one graph runs
``frames_per_graph`` frames: the host copies that many frames of log-probs in, replays the graph, and copies the
back-pointers out, five launches where eager frames take over a thousand. A device counter tells the graph which
frame it is on, so rows past their length (and padding rows, of length 0) keep their hypotheses, as in the eager
loop, whose result this equals. Off CUDA the same buffers and windows run eagerly (what the CPU tests check).

One graph per (rows bucket, vocabulary, the options that shape the frame's tensors: beam and token beam), kept by
the word resources the search belongs to: the graph holds the addresses of their trie and language-model tables.
The weights (LM weight, word bonus, threshold) are device scalars the graph reads, copied in from each search, so
requests with their own weights share a graph. At most ``max_graphs`` are kept, the oldest dropped first.

With ``compile_frames`` a frame runs through ``torch.compile`` before it is captured: its few hundred operations
become fewer, fused kernels, and their count is what a replayed frame's time is made of. The first capture pays the
compilation (seconds to tens of seconds; torch keeps compiled kernels on disk for the next process), and its
result is the eager frame's (the test compares them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import torch

from oasr.decode.base import power_of_two_bucket

log = logging.getLogger(__name__)

DEFAULT_FRAMES_PER_GRAPH = 8
DEFAULT_MAX_GRAPHS = 32


class FrameSearch(Protocol):
    """What the graphs need of a search (``LexiconBeamSearch``): its state is a dataclass of [B, K, ...] tensors,
    its ``weights`` a dataclass of the device scalars its frames read."""

    options: Any  # with .beam_size
    graph_key: Hashable  # the options a captured frame depends on
    weights: Any
    blank_id: int
    trie: object
    histories: object

    def layout(self, vocab_size: int, device: torch.device) -> Any: ...

    def start(self, batch: int, device: torch.device) -> Any: ...

    def advance(self, hyps: Any, frame: torch.Tensor, layout: Any,
                active: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]: ...


@dataclasses.dataclass
class _Captured:
    replay: Callable[[], Any]  # one window of frames: a graph's replay on CUDA, the frames themselves elsewhere
    # The frames themselves. A graph reads by address every tensor they close over (the layout among them, made
    # for the capture and held by nothing else): held here, so that memory is not handed to other tensors while
    # the graph lives.
    frames: Callable[[], None]
    hyps: Any  # the search's hypotheses for ``rows`` rows, updated in place by each replay
    start: Any  # their value at the sentence start
    window: torch.Tensor  # [rows, F, V]: the frames the next replay reads
    lengths: torch.Tensor  # [rows]
    frame_index: torch.Tensor  # [] long: the first frame of the window
    parents: torch.Tensor  # [F, rows, K], written by each replay
    emitted: torch.Tensor
    words: torch.Tensor
    search: FrameSearch  # keeps the captured tensors' owners alive


def _advance(search: FrameSearch, hyps: Any, frame: torch.Tensor, layout: Any,
             active: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One frame of ``search``: what ``torch.compile`` traces. Searches of one shape share its compilation (their
    trie, tables and weights are its tensor inputs, not constants)."""
    return search.advance(hyps, frame, layout, active)


class LexiconFrameGraphs:
    def __init__(self, frames_per_graph: int = DEFAULT_FRAMES_PER_GRAPH, max_graphs: int = DEFAULT_MAX_GRAPHS, *,
                 compile_frames: bool = False) -> None:
        self.frames_per_graph = frames_per_graph
        self.max_graphs = max_graphs
        self._advance = torch.compile(_advance, dynamic=False) if compile_frames else _advance
        self._graphs: dict[tuple, _Captured] = {}
        self._pool: Any = None

    def run(self, search: FrameSearch, log_probs: torch.Tensor,
            lengths: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """log_probs [B, T, V] on CUDA -> (hypotheses after the last frame [B, K], back-pointers: parent beam,
        emitted token, emitted word [T, B, K]), as the eager frames give them."""
        b, t, v = log_probs.shape
        # The trie and LM side by identity: a graph reads their tensors, and holds them (so the ids stay theirs).
        key = (power_of_two_bucket(b, 8), v, log_probs.dtype, str(log_probs.device), search.graph_key, search.blank_id,
               id(search.trie), id(search.histories))
        captured = self._graphs.get(key)
        if captured is None:
            while len(self._graphs) >= self.max_graphs:
                del self._graphs[next(iter(self._graphs))]  # the oldest capture
            captured = self._graphs[key] = self._capture(search, key[0], log_probs)
        for field in dataclasses.fields(search.weights):  # this search's weights, where the graph reads them
            getattr(captured.search.weights, field.name).copy_(getattr(search.weights, field.name))
        for field in dataclasses.fields(captured.hyps):
            getattr(captured.hyps, field.name).copy_(getattr(captured.start, field.name))
        captured.lengths.zero_()
        captured.lengths[:b].copy_(lengths)
        captured.frame_index.zero_()
        f = self.frames_per_graph
        padded = math.ceil(t / f) * f
        k = search.options.beam_size
        parents = torch.empty(padded, key[0], k, dtype=torch.long, device=log_probs.device)
        emitted, words = torch.empty_like(parents), torch.empty_like(parents)
        for first in range(0, t, f):
            n = min(f, t - first)
            captured.window[:b, :n].copy_(log_probs[:, first : first + n])
            captured.replay()
            parents[first : first + f].copy_(captured.parents)
            emitted[first : first + f].copy_(captured.emitted)
            words[first : first + f].copy_(captured.words)
        rows = type(captured.hyps)(*(getattr(captured.hyps, field.name)[:b]
                                     for field in dataclasses.fields(captured.hyps)))
        return rows, parents[:t, :b], emitted[:t, :b], words[:t, :b]

    def _capture(self, search: FrameSearch, rows: int, log_probs: torch.Tensor) -> _Captured:
        device, v, f = log_probs.device, log_probs.shape[2], self.frames_per_graph
        k = search.options.beam_size
        layout = search.layout(v, device)
        start = search.start(rows, device)
        hyps = type(start)(*(getattr(start, field.name).clone() for field in dataclasses.fields(start)))
        window = torch.zeros(rows, f, v, dtype=log_probs.dtype, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        frame_index = torch.zeros((), dtype=torch.long, device=device)
        out = [torch.zeros(f, rows, k, dtype=torch.long, device=device) for _ in range(3)]

        def frames() -> None:
            for step in range(f):
                after, parent, token, word = self._advance(search, hyps, window[:, step].double(), layout,
                                                           frame_index + step < lengths)
                for field in dataclasses.fields(hyps):
                    getattr(hyps, field.name).copy_(getattr(after, field.name))
                for buffer, value in zip(out, (parent, token, word), strict=True):
                    buffer[step].copy_(value)
            frame_index.add_(f)

        if device.type != "cuda":
            self._warm_up(frames)  # as on CUDA: a frame that cannot be compiled is found here
            return _Captured(frames, frames, hyps, start, window, lengths, frame_index, *out, search)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up: lazy initialisation (and compilation) must not happen in capture
            self._warm_up(frames)
        torch.cuda.current_stream(device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            frames()
        return _Captured(graph.replay, frames, hyps, start, window, lengths, frame_index, *out, search)

    def _warm_up(self, frames: Callable[[], None]) -> None:
        """Runs ``frames`` once. Where the compiled frame cannot be built here (no compiler toolchain, an inductor
        error), this object goes on with eager frames: slower, the same result, and the request is not lost."""
        try:
            frames()
        except Exception as e:  # what a failed compilation raises varies with torch's version and backend
            if self._advance is _advance:
                raise
            log.warning("the word beam's frame could not be compiled (%s: %s); its frames run eagerly",
                        type(e).__name__, e)
            self._advance = _advance
            frames()
