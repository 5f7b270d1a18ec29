"""Viterbi beam search of CTC log-probs through a decoding graph, on the device, batched over rows.

Token passing, as Kaldi's ``FasterDecoder`` does it, with every row's tokens in flat tensors: a token is (row,
graph state, cost, trace). Per frame, for the rows that still have frames:

1. the row's tokens are pruned: those more than ``beam`` above its best are dropped, and at most ``max_active``
   kept (at least ``min_active`` where the beam would leave fewer);
2. every emitting arc of every token is taken at once (the arcs of a state lie together in the graph's
   compressed rows), costing the arc's weight plus minus the frame's log-prob of its input label;
3. tokens that reach the same (row, state) are recombined, the cheapest kept, and those more than ``beam`` above
   the row's new best are dropped;
4. epsilon arcs are followed until no token improves (a round takes every epsilon arc of the tokens the previous
   round made or improved), within the same cutoff.

Each surviving arc writes one entry (parent entry, input label, output label) to a history that lives on the
device; the best final token's entries, read back once at the end, are the path. Only recombined, pruned
survivors are written, so the history grows by at most ``max_active`` entries per row and frame (more with
epsilon rounds). ``advance`` may be called again with a row's next frames: a stream's search goes on chunk by
chunk and ends where the whole utterance's would.

The costs are the tropical semiring's (minus log-probabilities, graph weights as written), so a path's cost is
what Kaldi reports: graph cost plus acoustic cost, the final weight included where a final state is reached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oasr.decode.wfst_graph import ArcTable, SearchGraph

_TRACE_BLOCK = 64  # traceback steps between two checks that every row's walk has ended
_BUCKETS = 256  # per row, for a minimum over many tokens


@dataclass(frozen=True)
class SearchLimits:
    """Pruning: ``beam`` (cost above the row's best beyond which tokens drop, natural-log units),
    ``max_active`` / ``min_active`` (bounds on a row's tokens per frame), ``max_epsilon_rounds`` (a bound on the
    rounds of epsilon arcs per frame; only a graph with an epsilon cycle of negative cost needs it)."""

    beam: float = 16.0
    max_active: int = 3000
    min_active: int = 20
    max_epsilon_rounds: int = 256
    # Recombination keeps a table of rows x graph states (8 bytes an entry) while it fits this many entries, and
    # sorts the candidates' (row, state) keys otherwise: the table is one scatter per frame, the sort several
    # passes; a graph of millions of states in a batch of dozens of rows sorts.
    table_entries: int = 1 << 26

    def __post_init__(self) -> None:
        if not self.beam > 0:
            raise ValueError(f"beam must be > 0, got {self.beam}")
        if not 1 <= self.min_active <= self.max_active:
            raise ValueError(f"need 1 <= min_active <= max_active, got {self.min_active}, {self.max_active}")


@dataclass(frozen=True)
class BestPath:
    """One row's best path: ``labels`` (the input label of each frame read, in order), ``words`` (the output
    labels, epsilons dropped) and ``cost`` (+inf with no path: no token survived)."""

    labels: list[int]
    words: list[int]
    cost: float


@dataclass(frozen=True)
class _Tokens:
    row: torch.Tensor  # int64 [n]
    state: torch.Tensor  # int64 [n]
    cost: torch.Tensor  # float32 [n]
    trace: torch.Tensor  # int64 [n]: the token's last history entry, -1 before any

    def __len__(self) -> int:
        return self.row.numel()

    def take(self, index: torch.Tensor) -> _Tokens:
        return _Tokens(self.row[index], self.state[index], self.cost[index], self.trace[index])

    def join(self, other: _Tokens) -> _Tokens:
        return _Tokens(torch.cat([self.row, other.row]), torch.cat([self.state, other.state]),
                       torch.cat([self.cost, other.cost]), torch.cat([self.trace, other.trace]))


def _arcs_of(table: ArcTable, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every arc of each state in ``states`` [n]: (position in ``states``, arc index), both int64 [total]."""
    first = table.offsets[states]
    counts = table.offsets[states + 1] - first
    total = int(counts.sum())  # the one read of the device per expansion: the candidates' number
    if total == 0:
        empty = torch.zeros(0, dtype=torch.long, device=states.device)
        return empty, empty
    which = torch.repeat_interleave(torch.arange(len(states), device=states.device), counts, output_size=total)
    before = torch.cumsum(counts, 0) - counts
    return which, first[which] + torch.arange(total, device=states.device) - before[which]


def _labels(labels: torch.Tensor, arc: torch.Tensor) -> torch.Tensor:
    """``labels[arc]`` where ``arc`` indexes them, 0 elsewhere (an entry of the other kind of arc)."""
    if not len(labels):
        return torch.zeros_like(arc)
    inside = (arc >= 0) & (arc < len(labels))
    return torch.where(inside, labels[arc.clamp(0, len(labels) - 1)], 0)


def _cheapest_sorted(keys: torch.Tensor, costs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The index of the cheapest entry of each distinct key (the first such, on ties), where ``keep`` holds for
    it; ordered by key."""
    distinct, group = torch.unique(keys, return_inverse=True)
    best = torch.full((len(distinct),), torch.inf, device=costs.device)
    best = best.scatter_reduce(0, group, costs, "amin")
    index = torch.arange(len(keys), device=keys.device)
    candidates = torch.where(costs == best[group], index, len(keys))
    won = torch.full_like(best, len(keys), dtype=torch.long).scatter_reduce(0, group, candidates, "amin")
    return won[keep[won].nonzero().squeeze(1)]


class KeyTable:
    """Recombination through a table indexed by key (row x states + state): the cheapest cost and the first
    index reaching it are scattered in, the winners read back, and only the touched entries reset after, so one
    table serves search after search (a graph keeps one per device: ``oasr.decode.ctc_wfst.DecodingGraph``)."""

    _NONE = torch.iinfo(torch.int32).max

    def __init__(self, size: int, device: torch.device) -> None:
        self.size = size
        self.best = torch.full((size,), torch.inf, device=device)
        self.first = torch.full((size,), self._NONE, dtype=torch.int32, device=device)

    def cheapest(self, keys: torch.Tensor, costs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The index of the cheapest entry of each distinct key (the first such, on ties), where ``keep`` holds for
        it; in entry order."""
        index = torch.arange(len(keys), dtype=torch.int32, device=keys.device)
        self.best.scatter_reduce_(0, keys, costs, "amin")
        self.first.scatter_reduce_(0, keys, torch.where(costs == self.best[keys], index, self._NONE), "amin")
        won = ((self.first[keys] == index) & keep).nonzero().squeeze(1)
        self.best.index_fill_(0, keys, torch.inf)
        self.first.index_fill_(0, keys, self._NONE)
        return won


class ViterbiSearch:
    """The search of ``num_rows`` rows through ``graph``: ``advance`` with each row's next frames, then
    ``best_paths``."""

    def __init__(self, graph: SearchGraph, num_rows: int, limits: SearchLimits | None = None,
                 table: KeyTable | None = None) -> None:
        """``table``: a key table of at least ``num_rows`` x the graph's states to recombine through; without one,
        the search makes its own where ``limits`` allow, and sorts keys otherwise."""
        self.graph = graph
        self.limits = limits or SearchLimits()
        self.num_rows = num_rows
        self.device = graph.finals.device
        entries = num_rows * graph.num_states
        if table is None and 0 < entries <= self.limits.table_entries:
            table = KeyTable(entries, self.device)
        if table is not None and table.size < entries:
            raise ValueError(f"a key table of {table.size} entries cannot hold {num_rows} rows x {graph.num_states} "
                             "states")
        self._cheapest = table.cheapest if table is not None else _cheapest_sorted
        self._history: list[tuple[torch.Tensor, torch.Tensor]] = []  # (parent entry, arc) per entry
        self._history_size = 0
        rows = torch.arange(num_rows, device=self.device)
        start = _Tokens(rows, torch.full_like(rows, graph.start), torch.zeros(num_rows, device=self.device),
                        torch.full_like(rows, -1))
        self._tokens = self._follow_epsilons(start, torch.full((num_rows,), self.limits.beam, device=self.device))

    def advance(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> None:
        """log_probs: [num_rows, T, V] (a row's frames in order, continuing its previous ones), lengths: [num_rows]
        (its frames in this call; the rest are padding)."""
        log_probs = torch.nan_to_num(log_probs.float(), nan=-torch.inf)
        shortest, longest = (int(lengths.min()), int(lengths.max())) if len(lengths) else (0, 0)
        lengths = lengths.to(self.device)
        for frame in range(longest):
            if frame < shortest:  # every row reads the frame
                self._tokens = self._read_frame(self._tokens, log_probs[:, frame])
                continue
            live = (lengths > frame)[self._tokens.row]
            order = torch.argsort(live.to(torch.int8), stable=True)  # the idle rows' tokens, then the live ones'
            num_idle = len(order) - int(live.sum())
            idle = self._tokens.take(order[:num_idle])
            self._tokens = idle.join(self._read_frame(self._tokens.take(order[num_idle:]), log_probs[:, frame]))

    def best_paths(self) -> list[BestPath]:
        """Each row's cheapest token at a final state (its final weight added), or its cheapest token where none
        is final, as Kaldi's ``use_final_probs``; read back in one walk over the history."""
        tokens, rows = self._tokens, self.num_rows
        if not len(tokens):
            return [BestPath([], [], torch.inf) for _ in range(rows)]
        finals = self.graph.finals[tokens.state]
        ends_final = torch.zeros(rows, dtype=torch.long, device=self.device)
        ends_final = ends_final.scatter_reduce(0, tokens.row, torch.isfinite(finals).long(), "amax") > 0
        costs = torch.where(ends_final[tokens.row], tokens.cost + finals, tokens.cost)
        best = torch.full((rows,), torch.inf, device=self.device).scatter_reduce(0, tokens.row, costs, "amin")
        pick = torch.full((rows,), len(tokens), device=self.device).scatter_reduce(
            0, tokens.row, torch.where(costs == best[tokens.row], torch.arange(len(tokens), device=self.device),
                                       len(tokens)), "amin")
        found = pick < len(tokens)
        pointer = torch.where(found, tokens.trace[pick.clamp(max=len(tokens) - 1)], -1)
        labels, words = self._walk(pointer)
        return [BestPath(labels[row], words[row], cost) if has else BestPath([], [], torch.inf)
                for row, (has, cost) in enumerate(zip(found.tolist(), best.tolist()))]

    def _walk(self, pointer: torch.Tensor) -> tuple[list[list[int]], list[list[int]]]:
        empty: list[list[int]] = [[] for _ in range(self.num_rows)]
        if not self._history_size:
            return empty, [[] for _ in range(self.num_rows)]
        parent, arc = (torch.cat(parts) for parts in zip(*self._history))
        arc = arc.long()
        reads = arc >= 0
        ilabel = torch.where(reads, _labels(self.graph.emitting.ilabels, arc), 0)
        olabel = torch.where(reads, _labels(self.graph.emitting.olabels, arc),
                             _labels(self.graph.epsilon.olabels, -1 - arc))
        steps: list[tuple[torch.Tensor, torch.Tensor]] = []
        while bool((pointer >= 0).any()):
            for _ in range(_TRACE_BLOCK):
                valid, at = pointer >= 0, pointer.clamp(min=0)
                steps.append((torch.where(valid, ilabel[at], 0), torch.where(valid, olabel[at], 0)))
                pointer = torch.where(valid, parent[at], -1)
        inputs = torch.stack([s[0] for s in steps], 1).flip(1).tolist()
        outputs = torch.stack([s[1] for s in steps], 1).flip(1).tolist()
        return [[x for x in row if x] for row in inputs], [[x for x in row if x] for row in outputs]

    def _record(self, parent: torch.Tensor, arc: torch.Tensor) -> torch.Tensor:
        """Appends history entries (arc: an emitting arc's index, or -1 - an epsilon arc's); their indices."""
        index = self._history_size + torch.arange(len(parent), device=self.device)
        self._history.append((parent, arc.to(torch.int32)))
        self._history_size += len(parent)
        return index

    def _read_frame(self, tokens: _Tokens, frame: torch.Tensor) -> _Tokens:
        """One frame (frame: [num_rows, V] log-probs) for tokens whose rows read it."""
        if not len(tokens):
            return tokens
        tokens = self._prune(tokens)
        table = self.graph.emitting
        which, arc = _arcs_of(table, tokens.state)
        if not len(which):
            return tokens.take(which)
        row, label = tokens.row[which], table.ilabels[arc]
        cost = tokens.cost[which] + table.weights[arc] - frame[row, label - 1]
        state = table.next_states[arc]
        cutoff = self._row_best(row, cost) + self.limits.beam  # the best candidate is a winner: the same cutoff
        won = self._cheapest(row * self.graph.num_states + state, cost, cost <= cutoff[row])
        trace = self._record(tokens.trace[which[won]], arc[won])
        return self._follow_epsilons(_Tokens(row[won], state[won], cost[won], trace), cutoff)

    def _follow_epsilons(self, tokens: _Tokens, cutoff: torch.Tensor) -> _Tokens:
        """Epsilon arcs from ``tokens`` (distinct states per row) until none improves a token; cutoff: [num_rows]."""
        table = self.graph.epsilon
        if table.empty:
            return tokens
        frontier = torch.arange(len(tokens), device=self.device)
        for _ in range(self.limits.max_epsilon_rounds):
            which, arc = _arcs_of(table, tokens.state[frontier])
            if not len(which):
                break
            source = frontier[which]
            row, state = tokens.row[source], table.next_states[arc]
            cost = tokens.cost[source] + table.weights[arc]
            keys = torch.cat([tokens.row, row]) * self.graph.num_states + torch.cat([tokens.state, state])
            costs = torch.cat([tokens.cost, cost])
            keep = torch.cat([torch.ones_like(tokens.cost, dtype=torch.bool), cost <= cutoff[row]])
            won = self._cheapest(keys, costs, keep)  # a tie keeps the token already there
            fresh = won >= len(tokens)
            order = torch.argsort(fresh.to(torch.int8), stable=True)  # the tokens kept, then the new ones
            num_kept = len(won) - int(fresh.sum())
            if num_kept == len(won):
                break
            new = won[order[num_kept:]] - len(tokens)
            trace = self._record(tokens.trace[source[new]], -1 - arc[new])
            tokens = tokens.take(won[order[:num_kept]]).join(_Tokens(row[new], state[new], cost[new], trace))
            frontier = torch.arange(num_kept, len(tokens), device=self.device)
        return tokens

    def _row_best(self, row: torch.Tensor, cost: torch.Tensor) -> torch.Tensor:
        """[num_rows]: each row's least cost. Spread over buckets first: hundreds of thousands of atomic minimums
        into a few dozen places would queue behind each other."""
        bucket = row * _BUCKETS + torch.arange(len(row), device=self.device) % _BUCKETS
        best = torch.full((self.num_rows * _BUCKETS,), torch.inf, device=self.device)
        return best.scatter_reduce(0, bucket, cost, "amin").view(self.num_rows, _BUCKETS).amin(1)

    def _prune(self, tokens: _Tokens) -> _Tokens:
        """Per row: within ``beam`` of the best, at most ``max_active``, at least ``min_active`` (Kaldi's cutoff)."""
        limits = self.limits
        by_cost = torch.argsort(tokens.cost, stable=True)
        order = by_cost[torch.argsort(tokens.row[by_cost], stable=True)]  # by row, then by cost
        counts = torch.zeros(self.num_rows, dtype=torch.long, device=self.device)
        counts = counts.scatter_add(0, tokens.row, torch.ones_like(tokens.row))
        first = torch.cumsum(counts, 0) - counts
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=self.device) - first[tokens.row[order]]
        near = tokens.cost <= (self._row_best(tokens.row, tokens.cost) + limits.beam)[tokens.row]
        keep = (near | (rank < limits.min_active)) & (rank < limits.max_active)
        return tokens.take(keep.nonzero().squeeze(1))
