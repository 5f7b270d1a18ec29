"""Model runner for attention encoder-decoders (Whisper): turns scheduler decisions into tensors.

Decode state lives in per-slot device buffers (last token, position, block table, minimum-length bound, the
timestamp rules' history, temperature), so a decode step over slots ``[0, bucket)`` needs no host input. Each
step is captured once per (batch bucket, block-count bucket, timestamps in use, sampling in use) in a CUDA
graph; ``num_decode_steps`` replays run back to back and their tokens and log-probabilities are read on the
host once per tick.

Prompts differ in length between requests (a previous-text prompt, ``<|notimestamps|>`` or not): the encode
walk runs them right-padded in one pass. A padded position writes K/V either to the null block or to a position
of its own row past its prompt, which the row's decode steps overwrite before ever attending to it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.aed_greedy import AEDGreedyOptions, AEDRowState
from oasr.decode.timestamp_rules import TimestampState, TimestampTokens
from oasr.engine.config import EngineConfig
from oasr.engine.kv_cache import KVShape, PagedKVPool, paged_context
from oasr.engine.memory import MemoryPlan, plan_memory
from oasr.engine.request import Request
from oasr.engine.scheduler import DecodeRow, EncodeResult, EncodeRow, RunnerOutput, SchedulerOutput
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import LoadedModel
from oasr.models.whisper.prompt import WhisperPrompt, WhisperPrompter
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
        cross = (shape.num_layers, slots, heads, shape.cross_len, shape.head_dim)
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
        if options.beam_size is not None:
            raise UnsupportedOptionError(f"{self.loaded.name}: beam search is not available yet")

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput:
        for slot in out.released_slots:
            self._table_len[slot] = 0
        if out.released_slots:
            released = torch.tensor(out.released_slots, device=self.device)
            self.block_table.index_fill_(0, released, 0)
            self.positions.index_fill_(0, released, 0)
        decoded, logprobs, encoded = {}, {}, {}
        if out.decode:
            start = time.perf_counter()
            decoded, logprobs = self._decode(out.decode, out.num_decode_steps)
            self.phase_seconds["decode"] += time.perf_counter() - start
        if out.encode:
            start = time.perf_counter()
            encoded = self._encode(out.encode, requests)
            self.phase_seconds["encode"] += time.perf_counter() - start
        return RunnerOutput(encoded=encoded, decoded=decoded, logprobs=logprobs)

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
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[float, ...]]]:
        self._sync_block_tables(rows)
        batch = _bucket(max(max(row.slots) for row in rows) + 1, self.batch_buckets)
        num_blocks = _bucket(max(len(row.block_ids[0]) for row in rows), self.block_buckets)
        timestamps = any(self._slot_timestamps[row.slots[0]] for row in rows)
        sampling = any(self._slot_sampling[row.slots[0]] for row in rows)
        for i in range(steps):
            tokens, logprobs = self._step(batch, num_blocks, timestamps, sampling)
            self._step_tokens[i, :batch].copy_(tokens)
            self._step_logprobs[i, :batch].copy_(logprobs)
        # One transfer for both (token ids are exact in float64).
        host = torch.stack(
            (self._step_tokens[:steps, :batch].double(), self._step_logprobs[:steps, :batch].double())
        ).cpu()
        tokens, logprobs = host[0].long(), host[1]
        return (
            {row.request_id: tuple(tokens[:, row.slots[0]].tolist()) for row in rows},
            {row.request_id: tuple(logprobs[:, row.slots[0]].tolist()) for row in rows},
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
        self, batch: int, num_blocks: int, timestamps: bool, sampling: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for every slot in [0, batch). Idle slots read and write the null block; their tokens are
        never read. Only device buffers are touched, so this can be captured."""
        positions = self.positions[:batch]
        context = paged_context(self.pool, self.block_table[:batch, :num_blocks], positions[:, None])
        logits = self.model.decode(
            self.tokens[:batch, None], positions[:, None], context, self.cross_k[:, :batch], self.cross_v[:, :batch]
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
        next_tokens, logprobs = self.strategy.select(logits, rows, first=False, sampling=sampling)
        is_timestamp = next_tokens >= self.special.timestamp_begin
        self.last_timestamp[:batch].copy_(torch.where(is_timestamp, next_tokens, self.last_timestamp[:batch]))
        self.previous[:batch].copy_(self.tokens[:batch])
        self.tokens[:batch].copy_(next_tokens)
        self.positions[:batch].copy_(torch.clamp(positions + 1, max=self.max_positions - 1))
        return next_tokens, logprobs

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

    def _encode(self, rows: tuple[EncodeRow, ...], requests: Mapping[str, Request]) -> dict[str, EncodeResult]:
        batch = [requests[row.request_id] for row in rows]
        features = self._features(batch)
        if self._compiled_encoder:
            torch._dynamo.mark_dynamic(features, 0)  # any number of rows, one compiled graph
        cross_k, cross_v = self.model.cross_kv(self._encoder(features))
        slots = torch.tensor([row.slots[0] for row in rows], device=self.device)
        self.cross_k.index_copy_(1, slots, cross_k)
        self.cross_v.index_copy_(1, slots, cross_v)
        self._write_block_tables([(row.slots[0], row.block_ids[0]) for row in rows])

        languages = self._pick_languages(batch, slots, cross_k, cross_v)
        prompts = [self.prompter.prompt(lang, r.options) for lang, r in zip(languages, batch, strict=True)]
        last_logits, no_speech = self._run_prompts(prompts, slots, cross_k, cross_v)
        first, logprobs = self._first_tokens(rows, [r.options for r in batch], prompts, last_logits, slots)
        host = torch.stack((first.double(), logprobs.double(), no_speech.double())).cpu().tolist()
        return {
            row.request_id: EncodeResult(token_ids=(int(token),), language=lang, logprobs=(lp,), no_speech_prob=ns)
            for row, lang, token, lp, ns in zip(rows, languages, *host, strict=True)
        }

    def _first_tokens(
        self, rows: tuple[EncodeRow, ...], options: list[DecodeOptions], prompts: list[WhisperPrompt],
        logits: torch.Tensor, slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chooses each row's first token from the logits after its prompt and sets up its slot for decoding.
        -> (tokens [B], their log-probabilities [B])."""
        device = self.device
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
        first, logprobs = self.strategy.select(logits, state, first=True,
                                               sampling=any(o.temperature > 0 for o in options))
        tb = self.special.timestamp_begin
        self.tokens.index_copy_(0, slots, first)
        self.positions.index_copy_(0, slots, prompt_lens)
        self.eot_from.index_copy_(0, slots, eot_from)
        self.previous.index_fill_(0, slots, tb)  # fewer than two tokens sampled: the rules count it a timestamp
        self.last_timestamp.index_copy_(0, slots, torch.where(first >= tb, first, nothing))
        self.timestamps.index_copy_(0, slots, timestamps)
        self.temperature.index_copy_(0, slots, temperature)
        for row, o in zip(rows, options, strict=True):
            self._slot_timestamps[row.slots[0]] = o.timestamps
            self._slot_sampling[row.slots[0]] = o.temperature > 0
        return first, logprobs

    def _features(self, batch: list[Request]) -> torch.Tensor:
        """[B, n_mels, frames]: the caller's features where a request brings them, the extractor's elsewhere."""
        missing = [i for i, r in enumerate(batch) if r.features is None]
        computed = self.loaded.features([batch[i].audio for i in missing], device=self.device) if missing else None
        if len(missing) == len(batch):
            return computed
        rows = [r.features for r in batch]
        for j, i in enumerate(missing):
            rows[i] = computed[j]
        return torch.stack([f.to(device=self.device, dtype=torch.float32) for f in rows])

    def _run_prompts(
        self, prompts: list[WhisperPrompt], slots: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor
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
        self, batch: list[Request], slots: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor
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
