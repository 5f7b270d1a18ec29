"""Model runner for autoregressive decoders (Whisper, Canary, Cohere, Qwen3-ASR): scheduler decisions into tensors.

Everything model-specific comes through the model's seam (``oasr.models.base``): its ``DecoderSpec`` sizes the
caches, its ``PromptBuilder`` gives each request's prompt (and a detection pre-pass such as Whisper's language
detection), its logit filters configure the decode strategy. Cross-attention K/V is kept per slot for models
that attend to a fixed window and in per-request blocks for the others (``oasr.engine.cross_cache``).

Decode state lives in per-slot device buffers (``oasr.engine.slot_state``), so a decode step over slots
``[0, bucket)`` needs no host input. Steps are captured in CUDA graphs per (batch bucket, block bucket,
timestamps in use, sampling in use): the greedy graphs of every batch bucket when the engine starts (largest
first, into one memory pool), the rarer ones the first time they are needed, each capture isolated from the
engine's other threads (``capture_error_mode="thread_local"``: the stager pinning audio beside it cannot
invalidate it). ``num_decode_steps`` replays run back to back; their tokens and log-probabilities are read on
the host once per tick.

Prompts differ in length between requests: the encode walk runs them right-padded in one pass. A padded
position writes K/V either to the null block or to a position of its own row past its prompt, which the row's
decode steps overwrite before ever attending to it.

Beam search (``oasr.engine.aed_beams``): a request of beam size K holds K slots. Its prompt runs once, in its
first slot; the first beam step copies the prompt's K/V to the other slots, and every later step copies each
beam's K/V, token history and timestamp state from the row it extends. A tick with beam rows runs its steps
eagerly; ticks of greedy and sampling rows alone keep their CUDA graphs.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.hotwords import ContextGraphCache, spelled_in_text
from oasr.engine.aed_beams import BeamRows, BeamTick
from oasr.engine.block_pool import BlockPool
from oasr.engine.config import EngineConfig
from oasr.engine.contracts import AutoregressiveModel, decoder_contract
from oasr.engine.cross_cache import NoCrossStore, PagedCrossStore, SlotCrossStore
from oasr.engine.kv_cache import PagedKVPool, paged_context
from oasr.engine.memory import MemoryPlan, plan_memory
from oasr.engine.prompt_pass import PromptPass
from oasr.engine.request import Request
from oasr.engine.runners import RUNNERS
from oasr.engine.slot_state import SlotState
from oasr.engine.staging import stager_for
from oasr.engine.step import BeamResult, DecodeRow, EncodeResult, EncodeRow, RunnerOutput, SchedulerOutput
from oasr.uploads import upload, upload_tensor
from oasr.errors import UnsupportedOptionError
from oasr.kernels import paged_attention
from oasr.layers.kv_format import format_for
from oasr.models.capabilities import capabilities_of, check_options
from oasr.models.loader import LoadedModel
from oasr.registry import conform
from oasr.types import DecodeOptions

log = logging.getLogger(__name__)


def _bucket(value: int, buckets: tuple[int, ...]) -> int:
    index = bisect.bisect_left(buckets, value)
    return buckets[index] if index < len(buckets) else value


@RUNNERS.register("autoregressive")
class AutoregressiveRunner:
    incremental = True
    overlaps_steps = False  # each step's tokens feed the next: a step reads its result before it returns
    # The rest of the Runner contract (oasr.engine.contracts), set in __init__ from the model and the memory plan.
    pads_to_window: bool
    max_positions: int
    window_samples: int
    end_token: int
    stop_tokens: tuple[int, ...]
    block_pool: BlockPool
    cross_pool: BlockPool | None
    phase_seconds: dict[str, float]

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.model = conform(loaded.model, AutoregressiveModel, f"{loaded.name} ({loaded.architecture})")
        self.device = loaded.device
        self.dtype = loaded.dtype
        arch = type(self.model)
        self.capabilities = capabilities_of(arch)
        self.spec = self.model.decoder_spec
        conform(self.model, decoder_contract(self.spec), f"{loaded.name} ({loaded.architecture})")
        self.prompter = arch.prompt_builder(loaded.config, loaded.tokenizer, loaded.name)
        self.end_token = self.prompter.end_token
        self.stop_tokens = self.prompter.filters.stop_tokens  # more tokens that end a request, not kept
        self.max_positions = self.spec.max_positions
        filters = self.prompter.filters
        self.strategy = DECODE_STRATEGIES.get(self.capabilities.default_strategy)(filters, self.device)
        self.pads_to_window = self.spec.cross is not None and self.spec.cross.fixed
        seconds = self.capabilities.window_seconds
        self.window_samples = loaded.features.config.n_samples if seconds is None else int(seconds * 16_000)
        self.kv_format = format_for(config.cache.kv_cache_dtype, self.dtype, self.device)
        self.plan: MemoryPlan = plan_memory(self.spec, config.cache, max_num_seqs=config.scheduler.max_num_seqs,
                                            fmt=self.kv_format, device=self.device)
        block_size = config.cache.block_size
        slots = self.plan.num_slots
        self.pool = PagedKVPool(self.spec, self.plan.num_blocks, block_size, self.kv_format, self.device)
        self.block_pool = BlockPool(self.plan.num_blocks, block_size)
        if self.spec.cross is None:  # the audio is spliced into the prompt (PromptAudio)
            self.cross: NoCrossStore | SlotCrossStore | PagedCrossStore = NoCrossStore()
            self.cross_pool = None
        elif self.spec.cross.fixed:
            self.cross = SlotCrossStore(self.spec, slots, self.kv_format, self.device)
            self.cross_pool = None
        else:
            self.cross = PagedCrossStore(self.spec, self.plan.num_cross_blocks, config.cache.cross_block_size, slots,
                                         self.kv_format, self.device)
            self.cross_pool = BlockPool(self.plan.num_cross_blocks, config.cache.cross_block_size)
        self.max_blocks = -(-self.max_positions // block_size)
        self.state = SlotState(slots, self.max_blocks, self.max_positions, filters.timestamp_tokens, self.device)
        self._table_len = [0] * slots  # blocks of each slot's table already on the device
        # Host copies of each slot's flags: a tick skips the timestamp rules or the sampling when no row needs them.
        self._slot_timestamps = [False] * slots
        self._slot_sampling = [False] * slots
        self.batch_buckets = tuple(b for b in config.runner.batch_buckets if b < slots) + (slots,)
        self.block_buckets = tuple(sorted({min(2**i, self.max_blocks) for i in range(self.max_blocks.bit_length() + 1)}))
        self.use_graphs = config.runner.cuda_graphs and self.device.type == "cuda"
        self._kernel_decode = self.use_graphs and paged_attention.supported(
            torch.empty(1, self.spec.num_heads, self.spec.head_dim, device=self.device)) and any(
            getattr(type(m), "KERNEL_OP", None) == "paged_attention" and m.use_kernel for m in self.model.modules())
        self._graphs: dict[tuple[int, int, bool, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._graph_pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        max_steps = max(config.scheduler.decode_steps_per_tick, config.scheduler.combined_decode_steps)
        self._step_tokens = torch.zeros(max_steps, slots, dtype=torch.long, device=self.device)
        self._step_logprobs = torch.zeros(max_steps, slots, dtype=torch.float32, device=self.device)
        beam_strategy = self.capabilities.beam_strategy
        self.beams = BeamRows(DECODE_STRATEGIES.get(beam_strategy)(self.end_token) if beam_strategy else None,
                              slots, self.max_positions, max_steps, self.device)
        # While a step runs on the device, the next encode batch's audio is copied into pinned memory (CUDA only;
        # pinned memory stays with the process once allocated, so one batch's worth is staged, not more).
        self.stager = stager_for(self.device, config.scheduler.max_encode_rows)
        self.prompts = PromptPass(
            model=self.model, prompter=self.prompter, strategy=self.strategy, features=loaded.features,
            audio_positions=self.audio_positions, stager=self.stager, pool=self.pool, cross=self.cross,
            state=self.state, beams=self.beams, device=self.device,
            # Hotword phrases spelled as the decoder writes them mid-text, compiled once per list.
            contexts=ContextGraphCache(spelled_in_text(loaded.tokenizer.encode)),
            compile_encoder=config.runner.compile_encoder and self.device.type == "cuda")
        # Wall seconds per walk; each walk ends in a host read, so no extra synchronisation is needed.
        self.phase_seconds = {"encode": 0.0, "decode": 0.0}
        if self.use_graphs:
            self._capture_greedy_graphs()

    @property
    def num_slots(self) -> int:
        return self.plan.num_slots

    def prompt_len_for(self, options: DecodeOptions, num_samples: int) -> int:
        return self.prompter.prompt_len(options, self.audio_positions(self.num_frames(num_samples)))

    def audio_positions(self, num_frames: int) -> int:
        """Prompt positions the audio of ``num_frames`` feature frames takes (0 for cross-attention models)."""
        return 0 if self.spec.prompt_audio is None else int(self.model.encoder_frames(num_frames))

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        return self.prompter.output_language(language, token_ids)

    def num_frames(self, num_samples: int) -> int:
        return int(self.loaded.features.frame_lengths(torch.tensor([num_samples]))[0])

    def cross_positions(self, num_samples: int) -> int:
        """Encoder positions a request of ``num_samples`` attends to (0: held per slot, not in blocks)."""
        if self.spec.cross is None or self.spec.cross.fixed:
            return 0
        return int(self.model.encoder_frames(self.num_frames(num_samples)))

    def check(self, options: DecodeOptions) -> None:
        self.prompter.check(options)
        check_options(self.capabilities, options, f"{self.loaded.name} ({self.loaded.architecture})")
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
            (released,) = upload(self.device, out.released_slots)
            self.state.release(released)
            self.cross.release(out.released_slots)
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

    def _encode(self, rows: tuple[EncodeRow, ...], requests: Mapping[str, Request]
                ) -> tuple[dict[str, EncodeResult], dict[str, BeamResult]]:
        """The encode walk (``PromptPass``), between the host bookkeeping of its slots: their block tables go to
        the device before their prompts run into them, and their flags are what the decode walk reads after."""
        self.write_block_tables([(slot, blocks) for row in rows
                                 for slot, blocks in zip(row.slots, row.block_ids, strict=True)])
        results = self.prompts.run(rows, requests)
        for row in rows:
            options = requests[row.request_id].options
            for slot in row.slots:
                self._slot_timestamps[slot] = options.timestamps
                self._slot_sampling[slot] = options.temperature > 0
        return results

    # ------------------------------------------------------------------ decode walk

    def _sync_block_tables(self, rows: tuple[DecodeRow, ...]) -> None:
        stale = [(slot, blocks) for row in rows for slot, blocks in zip(row.slots, row.block_ids, strict=True)
                 if len(blocks) != self._table_len[slot]]
        if stale:
            self.write_block_tables(stale)

    def write_block_tables(self, tables: list[tuple[int, tuple[int, ...]]]) -> None:
        """Copies each (slot, block ids) pair's table to the device in one transfer."""
        table = np.zeros((len(tables), self.max_blocks + 1), dtype=np.int64)  # column 0: the slot
        for i, (slot, blocks) in enumerate(tables):
            table[i, 0] = slot
            table[i, 1 : 1 + len(blocks)] = blocks
            self._table_len[slot] = len(blocks)
        table = upload_tensor(torch.from_numpy(table), self.device)
        self.state.block_table.index_copy_(0, table[:, 0], table[:, 1:])

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
        # By slot, as Python numbers in one conversion (indexing the tensor per row costs an op per row).
        tokens, logprobs = host[0].long().T.tolist(), host[1].T.tolist()
        greedy = [row for row in rows if row.request_id not in self.beams.groups]
        return (
            {row.request_id: tuple(tokens[row.slots[0]]) for row in greedy},
            {row.request_id: tuple(logprobs[row.slots[0]]) for row in greedy},
            self.beams.collect(tick, steps) if tick is not None else {},
        )

    def _graph_key(self, batch: int, num_blocks: int, timestamps: bool, sampling: bool) -> tuple[int, int, bool, bool]:
        # The paged kernel reads each row's blocks up to its position, whatever the table's width: one graph per
        # batch bucket serves every length. The torch path gathers the whole table, so it is bucketed too.
        return batch, self.max_blocks if self._kernel_decode else num_blocks, timestamps, sampling

    def _step(self, batch: int, num_blocks: int, timestamps: bool, sampling: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.use_graphs:
            return self._step_eager(batch, num_blocks, timestamps, sampling)
        key = self._graph_key(batch, num_blocks, timestamps, sampling)
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        graph, next_tokens, logprobs = self._graphs[key]
        graph.replay()
        return next_tokens, logprobs

    def _step_eager(
        self, batch: int, num_blocks: int, timestamps: bool, sampling: bool,
        beams: tuple[BeamTick, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token for every slot in [0, batch). Idle slots read and write the null blocks; their tokens are
        never read. Only device buffers are touched, so this can be captured (without ``beams``).
        ``beams``: (the tick's searches, this step's index in the tick): beam rows then take the searches'
        choices instead of their argmax, and the state of the rows their new beams extend."""
        state = self.state
        positions = state.positions[:batch]
        # The paged self-attention kernel serves greedy steps only. Beam ticks (and prompts) attend through the torch
        # path: with that kernel, one beam search on CUDA gave different tokens from run to run, for a reason not
        # yet found. (Cross-attention is another kernel, read by beam ticks too: see cross_cache.py.)
        context = paged_context(self.pool, state.block_table[:batch, :num_blocks], positions[:, None],
                                decode_kernel=beams is None)
        hidden = self.model.decode_hidden(state.tokens[:batch, None], positions[:, None], context,
                                          self.cross.context(batch))
        logits = self.model.logits(hidden[:, -1])
        rows = state.rows(batch, timestamps=timestamps)
        filtered = self.strategy.filter(logits, rows, first=False)
        next_tokens, logprobs = self.strategy.choose(filtered, rows, sampling=sampling)
        if beams is None:
            state.advance(batch, next_tokens)
            return next_tokens, logprobs
        tick, step = beams
        source = torch.arange(batch, device=self.device)
        beam_sources, beam_targets = self.beams.advance(tick, step, filtered, positions, next_tokens, source)
        table = state.block_table  # each new beam's K/V from the row it extends
        self.pool.copy_blocks(table[beam_sources, : tick.num_blocks], table[beam_targets, : tick.num_blocks])
        state.advance(batch, next_tokens, source)
        return next_tokens, logprobs

    # ------------------------------------------------------------------ CUDA graphs

    def _capture_greedy_graphs(self) -> None:
        """The greedy step of every batch bucket, largest first so that the smaller graphs reuse its pool."""
        start = time.perf_counter()
        for batch in sorted(self.batch_buckets, reverse=True):
            key = self._graph_key(batch, self.max_blocks, False, False)
            if key not in self._graphs:
                self._graphs[key] = self._capture(*key)
        log.info("captured %d decode graphs in %.2f s", len(self._graphs), time.perf_counter() - start)

    def _capture(
        self, batch: int, num_blocks: int, timestamps: bool, sampling: bool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        saved = [t.clone() for t in self.state.captured()]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up: lazy initialisation must not happen during capture
            self._step_eager(batch, num_blocks, timestamps, sampling)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's calls are checked against the capture, so the stager's pinned
        # allocations on its worker thread cannot invalidate it.
        with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
            next_tokens, logprobs = self._step_eager(batch, num_blocks, timestamps, sampling)
        # Warm-up and capture advanced the state; put it back (the null block absorbed their writes only for
        # idle rows, and live rows rewrite the same positions when the graph replays).
        for buffer, value in zip(self.state.captured(), saved, strict=True):
            buffer.copy_(value)
        log.debug("captured decode step: batch %d, %d blocks, timestamps %s, sampling %s",
                  batch, num_blocks, timestamps, sampling)
        return graph, next_tokens, logprobs
