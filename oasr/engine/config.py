"""Engine configuration: one frozen dataclass per concern, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from oasr.kernels import KV_CACHE_DTYPES  # CacheConfig.kv_cache_dtype (oasr.layers.kv_format)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class SchedulerConfig:
    """Caps per walk (rows of one step) and the fairness bound. Pure numbers: the scheduler sees no tensors."""

    max_num_seqs: int = 256  # requests holding decode state at once (= decode rows, = cross-attention slots)
    max_encode_rows: int = 64  # new requests encoded in one step when nothing is decoding
    max_encoder_frames: int = 64 * 3000  # feature frames through the encoder in one step
    max_combined_encode_rows: int = 16  # encode rows beside a running decode walk (keeps decode latency flat)
    decode_steps_per_tick: int = 4  # decode steps run back to back before tokens are read on the host
    combined_decode_steps: int = 1  # decode steps in a step that also encodes (newcomers' first tokens wait less)
    # Beside running decodes, an encode walk waits until this many rows can go together (an encode walk has a
    # fixed cost), unless the head of the queue has already waited max_encode_delay steps.
    min_combined_encode_rows: int = 8
    max_encode_delay: int = 4
    starvation_bound: int = 64  # steps the head of the queue may wait for room before a running request yields
    policy: str = "fifo"

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_encode_rows", "max_combined_encode_rows", "decode_steps_per_tick",
                     "combined_decode_steps", "starvation_bound", "max_encoder_frames",
                     "min_combined_encode_rows", "max_encode_delay"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class CacheConfig:
    """Decoder self-attention K/V lives in a pool of fixed-size blocks."""

    block_size: int = 16  # token positions per block
    cross_block_size: int = 32  # encoder positions per cross-attention block (models attending to their own length)
    num_blocks: int | None = None  # explicit pool size; else derived from memory_budget_bytes
    # Self-attention pool + cross-attention slots, at most. None: 40% of free GPU memory, or on CPU room for 8
    # requests of the model's longest length (oasr.engine.memory).
    memory_budget_bytes: int | None = None
    # How K/V are held: "auto" in the model's dtype, "fp8" in float8 e4m3 with a scale per position and head
    # (oasr.layers.kv_format): half the bytes per step and per request. Decoders with K/V caches only.
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.cross_block_size < 1 or (self.num_blocks is not None and self.num_blocks < 2):
            raise ValueError("CacheConfig needs block sizes >= 1 and, if given, num_blocks >= 2")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; choose one of "
                             f"{', '.join(KV_CACHE_DTYPES)}")


@dataclass(frozen=True)
class RunnerConfig:
    cuda_graphs: bool = True  # capture decode steps per batch bucket (CUDA only; eager elsewhere)
    # torch.compile the encoder (CUDA only): fused elementwise work, one compilation for every batch size; the
    # first encode walk pays the compilation (tens of seconds for large shapes).
    compile_encoder: bool = False
    # torch.compile the word-level CTC beam's frame before its CUDA graphs capture it (oasr.decode.
    # ctc_lexicon_graphs): fused kernels in place of a few hundred small ones, 1.8x faster searches on an H100; the
    # first search of each rows bucket pays the compilation (seconds; falls back to eager frames if it fails).
    compile_word_beam: bool = True
    batch_buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
