"""Model runner for attention encoder-decoders (Whisper): turns scheduler decisions into tensors.

Decode state lives in per-slot device buffers (last token, position, block table, minimum-length bound), so a
decode step over slots ``[0, bucket)`` needs no host input. Each step is captured once per (batch bucket,
block-count bucket) in a CUDA graph; ``num_decode_steps`` replays run back to back and their tokens are read
on the host once per tick.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.aed_greedy import AEDGreedyOptions
from oasr.engine.config import EngineConfig
from oasr.engine.kv_cache import KVShape, PagedKVPool, paged_context
from oasr.engine.memory import MemoryPlan, plan_memory
from oasr.engine.request import Request
from oasr.engine.scheduler import DecodeRow, EncodeResult, EncodeRow, RunnerOutput, SchedulerOutput
from oasr.models.loader import LoadedModel
from oasr.models.whisper.prompt import WhisperPrompter
from oasr.types import DecodeOptions

log = logging.getLogger(__name__)


def _bucket(value: int, buckets: tuple[int, ...]) -> int:
    index = bisect.bisect_left(buckets, value)
    return buckets[index] if index < len(buckets) else value


class AEDRunner:
    incremental = True
    pads_to_window = True  # every request is encoded as a full 30 s window

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.dtype = loaded.dtype
        c = loaded.config
        self.prompter = WhisperPrompter(c, loaded.tokenizer, loaded.name)
        self.special = loaded.tokenizer.special
        self.max_positions = c.max_target_positions
        arch = type(self.model)
        self.strategy = DECODE_STRATEGIES.get(arch.default_decode_strategy)(
            AEDGreedyOptions(
                eot=self.special.eot,
                vocab_size=c.vocab_size,
                suppress_tokens=c.suppress_tokens,
                begin_suppress_tokens=c.begin_suppress_tokens,
            ),
            self.device,
        )
        heads = c.decoder_attention_heads
        shape = KVShape(c.decoder_layers, heads, c.d_model // heads, cross_len=c.max_source_positions)
        self.plan: MemoryPlan = plan_memory(
            shape, config.cache, max_num_seqs=config.scheduler.max_num_seqs, max_positions=self.max_positions,
            dtype=self.dtype, device=self.device,
        )
        block_size = config.cache.block_size
        self.pool = PagedKVPool(shape, self.plan.num_blocks, block_size, self.dtype, self.device)
        slots = self.plan.num_slots
        cross = (shape.num_layers, slots, heads, shape.cross_len, shape.head_dim)
        self.cross_k = torch.zeros(cross, dtype=self.dtype, device=self.device)
        self.cross_v = torch.zeros_like(self.cross_k)
        self.max_blocks = -(-self.max_positions // block_size)
        long = dict(dtype=torch.long, device=self.device)
        self.tokens = torch.zeros(slots, **long)
        self.positions = torch.zeros(slots, **long)
        self.eot_from = torch.zeros(slots, **long)
        self.block_table = torch.zeros(slots, self.max_blocks, **long)
        self._table_len = [0] * slots  # blocks of each slot's table already on the device
        self.batch_buckets = tuple(b for b in config.runner.batch_buckets if b < slots) + (slots,)
        self.block_buckets = tuple(sorted({min(2**i, self.max_blocks) for i in range(self.max_blocks.bit_length() + 1)}))
        self.use_graphs = config.runner.cuda_graphs and self.device.type == "cuda"
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        max_steps = max(config.scheduler.decode_steps_per_tick, config.scheduler.combined_decode_steps)
        self._step_tokens = torch.zeros(max_steps, slots, **long)
        self._encoder = self.model.encode
        if config.runner.compile_encoder and self.device.type == "cuda":
            self._encoder = torch.compile(self.model.encode)
        # Wall seconds per walk; each walk ends in a host read, so no extra synchronisation is needed.
        self.phase_seconds = {"encode": 0.0, "decode": 0.0}

    @property
    def num_slots(self) -> int:
        return self.plan.num_slots

    @property
    def prompt_len(self) -> int:
        return self.prompter.prompt_len

    @property
    def window_samples(self) -> int:
        return self.loaded.features.config.n_samples

    def num_frames(self, num_samples: int) -> int:
        return self.loaded.features.config.n_frames  # every window is padded to the full 30 s

    def check(self, options: DecodeOptions) -> None:
        self.prompter.check(options)

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput:
        for slot in out.released_slots:
            self._table_len[slot] = 0
        if out.released_slots:
            released = torch.tensor(out.released_slots, device=self.device)
            self.block_table.index_fill_(0, released, 0)
            self.positions.index_fill_(0, released, 0)
        decoded, encoded = {}, {}
        if out.decode:
            start = time.perf_counter()
            decoded = self._decode(out.decode, out.num_decode_steps)
            self.phase_seconds["decode"] += time.perf_counter() - start
        if out.encode:
            start = time.perf_counter()
            encoded = self._encode(out.encode, requests)
            self.phase_seconds["encode"] += time.perf_counter() - start
        return RunnerOutput(encoded=encoded, decoded=decoded)

    # ------------------------------------------------------------------ decode walk

    def _sync_block_tables(self, rows: tuple[DecodeRow, ...]) -> None:
        stale = [row for row in rows if len(row.block_ids) != self._table_len[row.slot]]
        if not stale:
            return
        table = torch.zeros(len(stale), self.max_blocks, dtype=torch.long)
        for i, row in enumerate(stale):
            table[i, : len(row.block_ids)] = torch.tensor(row.block_ids)
            self._table_len[row.slot] = len(row.block_ids)
        slots = torch.tensor([row.slot for row in stale], device=self.device)
        self.block_table.index_copy_(0, slots, table.to(self.device))

    def _decode(self, rows: tuple[DecodeRow, ...], steps: int) -> dict[str, tuple[int, ...]]:
        self._sync_block_tables(rows)
        batch = _bucket(max(row.slot for row in rows) + 1, self.batch_buckets)
        num_blocks = _bucket(max(len(row.block_ids) for row in rows), self.block_buckets)
        for i in range(steps):
            self._step_tokens[i, :batch].copy_(self._step(batch, num_blocks))
        host = self._step_tokens[:steps, :batch].cpu()
        return {row.request_id: tuple(host[:, row.slot].tolist()) for row in rows}

    def _step(self, batch: int, num_blocks: int) -> torch.Tensor:
        if not self.use_graphs:
            return self._step_eager(batch, num_blocks)
        key = (batch, num_blocks)
        if key not in self._graphs:
            self._graphs[key] = self._capture(batch, num_blocks)
        graph, next_tokens = self._graphs[key]
        graph.replay()
        return next_tokens

    def _step_eager(self, batch: int, num_blocks: int) -> torch.Tensor:
        """One token for every slot in [0, batch). Idle slots read and write the null block; their tokens are
        never read. Only device buffers are touched, so this can be captured."""
        positions = self.positions[:batch]
        context = paged_context(self.pool, self.block_table[:batch, :num_blocks], positions[:, None])
        logits = self.model.decode(
            self.tokens[:batch, None], positions[:, None], context, self.cross_k[:, :batch], self.cross_v[:, :batch]
        )[:, -1]
        next_tokens = self.strategy.select(logits, first=False, eot_allowed=positions >= self.eot_from[:batch])
        self.tokens[:batch].copy_(next_tokens)
        self.positions[:batch].copy_(torch.clamp(positions + 1, max=self.max_positions - 1))
        return next_tokens

    def _capture(self, batch: int, num_blocks: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        saved = (self.tokens.clone(), self.positions.clone())
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up: lazy initialisation must not happen during capture
            self._step_eager(batch, num_blocks)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            next_tokens = self._step_eager(batch, num_blocks)
        # Warm-up and capture advanced the state; put it back (the null block absorbed their writes only for
        # idle rows, and live rows rewrite the same positions when the graph replays).
        self.tokens.copy_(saved[0])
        self.positions.copy_(saved[1])
        log.debug("captured decode step: batch %d, %d blocks", batch, num_blocks)
        return graph, next_tokens

    # ------------------------------------------------------------------ encode walk

    def _encode(self, rows: tuple[EncodeRow, ...], requests: Mapping[str, Request]) -> dict[str, EncodeResult]:
        batch = [requests[row.request_id] for row in rows]
        features = self.loaded.features([r.audio for r in batch], device=self.device)
        if self._encoder is not self.model.encode:
            torch._dynamo.mark_dynamic(features, 0)  # any number of rows, one compiled graph
        cross_k, cross_v = self.model.cross_kv(self._encoder(features))
        slots = torch.tensor([row.slot for row in rows], device=self.device)
        self.cross_k.index_copy_(1, slots, cross_k)
        self.cross_v.index_copy_(1, slots, cross_v)
        table = torch.zeros(len(rows), self.max_blocks, dtype=torch.long)
        for i, row in enumerate(rows):
            table[i, : len(row.block_ids)] = torch.tensor(row.block_ids)
            self._table_len[row.slot] = len(row.block_ids)
        self.block_table.index_copy_(0, slots, table.to(self.device))
        table = self.block_table[slots, : -(-self.prompt_len // self.pool.block_size)]

        languages, first_position = self._pick_languages(batch, table, cross_k, cross_v)
        prompts = [self.prompter.prompt(lang, r.options.task) for lang, r in zip(languages, batch, strict=True)]
        tokens = torch.tensor([p[first_position:] for p in prompts], device=self.device)
        positions = torch.arange(first_position, self.prompt_len, device=self.device).expand(len(rows), -1)
        context = paged_context(self.pool, table, positions)
        logits = self.model.decode(tokens, positions, context, cross_k, cross_v)[:, -1]
        eot_from = torch.tensor([self.prompt_len - 1 + r.options.min_new_tokens for r in batch], device=self.device)
        first = self.strategy.select(logits, first=True, eot_allowed=eot_from <= self.prompt_len - 1)
        self.tokens.index_copy_(0, slots, first)
        self.positions.index_fill_(0, slots, self.prompt_len)
        self.eot_from.index_copy_(0, slots, eot_from)
        return {
            row.request_id: EncodeResult(token_ids=(token,), language=lang)
            for row, token, lang in zip(rows, first.tolist(), languages, strict=True)
        }

    def _pick_languages(
        self, batch: list[Request], table: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor
    ) -> tuple[list[str | None], int]:
        """Languages of the rows, and the first prompt position still to run. Rows without a language on a
        multilingual model get the most likely language token after ``<|startoftranscript|>``; that costs one
        extra decoder pass (position 0) for the whole batch, skipped when no row needs it."""
        multilingual = self.prompter.config.is_multilingual
        languages = [r.options.language if multilingual else "en" for r in batch]
        detect = [i for i, r in enumerate(batch) if self.prompter.needs_detection(r.options)]
        if not detect:
            return languages, 0
        start = torch.full((len(batch), 1), self.special.sot, device=self.device)
        positions = torch.zeros_like(start)
        logits = self.model.decode(start, positions, paged_context(self.pool, table, positions), cross_k, cross_v)
        candidates = torch.tensor(self.prompter.language_token_ids, device=self.device)
        best = logits[detect, -1][:, candidates].argmax(dim=-1).tolist()
        for i, choice in zip(detect, best, strict=True):
            languages[i] = self.prompter.language_names[choice]
        return languages, 1
