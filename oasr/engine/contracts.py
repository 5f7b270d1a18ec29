"""What the engine requires of what it is handed, as types: a runner, and the model each runner kind drives.

``RUNNERS`` checks every runner class against ``Runner`` when it registers; each runner checks the model it is
given against its model protocol when it is built (``conform``), so an architecture that lacks a method is
refused with the engine, naming every method it lacks, instead of failing at its first request. The
architectures' side of the seam (capability record, prompt builder, decoder spec) is ``oasr.models.base``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only
    import torch

    from oasr.decode.base import EncoderOutput
    from oasr.engine.block_pool import BlockPool
    from oasr.engine.request import Request
    from oasr.engine.step import RunnerOutput, SchedulerOutput
    from oasr.layers.cache import CrossAttentionCache, SelfAttentionCache
    from oasr.models.base import DecoderSpec, PromptBuilder
    from oasr.types import DecodeOptions


@runtime_checkable
class Runner(Protocol):
    """A runner kind (``ModelCapabilities.runner``): turns the scheduler's decisions into tensors for one kind of
    model. ``ASREngine`` reads these and nothing else of it (``oasr.engine.runners``)."""

    incremental: bool  # a request decodes a token per step (the scheduler grows its blocks as it goes)
    overlaps_steps: bool  # ``launch`` starts a step that the next one finishes (``OverlappingRunner``)
    pads_to_window: bool  # every request is encoded as one padded window
    num_slots: int  # requests it holds decode state for at once
    max_positions: int  # decoder positions of a request, its prompt included
    window_samples: int  # the longest audio one request holds
    end_token: int  # -1: requests end with their frames, not with a token
    stop_tokens: tuple[int, ...]  # more tokens that end a request, not kept
    block_pool: BlockPool | None  # the scheduler's self-attention blocks, or None without decoder caches
    cross_pool: BlockPool | None  # the cross-attention blocks of models attending to their own length
    phase_seconds: dict[str, float]  # wall seconds of its encode and decode walks, for the benches

    def check(self, options: DecodeOptions) -> None:
        """Raises ``UnsupportedOptionError`` for option values the model cannot serve."""

    def prompt_len_for(self, options: DecodeOptions, num_samples: int) -> int: ...

    def num_frames(self, num_samples: int) -> int: ...

    def cross_positions(self, num_samples: int) -> int: ...

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None: ...

    def execute(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput: ...


@runtime_checkable
class OverlappingRunner(Runner, Protocol):
    """A runner whose ``overlaps_steps`` is set: ``launch`` queues a step on the device and returns, and the
    engine reads the launched step's result after scheduling the next."""

    def launch(self, out: SchedulerOutput, requests: Mapping[str, Request]) -> Any: ...


@runtime_checkable
class AutoregressiveModel(Protocol):
    """What the ``autoregressive`` runner calls on every model it serves (``oasr.engine.autoregressive``)."""

    decoder_spec: DecoderSpec  # layers, heads, positions; how the audio reaches the decoder

    def prompt_builder(self, config: Any, tokenizer: Any, name: str) -> PromptBuilder: ...

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput: ...

    def decode_hidden(self, tokens: torch.Tensor, positions: torch.Tensor, self_cache: SelfAttentionCache,
                      cross_cache: CrossAttentionCache | None) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class CrossAttentionModel(AutoregressiveModel, Protocol):
    """An autoregressive model whose ``decoder_spec.cross`` is set: its decoder attends to the encoder's output,
    whose keys and values it projects into the runner's buffers (or callables) once per request."""

    def cross_kv_into(self, hidden: torch.Tensor, k_out: Any, v_out: Any) -> None: ...


@runtime_checkable
class VariableCrossModel(CrossAttentionModel, Protocol):
    """A cross-attention model whose requests attend to their own encoder length (``CrossSpec.fixed`` False)."""

    def encoder_frames(self, num_feature_frames: int) -> int: ...


@runtime_checkable
class PromptAudioModel(AutoregressiveModel, Protocol):
    """An autoregressive model whose ``decoder_spec.prompt_audio`` is set: the encoder's output replaces its
    prompt's audio positions, and the prompt runs as embeddings."""

    def encoder_frames(self, num_feature_frames: int) -> int: ...

    def embed(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def decode_embedded(self, embeds: torch.Tensor, positions: torch.Tensor,
                        self_cache: SelfAttentionCache) -> torch.Tensor: ...


def decoder_contract(spec: DecoderSpec) -> type:
    """The protocol an autoregressive model with ``spec`` provides."""
    if spec.prompt_audio is not None:
        return PromptAudioModel
    return CrossAttentionModel if spec.cross is not None and spec.cross.fixed else VariableCrossModel


@runtime_checkable
class FrameSynchronousModel(Protocol):
    """What the ``frame_sync`` runner calls on every model it serves (``oasr.engine.frame_runner``), beside the
    methods its decode strategies document. ``oasr.models.frame_sync.FrameSyncModel`` declares the prompt pair
    with identity defaults."""

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput: ...

    def prompt_id(self, options: DecodeOptions) -> int | None: ...

    def fuse_prompt(self, hidden: torch.Tensor, prompt_ids: torch.Tensor | None) -> torch.Tensor: ...

    def encode_prompted(self, features: torch.Tensor, lengths: torch.Tensor,
                        prompt_ids: torch.Tensor | None) -> EncoderOutput: ...

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None: ...
