"""CTC decoding over a WFST decoding graph (an OpenFst ``HLG.fst`` / ``TLG.fst``: tokens in, words out).

The graph is what k2/icefall, sherpa-onnx and Kaldi build: an input label is a column of the model's CTC output
plus one (label 0 is epsilon, so the blank at column ``b`` is label ``b + 1``), an output label a word id. The
search is Kaldi's ``FasterDecoder`` (Viterbi beam search with a score beam and a cap on active states) from the
``kaldi-decoder`` package, over a ``DecodableCtc`` of each row's log-probs: a well-kept library that icefall and
sherpa-onnx decode with, so OASR reads the graph and the best path and writes no search of its own. It runs on
the host, row by row; the log-probs come over in one copy per batch.

The best path gives one input label per frame; its CTC collapse (repeats merged, blanks dropped) is the token
sequence the engine reports and the tokenizer turns into text. For that text to be the graph's words, the graph's
lexicon must spell each word with the model's own tokens, as icefall's BPE lexicons do. The output labels (word
ids of the graph's words table) come back beside the tokens for callers that read them.

Needs the ``wfst`` extra: ``pip install 'oasr[wfst]'`` (kaldifst, kaldi-decoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import DecodeStrategy, EncoderOutput
from oasr.decode.ctc_greedy import CTCModel
from oasr.decode.lexicon import DecodingResourceError
from oasr.decode.pending import LaunchesEagerly

if TYPE_CHECKING:  # annotations only: kaldifst is an optional dependency
    import kaldifst

_MISSING_EXTRA = "WFST decoding needs kaldifst and kaldi-decoder: pip install 'oasr[wfst]'"


@dataclass(frozen=True)
class WFSTOptions:
    """Kaldi ``FasterDecoder``'s pruning. ``beam``: states whose cost is more than this above the best one's are
    dropped (natural-log units); ``max_active`` / ``min_active``: bounds on the states kept per frame (the
    beam tightens or widens to meet them). The defaults are sherpa-onnx's for its CTC FST decoder."""

    beam: float = 16.0
    max_active: int = 3000
    min_active: int = 20

    def __post_init__(self) -> None:
        if not self.beam > 0:
            raise ValueError(f"beam must be > 0, got {self.beam}")
        if not 1 <= self.min_active <= self.max_active:
            raise ValueError(f"need 1 <= min_active <= max_active, got {self.min_active}, {self.max_active}")


@dataclass(frozen=True)
class WFSTPath:
    """One row's best path: ``token_ids`` (CTC-collapsed model tokens), ``word_ids`` (the graph's output labels,
    epsilons dropped) and ``cost`` (graph cost plus acoustic cost: minus the log-probability along the path)."""

    token_ids: list[int]
    word_ids: list[int]
    cost: float


def read_graph(path: str | Path) -> kaldifst.StdFst:
    """An OpenFst graph file (vector or const FST over the tropical semiring), refused clearly when missing,
    unreadable or without a start state."""
    try:
        import kaldifst
    except ImportError:
        raise DecodingResourceError(_MISSING_EXTRA) from None
    path = Path(path)
    if not path.is_file():
        raise DecodingResourceError(f"decoding graph file not found: {path}")
    # OpenFst's readers return nothing (and log to stderr) for a file of another type; the const reader takes
    # graphs written by ``fstconvert --fst_type=const``, as Kaldi's HCLG.fst often is.
    graph = kaldifst.StdVectorFst.read(str(path)) or kaldifst.StdConstFst.read(str(path))
    if graph is None:
        raise DecodingResourceError(f"cannot read the decoding graph {path}: not an OpenFst file over the "
                                    "standard (tropical) arc type")
    if graph.start < 0:
        raise DecodingResourceError(f"the decoding graph {path} has no start state (an empty FST)")
    return graph


def collapse_ctc(labels: list[int], blank_id: int) -> list[int]:
    """Per-frame input labels (column + 1) -> the tokens a CTC path spells: repeats merged, blanks dropped."""
    tokens, previous = [], None
    for label in labels:
        column = label - 1
        if column != previous and column != blank_id:
            tokens.append(column)
        previous = column
    return tokens


def decode_row(graph: kaldifst.StdFst, log_probs: torch.Tensor, blank_id: int, options: WFSTOptions) -> WFSTPath:
    """log_probs: [T, V] float (one row, its valid frames) -> the best path through ``graph``; a row whose
    frames reach no final state takes the best partial path, as Kaldi does (``use_final_probs``)."""
    import kaldi_decoder
    import kaldifst

    decoder = kaldi_decoder.FasterDecoder(graph, kaldi_decoder.FasterDecoderOptions(
        beam=options.beam, max_active=options.max_active, min_active=options.min_active))
    decoder.decode(kaldi_decoder.DecodableCtc(log_probs.float().numpy()))
    found, lattice = decoder.get_best_path()
    if not found:  # no token survived the beam (or the graph accepts no input): nothing decoded
        return WFSTPath([], [], float("inf"))
    _, labels, words, weight = kaldifst.get_linear_symbol_sequence(lattice)
    return WFSTPath(collapse_ctc(list(labels), blank_id), list(words), weight.value1 + weight.value2)


class DecodingGraphCache:
    """The graphs one runner has read, by path: an HLG graph takes seconds to read and hundreds of MB, so each
    is read once, at the first request that names it."""

    def __init__(self) -> None:
        self._graphs: dict[str, kaldifst.StdFst] = {}

    def get(self, path: str) -> kaldifst.StdFst:
        if path not in self._graphs:
            self._graphs[path] = read_graph(path)
        return self._graphs[path]


@DECODE_STRATEGIES.register("ctc_wfst")
class CTCWFST(LaunchesEagerly, DecodeStrategy):
    runner: ClassVar[str] = "frame_sync"  # the runner kind that drives it
    decodes_graphs: ClassVar[bool] = True  # serves DecodeOptions.decoding_graph (``for_graph``)

    def __init__(self, graph: kaldifst.StdFst | None = None, options: WFSTOptions | None = None) -> None:
        if graph is None:
            raise ValueError("WFST decoding needs a decoding graph (read_graph / DecodingGraphCache)")
        self.graph = graph
        self.options = options or WFSTOptions()

    @classmethod
    def for_graph(cls, graph: kaldifst.StdFst) -> CTCWFST:
        """The search for requests that name ``graph`` (already read)."""
        return cls(graph)

    def paths(self, log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int) -> list[WFSTPath]:
        """log_probs: [B, T, V], lengths: [B] -> each row's best path over its valid frames."""
        host = log_probs.float().cpu()  # the one copy to the host
        return [decode_row(self.graph, host[row, :length], blank_id, self.options)
                for row, length in enumerate(lengths.tolist())]

    def decode(self, model: CTCModel, encoder_output: EncoderOutput) -> list[list[int]]:
        """encoder_output: hidden [B, T, D], lengths [B] -> the best path's tokens per row."""
        log_probs = model.ctc_log_probs(encoder_output.hidden)
        return [path.token_ids for path in self.paths(log_probs, encoder_output.lengths, model.blank_id)]
