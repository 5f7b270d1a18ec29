"""The base every decode strategy registers under (what the engine reads of a strategy class), the encoder
output every strategy reads, and the size buckets of captured decode steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # annotations only: the server's API processes read these types without torch
    import torch


def power_of_two_bucket(value: int, smallest: int = 1) -> int:
    """The least power of two at or above ``value``, at least ``smallest``: the sizes captured decode steps are
    kept for, so a graph serves every batch up to its size."""
    return max(smallest, 1 << (value - 1).bit_length())


@dataclass
class EncoderOutput:
    """What a model's ``encode`` returns and a strategy reads. hidden: [B, T, D]; lengths: [B] valid frames of
    each row (int64, same device)."""

    hidden: torch.Tensor
    lengths: torch.Tensor


class DecodeStrategy:
    runner: ClassVar[str]  # the runner kind that drives it: "autoregressive" or "frame_sync"
    searches: ClassVar[bool] = False  # serves DecodeOptions.beam_size
    # Serves DecodeOptions' word-level fields (lm, lexicon, lm_weight, word_bonus, beam_size_token,
    # beam_threshold) through ``with_words``.
    fuses_lm: ClassVar[bool] = False
    biases: ClassVar[bool] = False  # serves DecodeOptions.hotwords (``for_beam(..., hotwords, contexts)``)
    # Its hotwords need no beam_size: the network biases its own output (SeACo-Paraformer's hotword path) instead of
    # a search steering towards them, so a request may give hotwords alone (``for_beam(1, hotwords, ...)``).
    biases_greedy: ClassVar[bool] = False
    widest_beam: ClassVar[int | None] = None  # the largest beam_size it serves (None: any)
    graph_capturable: ClassVar[bool] = False  # takes ``cuda_graphs=`` and replays captured steps
    decodes_graphs: ClassVar[bool] = False  # serves DecodeOptions.decoding_graph through ``for_graph``
    rescores: ClassVar[bool] = False  # serves DecodeOptions.rescore_weight through ``for_rescoring``

    @classmethod
    def for_beam(cls, beam_size: int, hotwords: tuple = (), contexts=None) -> DecodeStrategy:
        """A searching strategy for requests of ``beam_size`` (frame-synchronous runners build one per size)."""
        raise NotImplementedError(f"{cls.__name__} does not search")

    @staticmethod
    def with_words(resources, beam_size: int, lm_weight: float | None, word_bonus: float | None,
                   beam_size_token: int | None = None, beam_threshold: float | None = None):
        """A word-level search (``fuses_lm`` strategies) for requests that name a lexicon or language model."""
        raise NotImplementedError("this strategy has no word-level search")

    @classmethod
    def for_rescoring(cls, beam_size: int, weight: float) -> DecodeStrategy:
        """A search whose n-best an attention decoder reranks with ``weight`` (``rescores`` strategies)."""
        raise NotImplementedError(f"{cls.__name__} does not rescore")

    @classmethod
    def for_graph(cls, graph) -> DecodeStrategy:
        """A search over a decoding graph (``decodes_graphs`` strategies) for requests that name one (read)."""
        raise NotImplementedError(f"{cls.__name__} decodes over no graph")
