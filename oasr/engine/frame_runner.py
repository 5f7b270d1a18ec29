"""Model runner for frame-synchronous families (CTC, RNN-T, TDT): the whole decode happens in the encode walk.

Rows hold no decode state between steps, so there are no slots or KV blocks: a request is finished by the
step that encodes it. The transducer label loop runs batched on the device inside the strategy. Rows that ask
for a beam (``beam_size``) are decoded by the architecture's searching strategy (CTC prefix beam search), one
launch per beam size, beside the greedy rows of the same encoder pass; rows that also name a lexicon or language
model get the word-level search (``oasr.decode.ctc_lexicon_beam``), one launch per distinct set of those options,
and rows with hotwords a prefix search biased by them, one launch per list.

On CUDA, steps overlap (``overlaps_steps``): ``launch`` queues a step's work and returns with its tokens still on
their way to the host, and the engine queues the next step before it reads them. The host's share of a step
(the scheduler, copying the audio into pinned memory, the kernel launches) then runs while the device works on
the step before.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import torch

from oasr.decode import DECODE_STRATEGIES
from oasr.decode.base import EncoderOutput
from oasr.decode.ctc_lexicon_beam import WordResourceCache
from oasr.decode.ctc_wfst import DecodingGraphCache
from oasr.decode.hotwords import ContextGraphCache
from oasr.decode.pending import PendingTokens
from oasr.engine.config import EngineConfig
from oasr.engine.contracts import FrameSynchronousModel
from oasr.engine.request import Request
from oasr.engine.runners import RUNNERS
from oasr.engine.step import EncodeResult, RunnerOutput, SchedulerOutput
from oasr.errors import UnsupportedOptionError
from oasr.models.capabilities import capabilities_of, check_options
from oasr.models.loader import LoadedModel
from oasr.registry import conform
from oasr.types import DecodeOptions

@dataclass(frozen=True)
class SearchSpec:
    """The options that pick a request's decode strategy: requests with equal specs decode in one launch."""

    beam_size: int | None
    lm: str | None
    lexicon: str | None
    lm_weight: float | None
    word_bonus: float | None
    beam_size_token: int | None
    beam_threshold: float | None
    hotwords: tuple
    decoding_graph: str | None
    rescore_weight: float | None

    @classmethod
    def of(cls, options: DecodeOptions) -> SearchSpec:
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls)})


# Self-attention over a whole window costs O(frames^2) memory; 60 s is 750 encoder frames after 8x subsampling.
WINDOW_SECONDS = 60


class LaunchedStep:
    """A launched step: ``wait`` reads its tokens back and reports them as the step's ``RunnerOutput``."""

    def __init__(self, rows: list[tuple[str, int, str | None]], tokens: list[tuple[list[int], PendingTokens]],
                 runner: FrameSyncRunner) -> None:
        # (request id, token budget, language asked) per encode row; these models detect no language themselves.
        self.rows = rows
        self.tokens = tokens  # (encode rows, their tokens on the way) per strategy launch
        self.runner = runner

    def wait(self) -> RunnerOutput:
        start = time.perf_counter()
        token_ids: list[list[int]] = [[] for _ in self.rows]
        for members, pending in self.tokens:
            for i, ids in zip(members, pending.wait(), strict=True):
                token_ids[i] = ids
        self.runner.phase_seconds["encode"] += time.perf_counter() - start
        return RunnerOutput(
            encoded={
                request_id: EncodeResult(tuple(ids[:budget]), language=language, finished=True)
                for (request_id, budget, language), ids in zip(self.rows, token_ids, strict=True)
            }
        )


def refuse_kv_cache_dtype(loaded: LoadedModel, config: EngineConfig | None) -> None:
    """A model that decodes frame by frame (or streams) keeps no decoder K/V cache: asking for a cache format is
    refused when its engine is built, not at its first request."""
    if config is not None and config.cache.kv_cache_dtype != "auto":
        raise UnsupportedOptionError(
            f"{loaded.name} ({loaded.architecture}) decodes frame by frame and keeps no decoder K/V cache: "
            f"kv_cache_dtype {config.cache.kv_cache_dtype!r} does not apply to it")


@RUNNERS.register("frame_sync")
class FrameSyncRunner:
    incremental = False
    overlaps_steps = False  # set per device in __init__
    pads_to_window = False  # a batch is padded to its longest row only
    prompt_len = 0
    max_positions = 1 << 30  # no decoder positions: the output length is bounded by the frames
    end_token = -1  # these families end with their frames, not with a token
    stop_tokens: tuple[int, ...] = ()
    block_pool = None  # no decoder caches
    cross_pool = None
    # The rest of the Runner contract (oasr.engine.contracts), set in __init__.
    num_slots: int
    window_samples: int
    phase_seconds: dict[str, float]

    def __init__(self, loaded: LoadedModel, config: EngineConfig) -> None:
        self.loaded = loaded
        # The prompt pair is declared, with its defaults, on oasr.models.frame_sync.FrameSyncModel.
        self.model = conform(loaded.model, FrameSynchronousModel, f"{loaded.name} ({loaded.architecture})")
        refuse_kv_cache_dtype(loaded, config)
        self.device = loaded.device
        self.capabilities = capabilities_of(type(self.model))
        strategy = DECODE_STRATEGIES.get(self.capabilities.default_strategy)
        use_graphs = config.runner.cuda_graphs and self.device.type == "cuda"
        # Label loops (transducers) replay captured steps; CTC decodes in a few kernels and needs none.
        self.strategy = strategy(cuda_graphs=use_graphs) if strategy.graph_capturable else strategy()
        beam = self.capabilities.beam_strategy
        self._beam_strategy = DECODE_STRATEGIES.get(beam) if beam is not None else None
        # Lexicons and language models that requests name, loaded at their first request's admission.
        self._words = WordResourceCache(loaded.tokenizer, cuda_graphs=use_graphs,
                                        compile_frames=use_graphs and config.runner.compile_word_beam)
        self._contexts = ContextGraphCache(loaded.tokenizer.encode)  # hotword automata, by list
        graph = self.capabilities.graph_strategy
        self._graph_strategy = DECODE_STRATEGIES.get(graph) if graph is not None else None
        self._graphs = DecodingGraphCache()  # WFST decoding graphs, read at their first request's admission
        self.num_slots = config.scheduler.max_num_seqs
        self.window_samples = WINDOW_SECONDS * 16_000
        self.phase_seconds = {"encode": 0.0, "decode": 0.0}
        # Only CUDA runs asynchronously; elsewhere a launch computes everything before it returns.
        self.overlaps_steps = self.device.type == "cuda"
        # Prompts may condition the encoder's input (SenseVoice), so the runner encodes through the model's
        # encode_prompted (FrameSyncModel's default: encode, then fuse_prompt on its frames).
        self._encoder = self.model.encode_prompted
        if config.runner.compile_encoder and self.device.type == "cuda":
            # Rows and frames vary from batch to batch: one graph with symbolic shapes, not one per shape.
            self._encoder = torch.compile(self.model.encode_prompted, dynamic=True)

    def check(self, options: DecodeOptions) -> None:
        check_options(self.capabilities, options, f"{self.loaded.name} ({self.loaded.architecture})")
        self.model.prompt_id(options)  # a value the checkpoint has no prompt for is refused here, not mid-step
        if options.lm is not None or options.lexicon is not None:
            words = self._words.get(options.lm, options.lexicon)  # a missing or unreadable file is refused here
            if options.hotwords:  # as is a hotword the lexicon cannot write
                words.boosts(options.hotwords, self.device)
        if options.decoding_graph is not None:
            # Likewise a missing or unreadable graph, or one built for another vocabulary.
            self._graphs.get(options.decoding_graph).check_columns(self.model.ctc_columns)

    def prompt_len_for(self, options: DecodeOptions, num_samples: int) -> int:
        return self.prompt_len

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        """The language a finished request is reported in: the one asked for, unless the model writes the one it
        found in its output (SenseVoice's language tag)."""
        return self.model.output_language(language, token_ids)

    def cross_positions(self, num_samples: int) -> int:
        return 0

    def num_frames(self, num_samples: int) -> int:
        return num_samples // self.loaded.features.config.hop_length + 1

    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput:
        return self.launch(out, requests).wait()

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> LaunchedStep:
        """Queues the step's work on the device; the returned step's ``wait`` reads its result."""
        start = time.perf_counter()
        batch = [requests[row.request_id] for row in out.encode]
        rows = [(r.request_id, r.max_new_tokens, r.options.language) for r in batch]
        if not batch:
            return LaunchedStep(rows, [], self)
        audio = [r.audio for r in batch]
        features, _ = self.loaded.features(audio, device=self.device)
        # The same frame counts, known on the host: the encoder plans its layout without reading the device.
        lengths = self.loaded.features.frame_lengths(torch.tensor([len(a) for a in audio]))
        encoded = self._encoder(features.to(self.loaded.dtype), lengths, self._prompt_ids(batch))
        tokens = self._launch_strategies(batch, encoded)
        self.phase_seconds["encode"] += time.perf_counter() - start
        return LaunchedStep(rows, tokens, self)

    def _prompt_ids(self, batch: list[Request]) -> torch.Tensor | None:
        """int64 [B] per-row prompt ids on the device (looked up on the host), or None for a model without."""
        ids = [self.model.prompt_id(r.options) for r in batch]
        if all(i is None for i in ids):
            return None
        return torch.tensor(ids, dtype=torch.long).to(self.device, non_blocking=True)

    def _launch_strategies(self, batch: list[Request], encoded: EncoderOutput) -> list[tuple[list[int], PendingTokens]]:
        """The default strategy over the greedy rows, the searching one over each distinct search's rows."""
        by_search: dict[SearchSpec, list[int]] = {}
        for i, request in enumerate(batch):
            by_search.setdefault(SearchSpec.of(request.options), []).append(i)
        launches = []
        for spec, members in by_search.items():
            if len(members) == len(batch):
                part = encoded
            else:
                index = torch.tensor(members, device=encoded.hidden.device)
                part = EncoderOutput(encoded.hidden.index_select(0, index), encoded.lengths.index_select(0, index))
            launches.append((members, self._strategy_for(spec).launch(self.model, part)))
        return launches

    def _strategy_for(self, spec: SearchSpec):
        if spec.decoding_graph is not None:
            return self._graph_strategy.for_graph(self._graphs.get(spec.decoding_graph))
        if spec.beam_size is None:  # hotwords alone: the check let them through only where they need no search
            return self._beam_strategy.for_beam(1, spec.hotwords, self._contexts) if spec.hotwords else self.strategy
        if spec.rescore_weight is not None:
            return self._beam_strategy.for_rescoring(spec.beam_size, spec.rescore_weight)
        if spec.lm is not None or spec.lexicon is not None:
            return self._beam_strategy.with_words(self._words.get(spec.lm, spec.lexicon), spec.beam_size,
                                                  spec.lm_weight, spec.word_bonus, spec.beam_size_token,
                                                  spec.beam_threshold, spec.hotwords)
        return self._beam_strategy.for_beam(spec.beam_size, spec.hotwords, self._contexts)
