"""Model runner for attention encoder-decoders (Whisper): turns scheduler decisions into tensors.

Decode state lives in per-slot device buffers (last token, position, block table, minimum-length bound, the
timestamp rules' history, temperature), so a decode step over slots ``[0, bucket)`` needs no host input. Each
step is captured once per (batch bucket, block-count bucket, timestamps in use, sampling in use) in a CUDA
graph; ``num_decode_steps`` replays run back to back and their tokens and log-probabilities are read on the
host once per tick.

Prompts differ in length between requests (a previous-text prompt, ``<|notimestamps|>`` or not): the encode
walk runs them right-padded in one pass. A padded position writes K/V either to the null block or to a position
of its own row past its prompt, which the row's decode steps overwrite before ever attending to it.

Beam search (``oasr.engine.aed_beams``): a request of beam size K holds K slots. Its prompt runs once, in its
first slot; the first beam step copies the prompt's K/V to the other slots, and every later step copies each
beam's K/V, token history and timestamp state from the row it extends. A tick with beam rows runs its steps
eagerly (the selection and the copies depend on which requests search, so they are not captured); ticks of
greedy and sampling rows alone keep their CUDA graphs, and a beam tick gives greedy rows the same tokens.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping, Sequence

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.aed_greedy import AEDGreedyOptions, AEDRowState
from oasr.decode.timestamp_rules import TimestampState, TimestampTokens
from oasr.engine.aed_beams import BeamRows, BeamTick
from oasr.engine.config import EngineConfig
from oasr.engine.kv_cache import KVShape, PagedKVPool, paged_context
from oasr.engine.memory import MemoryPlan, plan_memory
from oasr.engine.request import Request
from oasr.engine.scheduler import (
    BeamResult,
    DecodeRow,
    EncodeResult,
    EncodeRow,
    RunnerOutput,
    SchedulerOutput,
)
from oasr.engine.staging import stager_for
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import LoadedModel
from oasr.models.whisper.prompt import WhisperPrompt, WhisperPrompter
from oasr.types import DecodeOptions

log = logging.getLogger(__name__)


def _as_words(t: torch.Tensor) -> torch.Tensor:
    """[L, N, ...] contiguous -> [L, N, words]: the same bytes as the widest integers that tile each [L, n] row."""
    flat = t.flatten(2)
    for dtype in (torch.int64, torch.int32):
        if flat.shape[-1] * t.element_size() % dtype.itemsize == 0:
            return flat.view(dtype)
    return flat


def _bucket(value: int, buckets: tuple[int, ...]) -> int:
    index = bisect.bisect_left(buckets, value)
    return buckets[index] if index < len(buckets) else value


class AEDRunner:
    incremental = True
    overlaps_steps = False  # each step's tokens feed the next: a step reads its result before it returns
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
                timestamp_tokens=TimestampTokens(
                    eot=self.special.eot,
                    no_timestamps=self.special.no_timestamps,
                    timestamp_begin=self.special.timestamp_begin,
                ),
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
        # [layers, slot, encoder position, d_model]: each row's K/V as the projection writes it (heads interleaved),
        # so an encode batch in consecutive slots is projected straight into place; ``split_cross`` views it per head.
        cross = (shape.num_layers, slots, shape.cross_len, c.d_model)
        self.cross_k = torch.zeros(cross, dtype=self.dtype, device=self.device)
        self.cross_v = torch.zeros_like(self.cross_k)
        self.max_blocks = -(-self.max_positions // block_size)
        long = dict(dtype=torch.long, device=self.device)
        self.tokens = torch.zeros(slots, **long)
        self.positions = torch.zeros(slots, **long)
        self.eot_from = torch.zeros(slots, **long)
        self.block_table = torch.zeros(slots, self.max_blocks, **long)
        # The timestamp rules' view of each row's history (see ``TimestampState``), and its sampling temperature.
        self.previous = torch.zeros(slots, **long)
        self.last_timestamp = torch.zeros(slots, **long)
        self.timestamps = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.temperature = torch.zeros(slots, dtype=torch.float32, device=self.device)
        self._table_len = [0] * slots  # blocks of each slot's table already on the device
        # Host copies of each slot's flags: a tick skips the timestamp rules or the sampling when no row needs them.
        self._slot_timestamps = [False] * slots
        self._slot_sampling = [False] * slots
        self.batch_buckets = tuple(b for b in config.runner.batch_buckets if b < slots) + (slots,)
        self.block_buckets = tuple(sorted({min(2**i, self.max_blocks) for i in range(self.max_blocks.bit_length() + 1)}))
        self.use_graphs = config.runner.cuda_graphs and self.device.type == "cuda"
        self._graphs: dict[tuple[int, int, bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        max_steps = max(config.scheduler.decode_steps_per_tick, config.scheduler.combined_decode_steps)
        self._step_tokens = torch.zeros(max_steps, slots, **long)
        self._step_logprobs = torch.zeros(max_steps, slots, dtype=torch.float32, device=self.device)
        beam_strategy = getattr(arch, "beam_decode_strategy", None)
        self.beams = BeamRows(DECODE_STRATEGIES.get(beam_strategy)(self.special.eot) if beam_strategy else None,
                              slots, self.max_positions, max_steps, self.device)
        # While a step runs on the device, waiting requests' audio is copied into pinned memory (CUDA only).
        self.stager = stager_for(self.device, 2 * config.scheduler.max_encode_rows)
        self._compiled_encoder = config.runner.compile_encoder and self.device.type == "cuda"
        self._encoder = torch.compile(self.model.encode) if self._compiled_encoder else self.model.encode
        # Wall seconds per walk; each walk ends in a host read, so no extra synchronisation is needed.
        self.phase_seconds = {"encode": 0.0, "decode": 0.0}

    @property
    def num_slots(self) -> int:
        return self.plan.num_slots

    def prompt_len_for(self, options: DecodeOptions) -> int:
        return self.prompter.prompt_len(options)

    @property
    def window_samples(self) -> int:
        return self.loaded.features.config.n_samples

    def num_frames(self, num_samples: int) -> int:
        return self.loaded.features.config.n_frames  # every window is padded to the full 30 s

    def check(self, options: DecodeOptions) -> None:
        self.prompter.check(options)
        if options.beam_size is not None and self.beams.strategy is None:
            raise UnsupportedOptionError(f"{self.loaded.name} ({self.loaded.architecture}) has no beam search")
        rows = options.num_decode_rows
        if rows > self.num_slots:
            raise UnsupportedOptionError(f"beam_size {rows} needs {rows} decode rows; this engine has {self.num_slots} "
                                         "(raise max_num_seqs, or the batch size)")
        blocks = rows * -(-self.max_positions // self.pool.block_size)
        if blocks > self.pool.num_blocks - 1:
            raise UnsupportedOptionError(f"beam_size {rows} needs up to {blocks} KV blocks; the pool has "
                                         f"{self.pool.num_blocks - 1} (raise the cache memory budget)")

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput:
        for slot in out.released_slots:
            self._table_len[slot] = 0
        if out.released_slots:
            released = torch.tensor(out.released_slots, device=self.device)
            self.block_table.index_fill_(0, released, 0)
            self.positions.index_fill_(0, released, 0)
            self.beams.release(out.released_slots)
        if self.stager:  # runs beside this step's device work
            self.stager.stage(requests)
        decoded, logprobs, encoded, beams = {}, {}, {}, {}
        if out.decode:
            start = time.perf_counter()
            decoded, logprobs, beams = self._decode(out.decode, out.num_decode_steps)
            self.phase_seconds["decode"] += time.perf_counter() - start
        if out.encode:
            start = time.perf_counter()
            encoded, first_beams = self._encode(out.encode, requests)
            beams.update(first_beams)
            self.phase_seconds["encode"] += time.perf_counter() - start
        return RunnerOutput(encoded=encoded, decoded=decoded, logprobs=logprobs, beams=beams)

    # ------------------------------------------------------------------ decode walk

    def _sync_block_tables(self, rows: tuple[DecodeRow, ...]) -> None:
        stale = [(slot, blocks) for row in rows for slot, blocks in zip(row.slots, row.block_ids, strict=True)
                 if len(blocks) != self._table_len[slot]]
        if stale:
            self._write_block_tables(stale)

    def _write_block_tables(self, tables: list[tuple[int, tuple[int, ...]]]) -> None:
        """Copies each (slot, block ids) pair's table to the device in one transfer."""
        table = torch.zeros(len(tables), self.max_blocks, dtype=torch.long)
        for i, (slot, blocks) in enumerate(tables):
            table[i, : len(blocks)] = torch.tensor(blocks)
            self._table_len[slot] = len(blocks)
        slots = torch.tensor([slot for slot, _ in tables], device=self.device)
        self.block_table.index_copy_(0, slots, table.to(self.device))

    def _decode(
        self, rows: tuple[DecodeRow, ...], steps: int
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[float, ...]], dict[str, BeamResult]]:
        self._sync_block_tables(rows)
        batch = _bucket(max(max(row.slots) for row in rows) + 1, self.batch_buckets)
        num_blocks = _bucket(max(len(row.block_ids[0]) for row in rows), self.block_buckets)
        timestamps = any(self._slot_timestamps[row.slots[0]] for row in rows)
        sampling = any(self._slot_sampling[row.slots[0]] for row in rows)
        searching = [row for row in rows if row.request_id in self.beams.groups]
        tick = self.beams.tick([self.beams.groups[row.request_id] for row in searching],
                               max((len(row.block_ids[0]) for row in searching), default=0))
        for i in range(steps):
            if tick is None:
                tokens, logprobs = self._step(batch, num_blocks, timestamps, sampling)
            else:
                tokens, logprobs = self._step_eager(batch, num_blocks, timestamps, sampling, beams=(tick, i))
            self._step_tokens[i, :batch].copy_(tokens)
            self._step_logprobs[i, :batch].copy_(logprobs)
        # One transfer for both (token ids are exact in float64).
        host = torch.stack(
            (self._step_tokens[:steps, :batch].double(), self._step_logprobs[:steps, :batch].double())
        ).cpu()
        tokens, logprobs = host[0].long(), host[1]
        greedy = [row for row in rows if row.request_id not in self.beams.groups]
        return (
            {row.request_id: tuple(tokens[:, row.slots[0]].tolist()) for row in greedy},
            {row.request_id: tuple(logprobs[:, row.slots[0]].tolist()) for row in greedy},
            self.beams.collect(tick, steps) if tick is not None else {},
        )

    def _step(self, batch: int, num_blocks: int, timestamps: bool, sampling: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.use_graphs:
            return self._step_eager(batch, num_blocks, timestamps, sampling)
        key = (batch, num_blocks, timestamps, sampling)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        graph, next_tokens, logprobs = self._graphs[key]
        graph.replay()
        return next_tokens, logprobs

    def _step_eager(
        self, batch: int, num_blocks: int, timestamps: bool, sampling: bool,
        beams: tuple[BeamTick, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for every slot in [0, batch). Idle slots read and write the null block; their tokens are
        never read. Only device buffers are touched, so this can be captured (without ``beams``).
        ``beams``: (the tick's searches, this step's index in the tick): beam rows then take the searches'
        choices instead of their argmax, and the state of the rows their new beams extend."""
        positions = self.positions[:batch]
        # The paged kernel serves greedy steps only. Beam ticks (and prompts) attend through the torch path: with
        # the kernel, one beam search on CUDA gave different tokens from run to run, for a reason not yet found.
        context = paged_context(self.pool, self.block_table[:batch, :num_blocks], positions[:, None],
                                decode_kernel=beams is None)
        logits = self.model.decode(
            self.tokens[:batch, None], positions[:, None], context,
            self.model.split_cross(self.cross_k[:, :batch]), self.model.split_cross(self.cross_v[:, :batch]),
        )[:, -1]
        rows = AEDRowState(
            eot_allowed=positions >= self.eot_from[:batch],
            temperature=self.temperature[:batch],
            timestamps=TimestampState(
                enabled=self.timestamps[:batch],
                last=self.tokens[:batch],
                previous=self.previous[:batch],
                last_timestamp=self.last_timestamp[:batch],
            ) if timestamps else None,
        )
        filtered = self.strategy.filter(logits, rows, first=False)
        next_tokens, logprobs = self.strategy.choose(filtered, rows, sampling=sampling)
        if beams is None:
            self._advance(batch, next_tokens)
            return next_tokens, logprobs
        tick, step = beams
        source = torch.arange(batch, device=self.device)
        beam_sources, beam_targets = self.beams.advance(tick, step, filtered, positions, next_tokens, source)
        self._copy_kv(beam_sources, beam_targets, tick.num_blocks)
        self._advance(batch, next_tokens, source)
        return next_tokens, logprobs

    def _advance(self, batch: int, next_tokens: torch.Tensor, source: torch.Tensor | None = None) -> None:
        """Appends ``next_tokens`` [B] to rows [0, batch). ``source`` [B]: the row whose history each row now
        continues (a beam may extend another row's beam); None: each its own."""
        last, last_timestamp = self.tokens[:batch], self.last_timestamp[:batch]
        if source is not None:
            last, last_timestamp = last[source], last_timestamp[source]
        is_timestamp = next_tokens >= self.special.timestamp_begin
        self.last_timestamp[:batch].copy_(torch.where(is_timestamp, next_tokens, last_timestamp))
        self.previous[:batch].copy_(last)
        self.tokens[:batch].copy_(next_tokens)
        self.positions[:batch].copy_(torch.clamp(self.positions[:batch] + 1, max=self.max_positions - 1))

    def _copy_kv(self, sources: torch.Tensor, targets: torch.Tensor, num_blocks: int) -> None:
        """Self-attention K/V of slots ``sources`` [N] into slots ``targets`` [N], first ``num_blocks`` blocks."""
        self.pool.copy_blocks(self.block_table[sources, :num_blocks], self.block_table[targets, :num_blocks])

    def _capture(
        self, batch: int, num_blocks: int, timestamps: bool, sampling: bool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        state = (self.tokens, self.positions, self.previous, self.last_timestamp)
        saved = [t.clone() for t in state]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up: lazy initialisation must not happen during capture
            self._step_eager(batch, num_blocks, timestamps, sampling)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            next_tokens, logprobs = self._step_eager(batch, num_blocks, timestamps, sampling)
        # Warm-up and capture advanced the state; put it back (the null block absorbed their writes only for
        # idle rows, and live rows rewrite the same positions when the graph replays).
        for buffer, value in zip(state, saved, strict=True):
            buffer.copy_(value)
        log.debug("captured decode step: batch %d, %d blocks, timestamps %s, sampling %s",
                  batch, num_blocks, timestamps, sampling)
        return graph, next_tokens, logprobs

    # ------------------------------------------------------------------ encode walk

    def _encode(
        self, rows: tuple[EncodeRow, ...], requests: Mapping[str, Request]
    ) -> tuple[dict[str, EncodeResult], dict[str, BeamResult]]:
        batch = [requests[row.request_id] for row in rows]
        features = self._features(batch)
        if self._compiled_encoder:
            torch._dynamo.mark_dynamic(features, 0)  # any number of rows, one compiled graph
        cross_k, cross_v = self._project_cross(rows, self._encoder(features))
        self._write_block_tables([(slot, blocks) for row in rows
                                  for slot, blocks in zip(row.slots, row.block_ids, strict=True)])
        slots = torch.tensor([row.slots[0] for row in rows], device=self.device)

        languages = self._pick_languages(batch, slots, cross_k, cross_v)
        prompts = [self.prompter.prompt(lang, r.options) for lang, r in zip(languages, batch, strict=True)]
        last_logits, no_speech = self._run_prompts(prompts, slots, cross_k, cross_v)
        first, logprobs, tick = self._first_tokens(rows, batch, prompts, last_logits)
        host = torch.stack((first.double(), logprobs.double(), no_speech.double())).cpu().tolist()
        encoded = {
            row.request_id: EncodeResult(token_ids=() if r.is_beam else (int(token),), language=lang,
                                         logprobs=() if r.is_beam else (lp,), no_speech_prob=ns)
            for row, r, lang, token, lp, ns in zip(rows, batch, languages, *host, strict=True)
        }
        return encoded, self.beams.collect(tick, 1) if tick is not None else {}

    def _project_cross(self, rows: tuple[EncodeRow, ...], encoded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's cross-attention K/V into each slot it holds; returns the batch's K/V as the decoder reads
        them ([layers, B, H, S, D] views). Rows of one slot each in consecutive slots (every batch of a fresh
        engine, and most in steady state: slots are handed out lowest first) are projected straight into the
        slots; others through a scratch buffer and one copy."""
        first = [row.slots[0] for row in rows]
        if all(len(row.slots) == 1 for row in rows) and first == list(range(first[0], first[0] + len(rows))):
            span = slice(first[0], first[0] + len(rows))
            k, v = self.cross_k[:, span], self.cross_v[:, span]
            self.model.cross_kv_into(encoded, k, v)
        else:
            k = torch.empty((self.cross_k.shape[0], len(rows), *self.cross_k.shape[2:]), dtype=self.dtype,
                            device=self.device)
            v = torch.empty_like(k)
            self.model.cross_kv_into(encoded, k, v)
            self._store_cross(rows, k, v)
        return self.model.split_cross(k), self.model.split_cross(v)

    def _store_cross(self, rows: tuple[EncodeRow, ...], cross_k: torch.Tensor, cross_v: torch.Tensor) -> None:
        """Each row's cross-attention K/V ([layers, B, S, d_model]) into every slot it holds: a request's beams
        all attend to the same audio. Copied as 8-byte words: an index copy runs per element."""
        for beam in range(max(len(row.slots) for row in rows)):
            have = [i for i, row in enumerate(rows) if len(row.slots) > beam]
            slots = torch.tensor([rows[i].slots[beam] for i in have], device=self.device)
            k, v = cross_k, cross_v
            if len(have) < len(rows):
                index = torch.tensor(have, device=self.device)
                k, v = k.index_select(1, index), v.index_select(1, index)
            _as_words(self.cross_k).index_copy_(1, slots, _as_words(k))
            _as_words(self.cross_v).index_copy_(1, slots, _as_words(v))

    def _first_tokens(
        self, rows: tuple[EncodeRow, ...], batch: list[Request], prompts: list[WhisperPrompt], logits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, BeamTick | None]:
        """Chooses each row's first token from the logits after its prompt and sets up its slots for decoding;
        starts the beam searches among them. -> (tokens [B], their log-probabilities [B], the searches)."""
        device = self.device
        options = [r.options for r in batch]
        prompt_lens = torch.tensor([len(p.token_ids) for p in prompts], device=device)
        eot_from = prompt_lens - 1 + torch.tensor([o.min_new_tokens for o in options], device=device)
        timestamps = torch.tensor([o.timestamps for o in options], device=device)
        temperature = torch.tensor([o.temperature for o in options], dtype=torch.float32, device=device)
        nothing = torch.zeros(len(rows), dtype=torch.long, device=device)  # no history: nothing sampled yet
        state = AEDRowState(
            eot_allowed=eot_from <= prompt_lens - 1,
            temperature=temperature,
            timestamps=TimestampState(timestamps, nothing, nothing, nothing)
            if any(o.timestamps for o in options) else None,
        )
        filtered = self.strategy.filter(logits, state, first=True)
        first, logprobs = self.strategy.choose(filtered, state, sampling=any(o.temperature > 0 for o in options))
        # Every slot of a row starts from the row's prompt; beam rows then take their search's first tokens.
        owner = torch.tensor([i for i, row in enumerate(rows) for _ in row.slots], device=device)
        slots = torch.tensor([slot for row in rows for slot in row.slots], device=device)
        tb = self.special.timestamp_begin
        self.tokens.index_copy_(0, slots, first[owner])
        self.positions.index_copy_(0, slots, prompt_lens[owner])
        self.eot_from.index_copy_(0, slots, eot_from[owner])
        self.previous.index_fill_(0, slots, tb)  # fewer than two tokens sampled: the rules count it a timestamp
        self.last_timestamp.index_copy_(0, slots, torch.where(first >= tb, first, nothing)[owner])
        self.timestamps.index_copy_(0, slots, timestamps[owner])
        self.temperature.index_copy_(0, slots, temperature[owner])
        for row, o in zip(rows, options, strict=True):
            for slot in row.slots:
                self._slot_timestamps[slot] = o.timestamps
                self._slot_sampling[slot] = o.temperature > 0
        return first, logprobs, self._start_beams(rows, batch, prompts, filtered)

    def _start_beams(self, rows: tuple[EncodeRow, ...], batch: list[Request], prompts: list[WhisperPrompt],
                     filtered: torch.Tensor) -> BeamTick | None:
        """The first step of every beam search among ``rows``: K beams out of the prompt's filtered logits
        ([B, vocab]); the prompt's K/V, in each request's first slot, is copied to its other slots."""
        searching = {row.request_id: i for i, (row, r) in enumerate(zip(rows, batch, strict=True)) if r.is_beam}
        if not searching:
            return None
        groups = [self.beams.open(rows[i].request_id, rows[i].slots, len(prompts[i].token_ids),
                                  batch[i].max_new_tokens, batch[i].options) for i in searching.values()]
        tick = self.beams.tick(groups, max(len(rows[i].block_ids[0]) for i in searching.values()))
        order = torch.tensor([searching[g.request_id] for g in tick.groups], device=self.device)
        prompt_lens = torch.tensor([g.prompt_len for g in tick.groups], device=self.device)
        sources, targets, tokens = self.beams.first_step(tick, torch.log_softmax(filtered[order], dim=-1), prompt_lens)
        tb = self.special.timestamp_begin
        self.tokens.index_copy_(0, targets, tokens)
        self.last_timestamp.index_copy_(0, targets, torch.where(tokens >= tb, tokens, torch.zeros_like(tokens)))
        self._copy_kv(sources, targets, tick.num_blocks)
        return tick

    def _features(self, batch: list[Request]) -> torch.Tensor:
        """[B, n_mels, frames]: the caller's features where a request brings them, the extractor's elsewhere."""
        missing = [i for i, r in enumerate(batch) if r.features is None]
        audio = [self.stager.take(batch[i]) if self.stager else batch[i].audio for i in missing]
        computed = self.loaded.features(audio, device=self.device) if missing else None
        if len(missing) == len(batch):
            return computed
        rows = [r.features for r in batch]
        for j, i in enumerate(missing):
            rows[i] = computed[j]
        return torch.stack([f.to(device=self.device, dtype=torch.float32) for f in rows])

    def _run_prompts(
        self, prompts: list[WhisperPrompt], slots: torch.Tensor,
        cross_k: Sequence[torch.Tensor], cross_v: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs every row's prompt from position 0 (right-padded to the longest) into its cache.
        -> (logits after each row's last prompt token [B, vocab], probability of <|nospeech|> after
        <|startoftranscript|> [B])."""
        lengths = [len(p.token_ids) for p in prompts]
        longest = max(lengths)
        tokens = torch.full((len(prompts), longest), self.special.eot, dtype=torch.long)
        for i, p in enumerate(prompts):
            tokens[i, : lengths[i]] = torch.tensor(p.token_ids)
        tokens = tokens.to(self.device)
        positions = torch.arange(longest, device=self.device).expand(len(prompts), -1)
        table = self.block_table[slots, : -(-longest // self.pool.block_size)]
        context = paged_context(self.pool, table, positions)
        hidden = self.model.decode_hidden(tokens, positions, context, cross_k, cross_v)
        rows = torch.arange(len(prompts), device=self.device)
        last = torch.tensor(lengths, device=self.device) - 1
        sot = torch.tensor([p.sot_index for p in prompts], device=self.device)
        logits = self.model.logits(torch.stack((hidden[rows, last], hidden[rows, sot]), dim=1))
        no_speech = torch.softmax(logits[:, 1], dim=-1)[:, self.special.no_speech]
        return logits[:, 0], no_speech

    def _pick_languages(
        self, batch: list[Request], slots: torch.Tensor, cross_k: Sequence[torch.Tensor], cross_v: Sequence[torch.Tensor]
    ) -> list[str | None]:
        """Languages of the rows. Rows without a language on a multilingual model get the most likely language
        token after ``<|startoftranscript|>`` alone (openai-whisper's ``detect_language``): one extra decoder
        pass at position 0 for the whole batch, skipped when no row needs it. The prompt pass then rewrites
        position 0."""
        multilingual = self.prompter.config.is_multilingual
        languages = [r.options.language if multilingual else "en" for r in batch]
        detect = [i for i, r in enumerate(batch) if self.prompter.needs_detection(r.options)]
        if not detect:
            return languages
        start = torch.full((len(batch), 1), self.special.sot, device=self.device)
        positions = torch.zeros_like(start)
        table = self.block_table[slots, :1]
        logits = self.model.decode(start, positions, paged_context(self.pool, table, positions), cross_k, cross_v)
        candidates = torch.tensor(self.prompter.language_token_ids, device=self.device)
        best = logits[detect, -1][:, candidates].argmax(dim=-1).tolist()
        for i, choice in zip(detect, best, strict=True):
            languages[i] = self.prompter.language_names[choice]
        return languages
