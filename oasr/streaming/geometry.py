"""What a streaming encoder declares to the engine: its chunk geometry and the per-stream state it carries.

Plain data, no tensors: the scheduler plans chunks from ``StreamGeometry`` and the state pool allocates one row
of every ``StateField`` per stream slot. Nothing here is specific to one architecture; the encoder fills them
in from its own configuration (``oasr.models.nemotron_streaming.stream``).
"""

from __future__ import annotations

from dataclasses import dataclass

from oasr.errors import OASRError

# How a stream's last chunk, cut short by the end of its audio, is encoded and decoded (``StreamGeometry.tail``):
# - "pad": the chunk is zero-padded to its full length and every encoder frame of it is decoded, as transformers'
#   streaming ``generate`` does (the default, and the behaviour of a transformers-format checkpoint);
# - "mask": as NeMo's cache-aware streaming loop (``CacheAwareStreamingAudioBuffer`` feeding
#   ``conformer_stream_step``): the encoder is handed the chunk's real length, so its attention sees none of the
#   padding, and only the encoder frames that length yields are decoded (``StreamGeometry.tail_frames``).
TAIL_RULES = ("pad", "mask")


@dataclass(frozen=True)
class StateField:
    """One tensor of per-stream state: ``shape`` is one stream's (the pool adds the slot axis in front).

    ``ring``: the field is the stream's latest frames, [layers, ..., frames, width], read and appended in place a
    layer at a time (``oasr.streaming.state_pool.RingRows``) instead of gathered and scattered whole.
    """

    name: str
    shape: tuple[int, ...]
    ring: bool = False

    def __post_init__(self) -> None:
        if not self.name or any(n < 0 for n in self.shape):
            raise ValueError(f"bad state field {self.name!r} {self.shape}")
        if self.ring and (len(self.shape) < 3 or 0 in self.shape):
            raise ValueError(f"ring field {self.name!r} needs [layers, ..., frames, width], got {self.shape}")


@dataclass(frozen=True)
class StreamGeometry:
    """How a cache-aware encoder consumes a stream, for one lookahead.

    Every chunk yields ``chunk_frames`` encoder frames. The first chunk needs ``first_feature_frames`` feature
    frames, every later one ``feature_frames``; the encoder is handed ``feature_frames`` for the first chunk too,
    the missing ones zero in front (``first_padding_frames``), so every step has one shape.
    """

    lookahead: int  # right context in encoder frames: a frame is final once this many frames follow it
    chunk_frames: int  # encoder frames per chunk (lookahead + 1)
    first_feature_frames: int
    feature_frames: int
    past_frames: int  # encoder frames of attention context each stream keeps (its cache length)
    visible_past_frames: int  # of those, how many a chunk's queries may see (whole chunks of left context)
    frame_seconds: float  # audio time of one encoder frame
    state: tuple[StateField, ...] = ()
    tail: str = "pad"  # one of TAIL_RULES: how the last, short chunk of a stream is encoded and decoded

    def __post_init__(self) -> None:
        if self.lookahead < 0 or self.chunk_frames != self.lookahead + 1:
            raise ValueError(f"chunk of {self.chunk_frames} frames does not fit lookahead {self.lookahead}")
        if not 0 < self.first_feature_frames <= self.feature_frames:
            raise ValueError("the first chunk must need between 1 and feature_frames feature frames")
        if not 0 <= self.visible_past_frames <= self.past_frames:
            raise ValueError("visible_past_frames must lie within past_frames")
        if self.tail not in TAIL_RULES:
            raise ValueError(f"unknown stream tail rule {self.tail!r}; known: {', '.join(TAIL_RULES)}")

    @property
    def first_padding_frames(self) -> int:
        return self.feature_frames - self.first_feature_frames

    @property
    def chunk_seconds(self) -> float:
        return self.chunk_frames * self.frame_seconds

    def chunk_range(self, index: int) -> tuple[int, int]:
        """Feature frames [start, end) of a stream's chunk ``index``: the first chunk's from frame 0, each later
        one's right after the one before."""
        if index == 0:
            return 0, self.first_feature_frames
        start = self.first_feature_frames + (index - 1) * self.feature_frames
        return start, start + self.feature_frames

    def tail_frames(self, first: bool, num_features: int) -> int:
        """Encoder frames to decode of a stream's last chunk, which holds ``num_features`` feature frames of audio
        (``first``: the chunk is the stream's first; its zero lead not counted) and zeros after them.

        "pad" decodes the whole chunk. "mask" decodes what NeMo's loop does: its buffer holds the frontend's whole
        output, one frame more than the audio's real frames (the frame centred past the last sample, zeroed by
        the frontend's length mask as the padding is here); a later chunk with fewer than ``subsampling`` of those
        is dropped (``get_sampling_frames``); otherwise the encoder's length is the causal subsampling's output
        length of the chunk behind its pre-encode cache (``subsampling + 1`` feature frames, none for the first
        chunk), less the frames the cache makes (``drop_extra_pre_encoded``).
        """
        if self.tail == "pad":
            return self.chunk_frames
        subsampling = self.feature_frames // self.chunk_frames
        num_buffered = min(num_features + 1, self.first_feature_frames if first else self.feature_frames)
        if first:
            return min(self.chunk_frames, _subsampled_length(num_buffered, subsampling))
        if num_buffered < subsampling:
            return 0
        cache = subsampling + 1
        num_frames = _subsampled_length(cache + num_buffered, subsampling) - _subsampled_length(cache, subsampling)
        return min(self.chunk_frames, num_frames)

    def visible_past(self, num_chunks_done: int) -> int:
        """Encoder frames of a stream's past its next chunk may attend to, after ``num_chunks_done`` chunks."""
        return min(self.visible_past_frames, num_chunks_done * self.chunk_frames)


def _subsampled_length(num_frames: int, subsampling: int) -> int:
    """Output frames of NeMo's causal ``dw_striding`` subsampling for ``num_frames`` input frames: log2(subsampling)
    convolutions of kernel 3 and stride 2, each padded by 2 frames before and 1 after (NeMo's ``calc_length``)."""
    for _ in range(subsampling.bit_length() - 1):
        num_frames = num_frames // 2 + 1
    return num_frames


def lookahead_for(chunk_ms: int, frame_seconds: float) -> int:
    """The lookahead whose chunks last ``chunk_ms``; refuses a length that is not whole encoder frames."""
    frame_ms = round(frame_seconds * 1000)
    if chunk_ms % frame_ms or chunk_ms < frame_ms:
        raise OASRError(f"a chunk of {chunk_ms} ms is not a whole number of {frame_ms} ms encoder frames")
    return chunk_ms // frame_ms - 1
