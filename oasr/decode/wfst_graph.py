"""A decoding graph (an OpenFst ``HLG.fst`` / ``TLG.fst`` over the tropical semiring) as flat arrays for a search on
the device.

kaldifst reads the file (vector or const FST) and converts it to OpenFst's const layout, whose binary form is a
header, one fixed-size record per state and one per arc, arcs grouped by their source state. numpy reads those
records in place, so a graph of millions of arcs becomes arrays in about the time it takes to write it, with no
loop over states in Python. The arrays are the graph in compressed sparse rows: state ``s``'s arcs are
``offsets[s]:offsets[s + 1]``.

Needs the ``wfst`` extra for reading: ``pip install 'oasr[wfst]'`` (kaldifst).
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oasr.decode.lexicon import DecodingResourceError

_MISSING_EXTRA = "WFST decoding needs kaldifst to read the graph: pip install 'oasr[wfst]'"
_FST_MAGIC = 2125659606
_SYMBOLS_MAGIC = 2125658996
_HAS_INPUT_SYMBOLS, _HAS_OUTPUT_SYMBOLS, _IS_ALIGNED = 1, 2, 4
_STATE = np.dtype([("final", "<f4"), ("first", "<u4"), ("count", "<u4"), ("in_eps", "<u4"), ("out_eps", "<u4")])
_ARC = np.dtype([("ilabel", "<i4"), ("olabel", "<i4"), ("weight", "<f4"), ("next", "<i4")])


@dataclass(frozen=True)
class GraphArrays:
    """A graph in compressed sparse rows, on the host. ``offsets`` int64 [N + 1]; per arc (grouped by source
    state, in the file's order) ``ilabels`` / ``olabels`` int32 (0 is epsilon), ``weights`` float32 (a cost:
    lower is better) and ``next_states`` int32; ``finals`` float32 [N], +inf where a state is not final."""

    start: int
    offsets: np.ndarray
    ilabels: np.ndarray
    olabels: np.ndarray
    weights: np.ndarray
    next_states: np.ndarray
    finals: np.ndarray

    @property
    def num_states(self) -> int:
        return len(self.finals)

    @property
    def num_arcs(self) -> int:
        return len(self.ilabels)


@dataclass(frozen=True)
class ArcTable:
    """One kind of arc (emitting or epsilon) in compressed sparse rows on the device: state ``s``'s arcs are
    ``offsets[s]:offsets[s + 1]`` of the other tensors."""

    offsets: torch.Tensor  # int64 [N + 1]
    ilabels: torch.Tensor  # int64 [E]
    olabels: torch.Tensor  # int64 [E]
    weights: torch.Tensor  # float32 [E]
    next_states: torch.Tensor  # int64 [E]

    @property
    def empty(self) -> bool:
        return self.ilabels.numel() == 0

    @classmethod
    def select(cls, graph: GraphArrays, keep: np.ndarray, device: torch.device) -> ArcTable:
        """The arcs where ``keep`` holds, each state's in their order."""
        source = np.repeat(np.arange(graph.num_states), np.diff(graph.offsets))[keep]
        offsets = np.zeros(graph.num_states + 1, dtype=np.int64)
        np.cumsum(np.bincount(source, minlength=graph.num_states), out=offsets[1:])

        def put(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(values[keep])).to(device=device, dtype=dtype)

        return cls(torch.from_numpy(offsets).to(device), put(graph.ilabels, torch.long),
                   put(graph.olabels, torch.long), put(graph.weights, torch.float32),
                   put(graph.next_states, torch.long))


@dataclass(frozen=True)
class SearchGraph:
    """A graph on a device, its arcs split by whether they read a frame (``emitting``: input label > 0) or not
    (``epsilon``), as a token-passing search uses them; ``finals`` float32 [N] on the device."""

    start: int
    num_states: int
    emitting: ArcTable
    epsilon: ArcTable
    finals: torch.Tensor

    @classmethod
    def of(cls, graph: GraphArrays, device: torch.device | str) -> SearchGraph:
        device = torch.device(device)
        reads = graph.ilabels > 0
        return cls(graph.start, graph.num_states, ArcTable.select(graph, reads, device),
                   ArcTable.select(graph, ~reads, device), torch.from_numpy(graph.finals).to(device))


class _Reader:
    """A cursor over OpenFst's binary layout (little-endian)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (size,) = self.take("i")
        text = self.data[self.at : self.at + size].decode()
        self.at += size
        return text

    def align(self) -> None:
        self.at = -(-self.at // 16) * 16

    def records(self, dtype: np.dtype, count: int) -> np.ndarray:
        end = self.at + dtype.itemsize * count
        if end > len(self.data):
            raise ValueError("the file ends early")
        values = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at = end
        return values

    def skip_symbols(self) -> None:
        (magic,) = self.take("i")
        if magic != _SYMBOLS_MAGIC:
            raise ValueError("a symbol table without its magic number")
        self.string()  # the table's name
        _, size = self.take("qq")  # next free key, number of symbols
        for _ in range(size):
            self.string()
            self.take("q")


def parse_const(data: bytes) -> GraphArrays:
    """The bytes of a const FST over the standard arc type (as ``kaldifst.StdConstFst.write`` writes it) ->
    arrays; ``ValueError`` for anything else."""
    reader = _Reader(data)
    (magic,) = reader.take("i")
    if magic != _FST_MAGIC:
        raise ValueError("not an OpenFst file")
    kind, arc_type = reader.string(), reader.string()
    if kind != "const" or arc_type != "standard":
        raise ValueError(f"expected a const FST of standard arcs, found {kind!r} of {arc_type!r}")
    _version, flags = reader.take("ii")
    _properties, start, num_states, num_arcs = reader.take("Qqqq")
    for flag in (_HAS_INPUT_SYMBOLS, _HAS_OUTPUT_SYMBOLS):
        if flags & flag:
            reader.skip_symbols()
    if flags & _IS_ALIGNED:
        reader.align()
    states = reader.records(_STATE, num_states)
    if flags & _IS_ALIGNED:
        reader.align()
    arcs = reader.records(_ARC, num_arcs)
    offsets = np.zeros(num_states + 1, dtype=np.int64)
    np.cumsum(states["count"], out=offsets[1:])
    if num_states and (offsets[-1] != num_arcs or not np.array_equal(states["first"], offsets[:-1])):
        raise ValueError("the states' arc ranges do not tile the arcs")
    if num_arcs and not (0 <= arcs["next"].min() and arcs["next"].max() < num_states):
        raise ValueError("an arc leads to a state the graph does not have")
    return GraphArrays(int(start), offsets, arcs["ilabel"].copy(), arcs["olabel"].copy(), arcs["weight"].copy(),
                       arcs["next"].copy(), states["final"].copy())


def read_graph_arrays(path: str | Path) -> GraphArrays:
    """An OpenFst graph file (vector or const FST over the tropical semiring) -> arrays, refused clearly when
    missing, unreadable or without a start state."""
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
    with tempfile.TemporaryDirectory() as scratch:
        const = Path(scratch) / "graph.fst"
        kaldifst.StdConstFst(graph).write(str(const))
        try:
            return parse_const(const.read_bytes())
        except ValueError as exc:
            raise DecodingResourceError(f"cannot lay out the decoding graph {path}: {exc}") from None
