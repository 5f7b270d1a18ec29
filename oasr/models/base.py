"""What the engine expects of an architecture class.

Every architecture class (registered in ``oasr.models.ARCHITECTURES``) has:

- ``capabilities``: its ``oasr.models.capabilities.ModelCapabilities`` (runner kind, decode strategies, options,
  tasks, word timing, streaming), declared once;
- ``config_class`` with ``from_dict``/``to_dict``; ``from_config(config)``; ``tiny_config()``;
  ``example_inputs(config, batch_size)``: random inputs ``forward`` accepts (the registry smoke test);
- ``feature_extractor`` / ``tokenizer``: names in ``FEATURE_EXTRACTORS`` / ``TOKENIZERS``;
- ``tied_keys``: checkpoint keys that alias another parameter (may be empty).

What each runner kind calls:

- ``autoregressive`` (Whisper, Canary, Cohere, Qwen3-ASR): ``encode(features, lengths) -> EncoderOutput``;
  ``decoder_spec`` (a ``DecoderSpec``); ``cross_kv_into(hidden, k_out, v_out)``; ``decode_hidden(tokens,
  positions, self_cache, cross_cache)`` and ``logits(hidden)`` (the caches are ``oasr.layers.cache``'s seams);
  ``prompt_builder(config, tokenizer, name)``: the model's ``PromptBuilder``; for variable-length
  cross-attention, ``encoder_frames(num_feature_frames)``. The engine schedules one decode step per token.
  A decoder-only model whose prompt carries the audio (``DecoderSpec.prompt_audio``, Qwen3-ASR) has no
  ``cross_kv_into``; it has ``encoder_frames``, ``embed(tokens)`` and ``decode_embedded(embeds, positions,
  self_cache)``: its prompt runs as the embeddings of its tokens with the encoder's output in place of the audio
  positions, and its decode steps call ``decode_hidden`` with ``cross_cache`` None.
- ``frame_sync`` (CTC, RNN-T, TDT): ``encode(features, lengths) -> EncoderOutput``, then ``prompt_id(options)``
  and ``fuse_prompt(hidden, prompt_ids)`` (declared with identity defaults on ``oasr.models.frame_sync.
  FrameSyncModel``, which every such class subclasses), plus the methods its decode strategies document
  (``ctc_log_probs``; the transducer predictor and joint). Finishes in the encode walk.
- ``word_timing``: the record's ``aligner`` names a ``WordAligner`` (``oasr.models.aligners``) that times words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# What ``encode`` returns is what the decode strategies read, so it is declared below them, in ``oasr.decode``;
# the families keep importing it from here.
from oasr.decode.base import EncoderOutput  # noqa: F401
from oasr.types import DecodeOptions, Task, Word


@dataclass(frozen=True)
class CrossSpec:
    """The encoder positions a decoder attends to. ``fixed``: every request attends exactly ``max_len`` (a padded
    window, as Whisper's 1,500); else each attends its own encoder length, at most ``max_len``."""

    max_len: int
    fixed: bool


@dataclass(frozen=True)
class PromptAudio:
    """The audio reaches the decoder as prompt embeddings instead of through cross-attention: the encoder's output
    of a request (``encode``, in the decoder's width) replaces the embeddings of its prompt's audio positions
    (``Prompt.audio_index`` onwards, one per encoder position), and the decoder reads them as it reads its other
    prompt positions, into the same self-attention cache. ``max_len``: the most encoder positions a request has."""

    max_len: int


@dataclass(frozen=True)
class DecoderSpec:
    """What the engine sizes a decoder's caches by, and how the audio reaches the decoder: through
    cross-attention (``cross``) or spliced into the prompt (``prompt_audio``); exactly one of the two is set."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int  # decoder positions, the prompt included
    cross: CrossSpec | None
    prompt_audio: PromptAudio | None = None

    def __post_init__(self) -> None:
        if (self.cross is None) == (self.prompt_audio is None):
            raise ValueError("a decoder reads the audio through cross-attention or in its prompt: set exactly one "
                             "of cross and prompt_audio")


@dataclass(frozen=True)
class Prompt:
    """A request's decoder prompt. ``no_speech_index``: the position whose next-token distribution gives the
    probability of the model's no-speech token (None where the model has none)."""

    token_ids: tuple[int, ...]
    no_speech_index: int | None = None
    # Models with ``PromptAudio``: the first of the prompt's audio positions (as many as the request's encoder
    # positions), whose embeddings the encoder's output replaces. None for models with cross-attention.
    audio_index: int | None = None


@dataclass(frozen=True)
class Detection:
    """A pre-pass before the prompt: the decoder reads ``token_ids`` and the likeliest of ``candidates`` after them
    names what was detected (``names[i]`` for ``candidates[i]``: Whisper's language)."""

    token_ids: tuple[int, ...]
    candidates: tuple[int, ...]
    names: tuple[str, ...]


@dataclass(frozen=True)
class TextSpan:
    """A decoded segment of a window: its bounds (seconds from the input's start) and its text tokens."""

    start: float
    end: float
    num_tokens: int


@dataclass(frozen=True)
class TimedSegment:
    """A segment after word alignment: bounds (possibly moved to its words) and its words."""

    start: float
    end: float
    words: tuple[Word, ...]


@dataclass(frozen=True)
class AlignmentRow:
    """One decoded window that wants word timestamps.

    ``token_ids``: what the decoder produced for the window (ids >= ``<|endoftext|>``, such as timestamps, are
    ignored); ``num_frames``: feature frames (10 ms) that hold audio, at most one window's; ``language``/``task``:
    the prompt the tokens were decoded under (``language`` also picks how tokens group into words);
    ``time_offset``: the window's start in the input (seconds); ``spans``: the window's segments, by default one
    over the whole window; ``last_speech_end``: where speech ended before this window, or None when this row
    continues the row before it in the same call (then that row's last word end is used).
    """

    token_ids: tuple[int, ...]
    num_frames: int
    language: str | None = None
    task: Task = "transcribe"
    time_offset: float = 0.0
    spans: tuple[TextSpan, ...] = ()
    last_speech_end: float | None = 0.0

    def __post_init__(self) -> None:
        if self.num_frames < 0:
            raise ValueError(f"num_frames must be >= 0, got {self.num_frames}")


class PromptBuilder(Protocol):
    """The model's side of an autoregressive request: prompt token ids from the request's options."""

    end_token: int  # the token that ends generation
    no_speech_token: int | None  # a token whose probability after the prompt says "no speech", if any

    def check(self, options: DecodeOptions) -> None:
        """Raises ``UnsupportedOptionError`` for option values this checkpoint cannot serve."""

    def prompt_len(self, options: DecodeOptions, num_audio_positions: int = 0) -> int:
        """The prompt's length (the same whatever a detection pre-pass finds). ``num_audio_positions``: the
        request's encoder positions where the model splices them into its prompt (``PromptAudio``), else 0."""

    def detection(self, options: DecodeOptions) -> Detection | None:
        """The pre-pass a request needs before its prompt can be built, or None."""

    def prompt(self, options: DecodeOptions, detected: str | None, num_audio_positions: int = 0) -> Prompt:
        """The prompt, given what the pre-pass detected (None without one); ``num_audio_positions`` as above."""

    def language(self, options: DecodeOptions, detected: str | None) -> str | None:
        """The language the request is reported in, as known when its prompt is built."""

    def output_language(self, language: str | None, token_ids: Sequence[int]) -> str | None:
        """The language a finished request is reported in, given ``language`` (``language()``'s) and its output
        tokens: a model that names the language in its output reads it there; the others return ``language``."""
