"""The online Paraformer's network and one stream's step, as FunASR's ``ParaformerStreaming.generate_chunk``
computes it (``SANMEncoderChunkOpt.forward_chunk``, ``CifPredictorV2.forward_chunk``,
``ParaformerSANMDecoder.forward_chunk``).

The modules are the offline Paraformer's (``oasr.models.paraformer``), whose names are the checkpoint's keys;
what streaming adds is state carried between steps (``StreamState``) and the order the pieces run in:

- encoder: a step's input is the last ``left + right`` embedded frames of the step before followed by the new
  chunk, positions counted over the whole stream; each layer attends over its cached keys and values (the
  chunk-sized part of each earlier step, at most ``encoder_chunk_look_back`` chunks) plus the step's own; the
  FSMN memory sees the step's frames only;
- CIF: weights outside ``[left, left + chunk)`` are zeroed (the look-ahead is weighed in the next step, unless
  this is the last), the integrate carried over as a frame of the running sum's weight, and on the last step a
  tail of ``tail_threshold`` fires a last partial token;
- decoder: runs only on steps that fired tokens; each FSMN memory continues over the tokens of earlier steps,
  the cross-attention reads the last ``decoder_chunk_look_back`` chunks of encoder frames plus the step's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from oasr.features.funasr_fbank import FunasrFbank
from oasr.models import ARCHITECTURES
from oasr.models.base import EncoderOutput
from oasr.models.capabilities import ModelCapabilities
from oasr.models.paraformer.decoder import CrossAttention, DecoderLayer
from oasr.models.paraformer.model import Paraformer
from oasr.models.paraformer.sanm import SANMAttention, SANMEncoderLayer, sinusoid
from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.models.paraformer_streaming.state import StreamState

if TYPE_CHECKING:  # annotations only
    from oasr.models.paraformer_streaming.stream import ParaformerStream


@ARCHITECTURES.register("paraformer_streaming")
class ParaformerStreaming(Paraformer):
    """The offline Paraformer's modules (and key names), run chunk by chunk.

    Streams go through the ``paraformer_chunked`` runtime (``oasr.streaming.paraformer_chunked``). A whole file
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
        each row walked chunk by chunk as a stream whose last chunk is final. FunASR cuts a stream by samples,
        so one that ends less than 60 ms past a whole chunk gets a tail step there (re-encoding the last
        overlap) where this walk encodes the last frames: the tokens can differ at that very end."""
        size = self.chunk.chunk_size[1]
        rows = []
        for row, length in zip(hidden, lengths.tolist(), strict=True):
            state, logits = StreamState(), []
            for start in range(0, max(length, 1), size):
                final = start + size >= length
                encoded = self.encode_chunk(row[None, start: min(start + size, length)], state, self.chunk,
                                            tail=False)
                embeds = self.fire_chunk(encoded, state, self.chunk, final=final)
                if embeds.shape[1]:
                    logits.append(self.decode_chunk(embeds, encoded, state, self.chunk)[0])
            rows.append(torch.cat(logits) if logits else hidden.new_zeros(0, self.config.vocab_size))
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

    def open_stream(self, fbank: FunasrFbank, chunk: ChunkConfig | None = None) -> ParaformerStream:
        """A new stream's decoder (its frontend, caches and pending samples), under ``chunk`` or the default."""
        from oasr.models.paraformer_streaming.stream import ParaformerStream  # it builds on this module

        return ParaformerStream(self, fbank, chunk)

    # -- encoder ------------------------------------------------------------------------------------------
    def encode_chunk(self, features: torch.Tensor, state: StreamState, chunk: ChunkConfig, *, tail: bool
                     ) -> torch.Tensor:
        """features: [1, K, D_in] the step's new LFR frames -> encoder frames [1, overlap + K, D].

        ``tail``: the stream ended less than one LFR frame after the last step; FunASR then re-encodes the
        previous step's overlap frames alone, scaled once more by sqrt(D) (its ``forward_chunk`` scales the
        cached frames in place before it reads them back). The first layer's pre-norm makes that scale all but
        irrelevant; it is kept so that the two compute the same thing."""
        scale = self.encoder.output_size ** 0.5
        if state.overlap is None:
            state.overlap = features.new_zeros(1, chunk.overlap_frames, features.shape[2])
        if tail:
            x = state.overlap * scale
        else:
            x = features * scale
            x = x + sinusoid(x.shape[1], x.shape[2], x.device, x.dtype, first=state.position + 1)
            state.position += features.shape[1]
            x = torch.cat([state.overlap, x], dim=1)
            state.overlap = x[:, -chunk.overlap_frames:]
        layers = (*self.encoder.encoders0, *self.encoder.encoders)
        if not state.encoder_kv:
            state.encoder_kv = [None] * len(layers)
        for index, layer in enumerate(layers):
            x, state.encoder_kv[index] = encoder_layer_chunk(layer, x, state.encoder_kv[index], chunk)
        return self.encoder.after_norm(x)

    # -- CIF ----------------------------------------------------------------------------------------------
    def fire_chunk(self, hidden: torch.Tensor, state: StreamState, chunk: ChunkConfig, *, final: bool,
                   with_frames: bool = False):
        """hidden: [1, T, D] the step's encoder frames -> the fired tokens' embeddings [1, L, D] (L may be 0);
        ``with_frames``: also the step frame each token fired on (counted from the step's first new frame, the
        overlap before it negative)."""
        c = self.config.predictor
        left, size, _ = chunk.chunk_size
        alphas = self.predictor.weights(hidden, torch.tensor([hidden.shape[1]], device=hidden.device))
        alphas[:, :left] = 0.0
        if not final:
            alphas[:, left + size:] = 0.0
        if state.cif_hidden is None:
            state.cif_hidden = hidden.new_zeros(1, 1, hidden.shape[2])
            state.cif_alpha = alphas.new_zeros(1, 1)
        hidden = torch.cat([state.cif_hidden.to(hidden.dtype), hidden], dim=1)
        alphas = torch.cat([state.cif_alpha, alphas], dim=1)
        if final:
            hidden = torch.cat([hidden, hidden.new_zeros(1, 1, hidden.shape[2])], dim=1)
            alphas = torch.cat([alphas, alphas.new_full((1, 1), c.tail_threshold)], dim=1)
        fired, places, integrate, frames = integrate_chunk(hidden[0], alphas[0], c.threshold)
        state.cif_alpha = integrate.reshape(1, 1)
        state.cif_hidden = (frames / integrate if integrate > 0 else frames).reshape(1, 1, -1)
        embeds = torch.stack(fired)[None] if fired else hidden.new_zeros(1, 0, hidden.shape[2])
        # Place 0 is the carried integrate, then the overlap frames, then the step's new ones.
        return (embeds, [p - 1 - chunk.overlap_frames for p in places]) if with_frames else embeds

    # -- decoder ------------------------------------------------------------------------------------------
    def decode_chunk(self, embeds: torch.Tensor, hidden: torch.Tensor, state: StreamState, chunk: ChunkConfig
                     ) -> torch.Tensor:
        """embeds: [1, L, D] fired embeddings; hidden: [1, T, D] the step's encoder frames -> logits [1, L, V]."""
        d = self.decoder
        # FunASR's forward_chunk runs the memory-only layers (decoders2) only when there are two or more.
        memory_only = list(d.decoders2) if d.decoders2 is not None and len(d.decoders2) > 1 else []
        layers = [*d.decoders, *memory_only]
        if not state.decoder_fsmn:
            state.decoder_fsmn = [None] * len(layers)
            state.decoder_kv = [None] * len(d.decoders)
        look_back = chunk.decoder_chunk_look_back * chunk.chunk_size[1]
        x = embeds
        for index, layer in enumerate(layers):
            x, state.decoder_fsmn[index], kv = decoder_layer_chunk(
                layer, x, hidden, state.decoder_fsmn[index],
                state.decoder_kv[index] if index < len(d.decoders) else None, look_back)
            if index < len(d.decoders):
                state.decoder_kv[index] = kv
        for layer in d.decoders3:
            x = layer.feed_forward(layer.norm1(x))
        return d.output_layer(d.after_norm(x))


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[1, T, H * dk] -> [1, H, T, dk]."""
    b, t, size = x.shape
    return x.reshape(b, t, heads, size // heads).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked attention as FunASR computes it (queries scaled first): [1, H, T, dk] -> [1, T, H * dk]."""
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-2, -1))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def encoder_layer_chunk(layer: SANMEncoderLayer, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None,
                        chunk: ChunkConfig) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    attn: SANMAttention = layer.self_attn
    q, k, v = attn.linear_q_k_v(layer.norm1(x)).chunk(3, dim=-1)
    memory = attn.fsmn(v, torch.ones_like(v[:, :, :1]))
    q, k_h, v_h = (split_heads(t, attn.heads) for t in (q, k, v))
    # The chunk-sized part of this step's keys (without the look-ahead) joins the cache for later steps.
    keep = k_h.shape[2] - chunk.chunk_size[2]
    stride = (k_h[:, :, :keep], v_h[:, :, :keep])
    if kv is not None:
        k_h, v_h = torch.cat([kv[0], k_h], dim=2), torch.cat([kv[1], v_h], dim=2)
        limit = chunk.encoder_chunk_look_back * chunk.chunk_size[1]
        stride = (torch.cat([kv[0], stride[0]], dim=2)[:, :, -limit:],
                  torch.cat([kv[1], stride[1]], dim=2)[:, :, -limit:])
    attended = attn.linear_out(attend(q, k_h, v_h)) + memory
    x = x + attended if layer.residual else attended
    return x + layer.feed_forward(layer.norm2(x)), stride


def integrate_chunk(hidden: torch.Tensor, alphas: torch.Tensor, threshold: float
                    ) -> tuple[list[torch.Tensor], list[int], torch.Tensor, torch.Tensor]:
    """FunASR's frame-by-frame CIF loop (float32, its order of additions): hidden [T, D], alphas [T] ->
    (each fired token's embedding [D], the place it fired at, the integrate left over, the frames in it [D])."""
    integrate = torch.zeros((), dtype=alphas.dtype, device=alphas.device)
    frames = hidden.new_zeros(hidden.shape[1])
    fired, places = [], []
    for t in range(alphas.shape[0]):
        alpha = alphas[t]
        if alpha + integrate < threshold:
            integrate = integrate + alpha
            frames = frames + alpha * hidden[t]
        else:
            fired.append(frames + (threshold - integrate) * hidden[t])
            places.append(t)
            integrate = integrate + alpha - threshold
            frames = integrate * hidden[t]
    return fired, places, integrate, frames


def decoder_layer_chunk(layer: DecoderLayer, x: torch.Tensor, hidden: torch.Tensor, fsmn: torch.Tensor | None,
                        kv: tuple[torch.Tensor, torch.Tensor] | None, look_back: int):
    """One decoder layer over a step's tokens -> (x, its FSMN context, its cross-attention keys and values)."""
    residual = x
    x = layer.feed_forward(layer.norm1(x))
    if layer.self_attn is not None:
        inputs = layer.norm2(x)
        memory = layer.self_attn
        seq = inputs.transpose(1, 2)
        if fsmn is None:
            seq = nn.functional.pad(seq, memory.padding)
        else:
            width = memory.fsmn_block.kernel_size[0] + inputs.shape[1] - 1
            seq = torch.cat([fsmn[:, :, 1:], seq], dim=2)[:, :, -width:]
        fsmn = seq
        x = residual + (memory.fsmn_block(seq).transpose(1, 2) + inputs)
    if layer.src_attn is not None:
        cross: CrossAttention = layer.src_attn
        q = split_heads(cross.linear_q(layer.norm3(x)), cross.heads)
        k, v = (split_heads(t, cross.heads) for t in cross.linear_k_v(hidden).chunk(2, dim=-1))
        if kv is not None:
            k, v = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)
        kv = (k[:, :, -look_back:], v[:, :, -look_back:])
        x = x + cross.linear_out(attend(q, k, v))
    return x, fsmn, kv
