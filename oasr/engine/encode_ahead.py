"""Encoder outputs computed before their requests are admitted, on a stream of their own, beside decode steps.

A Whisper-sized encoder is bound by the tensor cores; a decode step of a few dozen rows is bound by memory and by
its many small kernels, and leaves most of the device idle. Run one after the other, an engine pays for both.
The scheduler names the waiting requests it expects to admit next (``SchedulerOutput.encode_next``); while a
decode tick runs, the runner encodes them here, on a low-priority stream, so the encoder fills what decode leaves
free. When a request is admitted its prompt pass takes the output instead of encoding it again. The engine's own
stream runs at a higher priority, so decode steps keep their pace while the encoder catches up.

Only the encoder's output is held (for large-v3, 64 rows are 245 MB); everything that needs a slot (the
cross-attention K/V, the prompt) still runs at admission. At most ``max_rows`` rows are held or in flight. A
request that leaves before admission (aborted) is dropped at the next step; one admitted in another batch than
it was encoded in is gathered out of its batch. Off CUDA there is no second stream: ``launch`` encodes at once,
which keeps the bookkeeping the same (and testable) everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass

import torch

from oasr.engine.request import Request
from oasr.models.base import EncoderOutput


@dataclass(frozen=True)
class _Held:
    output: EncoderOutput  # the whole batch it was encoded in
    row: int
    done: torch.cuda.Event | None  # recorded on the side stream after the batch's encoder pass


class EncodeAhead:
    def __init__(self, device: torch.device, max_rows: int, min_rows: int = 1) -> None:
        self.device = device
        self.max_rows = max_rows
        self.min_rows = min_rows
        self._held: dict[str, _Held] = {}
        self._side = torch.cuda.Stream(device) if device.type == "cuda" else None  # priority 0: the lowest
        self.rows_launched = 0  # rows encoded ahead so far
        self.rows_used = 0  # of those, rows a prompt pass took

    @property
    def num_held(self) -> int:
        return len(self._held)

    def holds(self, request_id: str) -> bool:
        return request_id in self._held

    def retain(self, live: Container[str]) -> None:
        """Drops the outputs of requests no longer in ``live`` (aborted or finished elsewhere)."""
        for request_id in [r for r in self._held if r not in live]:
            del self._held[request_id]

    def launch(self, candidates: Sequence[Request], encode: Callable[[list[Request]], EncoderOutput]) -> int:
        """Encodes those of ``candidates`` not yet held, in their order, up to the room left; -> rows launched.
        Fewer than ``min_rows`` are not worth a pass of their own unless they are all the candidates."""
        fresh = [q for q in candidates if q.request_id not in self._held]
        batch = fresh[: self.max_rows - len(self._held)]
        if not batch or (len(batch) < self.min_rows and len(batch) < len(fresh)):
            return 0
        with self._on_side() as done:
            output = encode(batch)
        for i, request in enumerate(batch):
            self._held[request.request_id] = _Held(output, i, done)
        self.rows_launched += len(batch)
        return len(batch)

    def take(self, batch: Sequence[Request]) -> dict[int, tuple[EncoderOutput, int]]:
        """The held outputs among ``batch``'s requests, by index in ``batch``: (its batch's output, its row there),
        usable on the current stream (which now waits for them). Each is handed out once."""
        found: dict[int, tuple[EncoderOutput, int]] = {}
        stream = torch.cuda.current_stream(self.device) if self._side is not None else None
        waited: set[int] = set()
        for i, request in enumerate(batch):
            held = self._held.pop(request.request_id, None)
            if held is None:
                continue
            if stream is not None and id(held.done) not in waited:
                stream.wait_event(held.done)
                # The side stream's allocator must not reuse these bytes before this stream has read them.
                held.output.hidden.record_stream(stream)
                held.output.lengths.record_stream(stream)
                waited.add(id(held.done))
            found[i] = (held.output, held.row)
        self.rows_used += len(found)
        return found

    @contextlib.contextmanager
    def _on_side(self) -> Iterator[torch.cuda.Event | None]:
        if self._side is None:
            yield None
            return
        done = torch.cuda.Event()
        # Whatever the engine's stream queued (block tables, caller features) comes first.
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            yield done
            done.record(self._side)


def gathered(parts: dict[int, tuple[EncoderOutput, int]], fresh: EncoderOutput | None, fresh_rows: list[int],
             size: int) -> EncoderOutput:
    """One batch's encoder output from rows encoded ahead (``parts``) and rows just encoded (``fresh``, whose row
    j is batch row ``fresh_rows[j]``). A batch that is exactly one ahead pass, in order, is that pass's output;
    otherwise the rows are copied into one tensor, zero past each row's own frames."""
    if fresh is None and len(parts) == size:
        outputs = {id(output) for output, _ in parts.values()}
        first, _ = parts[0]
        if len(outputs) == 1 and first.hidden.shape[0] == size and all(parts[i][1] == i for i in range(size)):
            return first
    rows: list[tuple[torch.Tensor, torch.Tensor]] = [None] * size  # type: ignore[list-item]
    for i, (output, row) in parts.items():
        rows[i] = (output.hidden[row], output.lengths[row])
    for j, i in enumerate(fresh_rows):
        rows[i] = (fresh.hidden[j], fresh.lengths[j])
    frames = max(h.shape[0] for h, _ in rows)
    width = rows[0][0].shape[-1]
    hidden = rows[0][0].new_zeros(size, frames, width)
    for i, (h, _) in enumerate(rows):
        hidden[i, : h.shape[0]] = h
    return EncoderOutput(hidden=hidden, lengths=torch.stack([n for _, n in rows]))
