"""The online Paraformer's network and a step of many streams, each row as FunASR's
``ParaformerStreaming.generate_chunk`` computes it for one stream (``SANMEncoderChunkOpt.forward_chunk``,
``CifPredictorV2.forward_chunk``, ``ParaformerSANMDecoder.forward_chunk``).

The modules are the offline Paraformer's (``oasr.models.paraformer``), whose names are the checkpoint's keys;
what streaming adds is state carried between steps (``StreamBatch``, from the streams' slots) and the order the
pieces run in:

- encoder: a step's input is the last ``left + right`` embedded frames of the step before followed by the new
  chunk, positions counted over the whole stream; each layer attends over its cached keys and values (the
  chunk-sized part of each earlier step, at most ``encoder_chunk_look_back`` chunks) plus the step's own; the
  FSMN memory sees the step's frames only;
- CIF: weights outside ``[left, left + chunk)`` are zeroed (the look-ahead is weighed in the next step, unless
  this is the last), the integrate carried over as a frame of the running sum's weight, and on the last step a
  tail of ``tail_threshold`` fires a last partial token;
- decoder: runs only on the rows that fired tokens; each FSMN memory continues over the tokens of earlier
  steps, the cross-attention reads the last ``decoder_chunk_look_back`` chunks of encoder frames plus the step's.

A step's rows share its shape (the same number of new frames, all final or none): one encoder forward, one CIF
loop and one decoder forward serve them all. Rows whose caches are still filling (a stream's first chunks, a
decoder after an endpoint) are masked where the others have real keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.paraformer.model import Paraformer
from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.models.paraformer_streaming.layers import (
    cif_weights,
    decoder_layer_chunk,
    encoder_layer_chunk,
    integrate_rows,
    key_mask,
    sinusoid_rows,
)
from oasr.models.paraformer_streaming.state import StreamBatch, StreamSlots, decode_layers


@dataclass(frozen=True)
class Fired:
    """The CIF's tokens of a step: embeds [F, L, D] (float32, zero past each row's count) for the F rows that
    fired (``rows``: their batch rows, ascending), ``counts`` tokens each, fired at ``places`` (per row, the
    step frame of each token, counted from the first new frame, the overlap before it negative)."""

    embeds: torch.Tensor
    rows: list[int]
    counts: list[int]
    places: list[list[int]]


@dataclass(frozen=True)
class ChunkLogits:
    """A step's decoded tokens: logits [F, L, vocab] for the rows that fired (``fired``), real up to
    ``fired.counts``; ``logits`` is None when none fired."""

    logits: torch.Tensor | None
    fired: Fired


@ARCHITECTURES.register("paraformer_streaming")
class ParaformerStreaming(Paraformer):
    """The offline Paraformer's modules (and key names), run chunk by chunk.

    Streams go through the ``paraformer_chunked`` runtime (``oasr.models.paraformer_streaming.runtime``). A whole file
    decoded offline takes the same walk over its features (``cif_logits``): FunASR's model has no other
    inference, and its full-context encoder pass is not what the chunked checkpoint was trained for."""

    capabilities = ModelCapabilities(runner="frame_sync", decode_strategies=("cif_greedy",),
                                     streaming="paraformer_chunked", writes_punctuation=False)
    chunk = ChunkConfig()  # FunASR's example setting; a stream may be opened with another

    def encode(self, features: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """The LFR frames themselves: the encoder runs chunk by chunk inside ``cif_logits``, where the chunks'
        caches live."""
        return EncoderOutput(features, lengths.to(features.device))

    def cif_logits(self, hidden: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features: [B, T, input_size] whole inputs; lengths: [B] -> (logits [B, L, vocab], token counts [B]):
        each row walked chunk by chunk as a stream whose last chunk is final, the rows' chunks stepped together.
        FunASR cuts a stream by samples, so one that ends less than 60 ms past a whole chunk gets a tail step
        there (re-encoding the last overlap) where this walk encodes the last frames: the tokens can differ at
        that very end."""
        size = self.chunk.chunk_size[1]
        lengths_ = lengths.tolist()
        slots = StreamSlots(self, self.chunk, len(lengths_))
        pieces: list[list[torch.Tensor]] = [[] for _ in lengths_]
        for start in range(0, max([*lengths_, 1]), size):
            shapes: dict[tuple[int, bool], list[int]] = {}  # (new frames, final) -> the rows
            for row, length in enumerate(lengths_):
                if start < max(length, 1):
                    shapes.setdefault((min(start + size, length) - start, start + size >= length), []).append(row)
            for (num_frames, final), members in shapes.items():
                batch = slots.gather(members)
                out = self.step_chunk(hidden[members, start: start + num_frames], batch, self.chunk, tail=False,
                                      final=final)
                slots.scatter(members, batch)
                for row, count in zip(out.fired.rows, out.fired.counts, strict=True):
                    pieces[members[row]].append(out.logits[row, :count])
        rows = [torch.cat(p) if p else hidden.new_zeros(0, self.config.vocab_size) for p in pieces]
        counts = torch.tensor([len(r) for r in rows], device=hidden.device)
        return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True), counts

    def stream_chunk(self, frames: int) -> ChunkConfig:
        """The chunking of a stream cut every ``frames`` LFR frames: half a chunk of look-ahead and the default's
        look-back, as FunASR's examples pair them ([0, 10, 5], [0, 8, 4])."""
        if frames < 2:
            raise ValueError(f"a chunk of {frames} LFR frame has no look-ahead; the streaming Paraformer needs "
                             f"at least 2 (FunASR's chunk_size [0, 10, 5] is 10)")
        return ChunkConfig((0, frames, frames // 2), self.chunk.encoder_chunk_look_back,
                           self.chunk.decoder_chunk_look_back)


    # -- a step -------------------------------------------------------------------------------------------
    def step_chunk(self, features: torch.Tensor, batch: StreamBatch, chunk: ChunkConfig, *, tail: bool,
                   final: bool) -> ChunkLogits:
        """features: [B, K, D_in] each row's new LFR frames (K = 0 for a ``tail`` step) -> the fired rows'
        logits; ``batch`` is updated to the state after the step."""
        dtype = self.decoder.output_layer.compute_dtype  # the weight may be held quantized
        hidden = self.encode_chunk(features.to(dtype), batch, chunk, tail=tail)
        fired = self.fire_chunk(hidden, batch, chunk, final=final)
        if not fired.rows:
            return ChunkLogits(None, fired)
        rows = torch.tensor(fired.rows, device=hidden.device)
        return ChunkLogits(self.decode_chunk(fired, hidden.index_select(0, rows), batch, chunk), fired)

    # -- encoder ------------------------------------------------------------------------------------------
    def encode_chunk(self, features: torch.Tensor, batch: StreamBatch, chunk: ChunkConfig, *, tail: bool
                     ) -> torch.Tensor:
        """features: [B, K, D_in] the step's new LFR frames -> encoder frames [B, overlap + K, D].

        ``tail``: the stream ended less than one LFR frame after the last step; FunASR then re-encodes the
        previous step's overlap frames alone, scaled once more by sqrt(D) (its ``forward_chunk`` scales the
        cached frames in place before it reads them back). The first layer's pre-norm makes that scale all but
        irrelevant; it is kept so that the two compute the same thing."""
        scale = self.encoder.output_size ** 0.5
        if tail:
            x = batch.overlap * scale
        else:
            x = features * scale
            x = x + sinusoid_rows(batch.positions + 1, x.shape[1], x.shape[2], x.device, x.dtype)
            batch.positions = batch.positions + features.shape[1]
            x = torch.cat([batch.overlap, x], dim=1)
            batch.overlap = x[:, -chunk.overlap_frames:]
        width = batch.encoder_kv.shape[-2]
        cached = int(batch.encoder_lengths.max())
        cache = batch.encoder_kv[..., width - cached:, :] if cached else None
        mask = key_mask(batch.encoder_lengths, cached, x.shape[1], x.device)
        # The chunk-sized part of this step's keys (without the look-ahead) joins the cache for later steps.
        keep = x.shape[1] - chunk.chunk_size[2]
        strides = []
        for index, layer in enumerate((*self.encoder.encoders0, *self.encoder.encoders)):
            kv = (cache[:, index, 0], cache[:, index, 1]) if cache is not None else None
            x, stride = encoder_layer_chunk(layer, x, kv, mask, keep, width)
            strides.append(torch.stack(stride, dim=1))
        kept = strides[0].shape[-2]
        batch.encoder_kv[..., width - kept:, :] = torch.stack(strides, dim=1)
        batch.encoder_lengths = np.minimum(batch.encoder_lengths + keep, width)
        return self.encoder.after_norm(x)

    # -- CIF ----------------------------------------------------------------------------------------------
    def fire_chunk(self, hidden: torch.Tensor, batch: StreamBatch, chunk: ChunkConfig, *, final: bool) -> Fired:
        """hidden: [B, T, D] the step's encoder frames -> the tokens the rows fired (waits for the device: which
        rows fired decides the decoder's batch)."""
        c = self.config.predictor
        left, size, _ = chunk.chunk_size
        num_rows, _, depth = hidden.shape
        alphas = cif_weights(self.predictor, hidden)
        alphas[:, :left] = 0.0
        if not final:
            alphas[:, left + size:] = 0.0
        frames = torch.cat([batch.cif_hidden[:, None], hidden.float()], dim=1)
        alphas = torch.cat([batch.cif_alpha[:, None], alphas], dim=1)
        if final:
            frames = torch.cat([frames, frames.new_zeros(num_rows, 1, depth)], dim=1)
            alphas = torch.cat([alphas, alphas.new_full((num_rows, 1), c.tail_threshold)], dim=1)
        fires, embeds, integrate, rest = integrate_rows(frames, alphas, c.threshold)
        batch.cif_alpha = integrate
        batch.cif_hidden = torch.where(integrate[:, None] > 0, rest / integrate[:, None], rest)
        fired = fires.cpu().numpy()
        rows = [int(r) for r in np.flatnonzero(fired.any(axis=1))]
        places = [[int(t) for t in np.flatnonzero(fired[r])] for r in rows]
        counts = [len(p) for p in places]
        if not rows:
            return Fired(embeds.new_zeros(0, 0, depth), [], [], [])
        longest = max(counts)
        device = hidden.device
        at = torch.tensor([p + [p[-1]] * (longest - len(p)) for p in places], device=device)
        picked = embeds[torch.tensor(rows, device=device)[:, None], at]  # [F, L, D]
        real = torch.arange(longest, device=device)[None, :] < torch.tensor(counts, device=device)[:, None]
        # Place 0 is the carried integrate, then the overlap frames, then the step's new ones.
        shift = 1 + chunk.overlap_frames
        return Fired(picked * real[:, :, None], rows, counts, [[t - shift for t in p] for p in places])

    # -- decoder ------------------------------------------------------------------------------------------
    def decode_chunk(self, fired: Fired, hidden: torch.Tensor, batch: StreamBatch, chunk: ChunkConfig
                     ) -> torch.Tensor:
        """The rows that fired: hidden [F, T, D] their encoder frames -> logits [F, L, V]."""
        d = self.decoder
        device = hidden.device
        rows = torch.tensor(fired.rows, device=device)
        counts = torch.tensor(fired.counts, device=device)
        started = torch.tensor(batch.decoder_started[fired.rows], device=device)
        # A decoder that has not run since its utterance began reads zeros, not the slot's stale memory.
        memory = batch.decoder_fsmn.index_select(0, rows) * started[:, None, None, None]
        width = batch.decoder_kv.shape[-2]
        lengths = batch.decoder_lengths[fired.rows]
        cached = int(lengths.max())
        cache = batch.decoder_kv.index_select(0, rows)[..., width - cached:, :] if cached else None
        mask = key_mask(lengths, cached, hidden.shape[1], device)
        x = fired.embeds.to(hidden.dtype)
        tokens = (torch.arange(x.shape[1], device=device)[None, :] < counts[:, None])[:, :, None].to(x.dtype)
        layers = decode_layers(self)
        memories, kvs = [], []
        for index, layer in enumerate(layers):
            kv = (cache[:, index, 0], cache[:, index, 1]) if cache is not None and index < len(d.decoders) else None
            x, state, kv = decoder_layer_chunk(layer, x, tokens, counts, started, memory[:, index], hidden, kv,
                                               mask, width)
            memories.append(state)
            if kv is not None:
                kvs.append(torch.stack(kv, dim=1))
        for layer in d.decoders3:
            x = layer.feed_forward(layer.norm1(x))
        batch.decoder_fsmn[rows] = torch.stack(memories, dim=1)
        if kvs:
            kept = kvs[0].shape[-2]
            batch.decoder_kv[..., width - kept:, :][rows] = torch.stack(kvs, dim=1)
        batch.decoder_lengths[fired.rows] = np.minimum(lengths + hidden.shape[1], width)
        batch.decoder_started[fired.rows] = True
        return d.output_layer(d.after_norm(x))
