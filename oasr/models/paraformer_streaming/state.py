"""What streaming Paraformer streams carry from one step to the next, in slots (its own module: the model's steps
and the stream drivers both read it).

``StreamSlots`` holds every stream's tensors in a ``StreamStatePool`` ([num_slots, ...] each, allocated once) and
the counts that say how much of them is real on the host, so a step never waits on the device to plan. A step
gathers its rows into a ``StreamBatch``, the model updates that in place, and the step scatters it back.

The look-back caches have a fixed width (``encoder_chunk_look_back`` chunks of keys and values, and the decoder's
``decoder_chunk_look_back`` chunks of frames); a stream fills its cache from the right, so a stream still in its
first chunks holds its keys in the last ``encoder_lengths`` columns and the ones before them are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.streaming.geometry import StateField
from oasr.streaming.state_pool import StreamStatePool


@dataclass
class StreamBatch:
    """The carried state of a step's B rows (copies of their slots'), updated by the model's step.

    Shapes: overlap [B, left + right, D_in]; encoder_kv [B, layers, 2, H, look-back frames, dk];
    cif_hidden [B, D] and cif_alpha [B] (float32); decoder_fsmn [B, memory layers, D, kernel - 1];
    decoder_kv [B, cross layers, 2, H, decoder look-back frames, dk]. The counts are host arrays of B."""

    index: torch.Tensor  # [B] the rows' slots, on the device
    overlap: torch.Tensor
    positions: np.ndarray  # frames embedded so far (the next chunk's first position)
    encoder_kv: torch.Tensor
    encoder_lengths: np.ndarray  # cached key frames that are real (the last ones of the look-back)
    cif_hidden: torch.Tensor
    cif_alpha: torch.Tensor
    decoder_fsmn: torch.Tensor
    decoder_started: np.ndarray  # bool: the decoder has run since the utterance began (its memory is real)
    decoder_kv: torch.Tensor
    decoder_lengths: np.ndarray


class StreamSlots:
    """Every stream's carried state under one chunking, one slot per stream."""

    def __init__(self, model, chunk: ChunkConfig, num_slots: int) -> None:
        c = model.config
        d = model.decoder
        encoder_layers = len(model.encoder.encoders0) + len(model.encoder.encoders)
        heads, size = c.encoder.attention_heads, model.encoder.output_size
        memory = decode_layers(model)
        kernel = memory[0].self_attn.fsmn_block.kernel_size[0] if memory else 1
        weight = d.output_layer.weight
        self.chunk = chunk
        self.encoder_width = chunk.encoder_chunk_look_back * chunk.chunk_size[1]
        self.decoder_width = chunk.decoder_chunk_look_back * chunk.chunk_size[1]
        cross_heads = d.decoders[0].src_attn.heads if len(d.decoders) else 1
        self.pool = StreamStatePool((
            StateField("overlap", (chunk.overlap_frames, c.encoder.input_size)),
            StateField("encoder_kv", (encoder_layers, 2, heads, self.encoder_width, size // heads)),
            StateField("decoder_fsmn", (len(memory), size, kernel - 1)),
            StateField("decoder_kv", (len(d.decoders), 2, cross_heads, self.decoder_width, size // cross_heads)),
        ), num_slots, weight.device, d.output_layer.compute_dtype)  # not the weight's: it may be held quantized
        # The CIF's carried weight and frames stay in float32, as the loop that makes them runs.
        self.cif = StreamStatePool((StateField("cif_hidden", (size,)), StateField("cif_alpha", ())), num_slots,
                                   weight.device, torch.float32)
        self.device = weight.device
        self.positions = np.zeros(num_slots, dtype=np.int64)
        self.encoder_lengths = np.zeros(num_slots, dtype=np.int64)
        self.decoder_started = np.zeros(num_slots, dtype=bool)
        self.decoder_lengths = np.zeros(num_slots, dtype=np.int64)

    def open(self, slots: list[int]) -> None:
        """New streams take ``slots``: everything they carry starts from zero."""
        index = self._index(slots)
        self.pool.clear(index)
        self.cif.clear(index)
        self.positions[slots] = 0
        self.encoder_lengths[slots] = 0
        self.reset_decoder(slots)

    def reset_decoder(self, slots: list[int]) -> None:
        """A new utterance: the decoder's memory of earlier tokens and frames goes (masked out from now on)."""
        self.decoder_started[slots] = False
        self.decoder_lengths[slots] = 0

    def gather(self, slots: list[int]) -> StreamBatch:
        index = self._index(slots)
        rows, cif = self.pool.gather(index), self.cif.gather(index)
        return StreamBatch(index, rows["overlap"], self.positions[slots].copy(), rows["encoder_kv"],
                           self.encoder_lengths[slots].copy(), cif["cif_hidden"], cif["cif_alpha"],
                           rows["decoder_fsmn"], self.decoder_started[slots].copy(), rows["decoder_kv"],
                           self.decoder_lengths[slots].copy())

    def scatter(self, slots: list[int], batch: StreamBatch) -> None:
        self.pool.scatter(batch.index, {"overlap": batch.overlap, "encoder_kv": batch.encoder_kv,
                                        "decoder_fsmn": batch.decoder_fsmn, "decoder_kv": batch.decoder_kv})
        self.cif.scatter(batch.index, {"cif_hidden": batch.cif_hidden, "cif_alpha": batch.cif_alpha})
        self.positions[slots] = batch.positions
        self.encoder_lengths[slots] = batch.encoder_lengths
        self.decoder_started[slots] = batch.decoder_started
        self.decoder_lengths[slots] = batch.decoder_lengths

    def _index(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long, device=self.device)


def decode_layers(model) -> list:
    """The decoder layers a chunk runs with their FSMN memory: FunASR's ``forward_chunk`` runs the memory-only
    layers (``decoders2``) only when there are two or more."""
    d = model.decoder
    memory_only = list(d.decoders2) if d.decoders2 is not None and len(d.decoders2) > 1 else []
    return [*d.decoders, *memory_only]
