"""``ASREngine``: requests in, results out, one ``step()`` at a time (schedule -> execute -> update)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from oasr.engine.batch_stats import BatchSizeCounter, BatchSizeCounts
from oasr.engine.config import EngineConfig
from oasr.engine.contracts import OverlappingRunner
from oasr.engine.request import BULK_PRIORITY, Request, RequestOutput
from oasr.engine.runners import RUNNERS
from oasr.engine.scheduler import Scheduler
from oasr.engine.stats import EngineStats
from oasr.engine.step import PendingStep, SchedulerOutput
from oasr.errors import OASRError
from oasr.models.capabilities import capabilities_of
from oasr.models.loader import LoadedModel
from oasr.registry import conform
from oasr.types import DecodeOptions

_LENGTH_LOOKAHEAD_BATCHES = 4  # offline feeding reads this many encode batches ahead to group similar lengths




class ASREngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig()
        self.loaded = loaded
        self.capabilities = capabilities_of(type(loaded.model))
        self.runner = RUNNERS.get(self.capabilities.runner)(loaded, config)
        if self.runner.overlaps_steps:
            conform(self.runner, OverlappingRunner, f"the {self.capabilities.runner} runner")
        self.pool = self.runner.block_pool
        # The memory plan may grant fewer slots than asked; the scheduler must not hand out more.
        self.config = replace(config, scheduler=replace(config.scheduler, max_num_seqs=self.runner.num_slots))
        self.scheduler = Scheduler(self.config.scheduler, self.pool, eot=self.runner.end_token,
                                   stop_tokens=self.runner.stop_tokens,
                                   max_positions=self.runner.max_positions, incremental=self.runner.incremental,
                                   cross_pool=self.runner.cross_pool, output_language=self.runner.output_language)
        self._ids = itertools.count()
        # Runners that overlap steps: the launched step whose result is read after the next step is queued.
        self._in_flight: tuple[SchedulerOutput, PendingStep] | None = None
        self.encode_batch_sizes = BatchSizeCounter(self.config.runner.batch_buckets)
        self.decode_batch_sizes = BatchSizeCounter(self.config.runner.batch_buckets)

    def add_request(
        self,
        audio: np.ndarray,
        options: DecodeOptions | None = None,
        request_id: str | None = None,
        *,
        features: torch.Tensor | None = None,
        priority: int = BULK_PRIORITY,
    ) -> str:
        """Queues one window of 16 kHz audio (at most the model's window); returns the request id.
        ``features``: the window's features, computed by the caller ([n_mels, frames] on the model's device);
        the runner then skips its own feature extraction. ``priority``: lower is scheduled sooner
        (``INTERACTIVE_PRIORITY`` for a live turn; the scheduler says what it changes)."""
        options = options or DecodeOptions()
        self.runner.check(options)
        window = self.runner.window_samples
        if len(audio) > window:
            raise OASRError(f"audio of {len(audio)} samples exceeds the model's window ({window}); split it first")
        if request_id is not None and self._in_flight is not None and any(
                row.request_id == request_id for row in self._in_flight[0].encode):
            # Aborted while its step runs: that step's result must not land on a new request of the same id.
            raise ValueError(f"request id {request_id!r} is still in use by a running step")
        prompt_len = self.runner.prompt_len_for(options, len(audio))
        # The last output token comes from the logits at the last position and is never fed back.
        room = self.runner.max_positions - prompt_len + 1
        max_new = room if options.max_new_tokens is None else min(options.max_new_tokens, room)
        if max_new < 1 or options.min_new_tokens > max_new:
            raise OASRError(f"max_new_tokens {options.max_new_tokens} / min_new_tokens {options.min_new_tokens} "
                            f"do not fit the decoder's {room} free positions")
        request = Request(
            request_id=request_id if request_id is not None else f"req-{next(self._ids)}",
            audio=audio,
            options=options,
            features=features,
            prompt_len=prompt_len,
            num_frames=self.runner.num_frames(len(audio)),
            num_cross_positions=self.runner.cross_positions(len(audio)),
            max_new_tokens=max_new,
            priority=priority,
        )
        self.scheduler.add(request)
        return request.request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        return self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work or self._in_flight is not None

    def step(self) -> list[RequestOutput]:
        """Schedules and runs one step; returns the outputs of the requests that changed.

        Where the runner overlaps steps, the step's result is read only after the next step is queued on the
        device, so the outputs a call returns are those of the step before it (and a last call, with nothing
        new to schedule, reads the last step's).
        """
        out = self.scheduler.schedule()
        if not out.is_empty:
            self.encode_batch_sizes.observe(len(out.encode))
            self.decode_batch_sizes.observe(sum(len(row.slots) for row in out.decode))  # a beam request has K rows
        if not self.runner.overlaps_steps:
            return [] if out.is_empty else self.scheduler.update(out, self.runner.execute(out, self.scheduler.requests))
        launched = None if out.is_empty else (out, self.runner.launch(out, self.scheduler.requests))
        previous, self._in_flight = self._in_flight, launched
        return [] if previous is None else self.scheduler.update(previous[0], previous[1].wait())

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running) + (len(self._in_flight[0].encode) if self._in_flight else 0),
            kv_blocks_used=self.pool.num_used if self.pool else 0,
            kv_blocks_total=self.pool.num_blocks - 1 if self.pool else 0,
            num_slots=self.runner.num_slots,
            encode_batch_sizes=self.encode_batch_sizes.snapshot(),
            decode_batch_sizes=self.decode_batch_sizes.snapshot(),
        )

    def run(self, items: Iterable[tuple[str, np.ndarray, DecodeOptions]]) -> Iterator[RequestOutput]:
        """Feeds ``(request_id, audio, options)`` as room appears; yields each finished output as it completes.

        Models whose encoder sees only the real frames (not a fixed window) pay for padding to a batch's longest
        row, so for them ``run`` reads a few batches ahead and submits the longest first: each encode batch then
        holds similar lengths. Outputs are matched by request id, so the order they finish in does not matter.
        """
        pending = iter(items)
        rows = self.config.scheduler.max_encode_rows
        by_length = not self.runner.pads_to_window
        ahead: list[tuple[str, np.ndarray, DecodeOptions]] = []
        exhausted = False
        while True:
            read = len(ahead)
            while not exhausted and len(ahead) < (_LENGTH_LOOKAHEAD_BATCHES * rows if by_length else rows):
                item = next(pending, None)
                if item is None:
                    exhausted = True
                else:
                    ahead.append(item)
            if by_length and len(ahead) > read:  # sorted already unless new items came in
                ahead.sort(key=lambda item: len(item[1]))
            # Two batches' worth waiting: the next one can be staged while the current one runs.
            while ahead and len(self.scheduler.waiting) < 2 * rows:
                request_id, audio, options = ahead.pop() if by_length else ahead.pop(0)
                self.add_request(audio, options, request_id=request_id)
            if not self.has_unfinished():
                return
            for output in self.step():
                if output.finished:
                    yield output
