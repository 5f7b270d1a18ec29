"""CTC decoding over a WFST decoding graph (an OpenFst ``HLG.fst`` / ``TLG.fst``: tokens in, words out).

The graph is what k2/icefall, sherpa-onnx and Kaldi build: an input label is a column of the model's CTC output
plus one (label 0 is epsilon, so the blank at column ``b`` is label ``b + 1``), an output label a word id. The
search is a Viterbi beam search on the model's device, batched over the rows (``oasr.decode.wfst_search``), with
the pruning of Kaldi's ``FasterDecoder`` and sherpa-onnx's settings for it; kaldifst reads the graph
(``oasr.decode.wfst_graph``). The log-probs stay where the encoder wrote them.

The best path gives one input label per frame; its CTC collapse (repeats merged, blanks dropped) is the token
sequence the engine reports and the tokenizer turns into text. For that text to be the graph's words, the graph's
lexicon must spell each word with the model's own tokens, as icefall's BPE lexicons do. The output labels (word
ids of the graph's words table) come back beside the tokens for callers that read them.

Needs the ``wfst`` extra: ``pip install 'oasr[wfst]'`` (kaldifst).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.ctc_greedy import CTCModel
from oasr.decode.lexicon import DecodingResourceError
from oasr.decode.pending import LaunchesEagerly
from oasr.decode.wfst_graph import GraphArrays, SearchGraph, read_graph_arrays
from oasr.decode.wfst_search import BestPath, KeyTable, SearchLimits, ViterbiSearch


@dataclass(frozen=True)
class WFSTPath:
    """One row's best path: ``token_ids`` (CTC-collapsed model tokens), ``word_ids`` (the graph's output labels,
    epsilons dropped) and ``cost`` (graph cost plus acoustic cost: minus the log-probability along the path)."""

    token_ids: list[int]
    word_ids: list[int]
    cost: float

    @classmethod
    def of(cls, path: BestPath, blank_id: int) -> WFSTPath:
        return cls(collapse_ctc(path.labels, blank_id), path.words, path.cost)


def collapse_ctc(labels: list[int], blank_id: int) -> list[int]:
    """Per-frame input labels (column + 1) -> the tokens a CTC path spells: repeats merged, blanks dropped."""
    tokens, previous = [], None
    for label in labels:
        column = label - 1
        if column != previous and column != blank_id:
            tokens.append(column)
        previous = column
    return tokens


class DecodingGraph:
    """A graph read once, laid out on each device that searches it (the arrays are kept on the host)."""

    def __init__(self, arrays: GraphArrays) -> None:
        self.arrays = arrays
        self.highest_label = int(arrays.ilabels.max()) if arrays.num_arcs else 0
        self._placed: dict[torch.device, SearchGraph] = {}
        self._tables: dict[torch.device, KeyTable] = {}

    def on(self, device: torch.device) -> SearchGraph:
        if device not in self._placed:
            self._placed[device] = SearchGraph.of(self.arrays, device)
        return self._placed[device]

    def key_table(self, device: torch.device, entries: int) -> KeyTable:
        """The recombination table searches of this graph on ``device`` share, grown to ``entries`` if smaller
        (searches take turns on a runner: each leaves the table as it found it)."""
        table = self._tables.get(device)
        if table is None or table.size < entries:
            table = self._tables[device] = KeyTable(entries, device)
        return table

    def check_columns(self, num_columns: int) -> None:
        """Refuses a graph that reads a label past the model's output columns (built for another vocabulary)."""
        if self.highest_label > num_columns:
            raise DecodingResourceError(f"the decoding graph reads input label {self.highest_label}, but the model "
                                        f"writes {num_columns} CTC columns (labels 1..{num_columns}): it was built "
                                        "for another model's vocabulary")


class DecodingGraphCache:
    """The graphs one runner has read, by path: an HLG graph takes seconds to read and hundreds of MB, so each
    is read once, at the first request that names it."""

    def __init__(self) -> None:
        self._graphs: dict[str, DecodingGraph] = {}

    def get(self, path: str | Path) -> DecodingGraph:
        key = str(path)
        if key not in self._graphs:
            self._graphs[key] = DecodingGraph(read_graph_arrays(key))
        return self._graphs[key]


class GraphCTCModel(CTCModel, Protocol):
    """What the search reads of a model beyond CTC's contract: its output width, checked against a graph's
    labels when a request names the graph."""

    ctc_columns: int


@DECODE_STRATEGIES.register("ctc_wfst")
class CTCWFST(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    decodes_graphs: ClassVar[bool] = True  # serves DecodeOptions.decoding_graph (``for_graph``)

    def __init__(self, graph: DecodingGraph | None = None, limits: SearchLimits | None = None) -> None:
        if graph is None:
            raise ValueError("WFST decoding needs a decoding graph (DecodingGraphCache)")
        self.graph = graph
        self.limits = limits or SearchLimits()

    @classmethod
    def for_graph(cls, graph: DecodingGraph) -> CTCWFST:
        """The search for requests that name ``graph`` (already read)."""
        return cls(graph)

    def search(self, num_rows: int, device: torch.device) -> ViterbiSearch:
        """A search of ``num_rows`` rows to advance frame block by frame block (a stream's chunks)."""
        graph = self.graph.on(device)
        entries = num_rows * graph.num_states
        fits = 0 < entries <= self.limits.table_entries
        return ViterbiSearch(graph, num_rows, self.limits, self.graph.key_table(device, entries) if fits else None)

    def paths(self, log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int) -> list[WFSTPath]:
        """log_probs: [B, T, V], lengths: [B] -> each row's best path over its valid frames."""
        self.graph.check_columns(log_probs.shape[-1])
        search = self.search(log_probs.shape[0], log_probs.device)
        search.advance(log_probs, lengths)
        return [WFSTPath.of(path, blank_id) for path in search.best_paths()]

    def decode(self, model: GraphCTCModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> the best path's tokens per row."""
        log_probs = model.ctc_log_probs(encoder_output.hidden)
        return [path.token_ids for path in self.paths(log_probs, encoder_output.lengths, model.blank_id)]
