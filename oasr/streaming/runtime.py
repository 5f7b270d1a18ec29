"""What a streaming runtime provides (``STREAMING_RUNTIMES`` checks every entry against it when it registers).

The engine above (``oasr.engine.streams``) plans steps without tensors and hands a runtime each step's chunks; the
runtime holds the streams' state in slots and runs the model. Without torch, so the package's registry can name
it in a process that never loads a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only
    import numpy as np

    from oasr.streaming.audio import StreamAudio
    from oasr.streaming.geometry import StreamGeometry
    from oasr.streaming.scheduler import ChunkBatch


@runtime_checkable
class StreamingRuntime(Protocol):
    """Built as ``runtime(loaded, num_slots, cuda_graphs=...)``; one slot per stream, the slots' state on the
    model's device; ``cuda_graphs`` allows (does not require) replaying each step shape's forward on CUDA."""

    default_lookahead: int  # encoder frames of right context when a stream asks for none
    sample_rate: int  # of the samples ``step`` is handed
    frame_seconds: float  # audio time of one encoder frame

    def warm_up(self, lookahead: int, max_rows: int) -> None:
        """Runs a step at every batch size up to ``max_rows`` before any stream, so none pays for a first use."""

    def geometry(self, lookahead: int) -> StreamGeometry:
        """The chunking of a stream with ``lookahead``; ``ValueError`` for one the model cannot serve."""

    def new_audio(self) -> StreamAudio:
        """An empty buffer for a new stream's samples, cut into chunk windows as this runtime reads them."""

    def open(self, slot: int) -> None:
        """A new stream takes ``slot``: its state starts from nothing."""

    def reset_decoder(self, slots: list[int]) -> None:
        """These streams' decoders start a new utterance (an endpoint); their encoder state goes on."""

    def step(self, batch: ChunkBatch, windows: list[np.ndarray]) -> object:
        """One chunk of every row of ``batch`` (``windows``: each row's samples) -> the rows' new tokens."""
