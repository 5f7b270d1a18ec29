"""Model runner for frame-synchronous families (CTC, RNN-T, TDT): the whole decode happens in the encode walk.

Rows hold no decode state between steps, so there are no slots or KV blocks: a request is finished by the
step that encodes it. The transducer label loop runs batched on the device inside the strategy.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.engine.config import EngineConfig
from oasr.engine.request import Request
from oasr.engine.scheduler import EncodeResult, RunnerOutput, SchedulerOutput
from oasr.engine.staging import stager_for
from oasr.errors import UnsupportedOptionError
from oasr.models.loader import LoadedModel
from oasr.types import DecodeOptions

# Self-attention over a whole window costs O(frames^2) memory; 60 s is 750 encoder frames after 8x subsampling.
WINDOW_SECONDS = 60


class FrameSyncRunner:
    incremental = False
    pads_to_window = False  # a batch is padded to its longest row only
    prompt_len = 0
    max_positions = 1 << 30  # no decoder positions: the output length is bounded by the frames

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        arch = type(self.model)
        strategy = DECODE_STRATEGIES.get(arch.default_decode_strategy)
        use_graphs = config.runner.cuda_graphs and self.device.type == "cuda"
        # Label loops (transducers) replay captured steps; CTC decodes in a few kernels and needs none.
        self.strategy = strategy(cuda_graphs=use_graphs) if getattr(strategy, "graph_capturable", False) else strategy()
        self.num_slots = config.scheduler.max_num_seqs
        self.window_samples = WINDOW_SECONDS * 16_000
        self.phase_seconds = {"encode": 0.0, "decode": 0.0}
        self._encoder = self.model.encode
        # While a step runs on the device, the next steps' audio is copied into pinned memory (CUDA only).
        self.stager = stager_for(self.device, 2 * config.scheduler.max_encode_rows)
        if config.runner.compile_encoder and self.device.type == "cuda":
            # Rows and frames vary from batch to batch: one graph with symbolic shapes, not one per shape.
            self._encoder = torch.compile(self.model.encode, dynamic=True)

    def check(self, options: DecodeOptions) -> None:
        if options.task != "transcribe":
            raise UnsupportedOptionError(f"{self.loaded.name} only transcribes; task {options.task!r} is not available")
        if options.language is not None:
            raise UnsupportedOptionError(f"{self.loaded.name} takes no language option (got {options.language!r})")
        if options.min_new_tokens:
            raise UnsupportedOptionError(f"{self.loaded.name} cannot force an output length (min_new_tokens)")
        if options.timestamps or options.prompt or options.prompt_token_ids or options.temperature > 0:
            raise UnsupportedOptionError(f"{self.loaded.name} decodes greedily without timestamps or a text prompt")
        if options.beam_size is not None:
            raise UnsupportedOptionError(f"{self.loaded.name} has no beam search (beam_size); it decodes greedily")

    def prompt_len_for(self, options: DecodeOptions) -> int:
        return self.prompt_len

    def num_frames(self, num_samples: int) -> int:
        return num_samples // self.loaded.features.config.hop_length + 1

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput:
        if not out.encode:
            return RunnerOutput()
        start = time.perf_counter()
        batch = [requests[row.request_id] for row in out.encode]
        audio = [self.stager.take(r) for r in batch] if self.stager else [r.audio for r in batch]
        features, lengths = self.loaded.features(audio, device=self.device)
        encoded = self._encoder(features.to(self.loaded.dtype), lengths)
        if self.stager:  # the device has the step's work queued: stage what comes next meanwhile
            self.stager.stage(requests)
        token_ids = self.strategy.decode(self.model, encoded)
        self.phase_seconds["encode"] += time.perf_counter() - start
        return RunnerOutput(
            encoded={
                row.request_id: EncodeResult(tuple(ids[: r.max_new_tokens]), finished=True)
                for row, r, ids in zip(out.encode, batch, token_ids, strict=True)
            }
        )
