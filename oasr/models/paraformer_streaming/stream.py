"""One stream through the online Paraformer, as FunASR's ``generate(input=piece, cache=cache, is_final=...)``
decodes it: pieces of any length are cut into ``chunk_samples`` steps (a remainder waits for the next piece),
each step's tokens handed back as they are decided.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from oasr.features.funasr_fbank import FunasrFbank
from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.models.paraformer_streaming.frontend import OnlineFrontend
from oasr.models.paraformer_streaming.state import StreamState

if TYPE_CHECKING:  # annotations only
    from oasr.models.paraformer_streaming.model import ParaformerStreaming

# A last step shorter than one LFR frame (60 ms) is not put through the frontend: FunASR re-encodes the previous
# step's overlap instead (``ParaformerStreaming.encode_chunk``'s ``tail``).
TAIL_SAMPLES = 960


class ParaformerStream:
    """``push(samples, final=...)`` -> the token ids decided by the steps those samples completed."""

    def __init__(self, model: ParaformerStreaming, fbank: FunasrFbank, chunk: ChunkConfig | None = None) -> None:
        self.model, self.chunk = model, chunk or model.chunk
        self.frontend = OnlineFrontend(fbank)
        self.state = StreamState()
        self.pending = np.zeros(0, dtype=np.float32)  # samples short of a whole step
        self.closed = False

    @torch.inference_mode()
    def push(self, audio: np.ndarray, *, final: bool = False) -> list[int]:
        return [t for ids, _ in self.push_steps(audio, final=final) for t in ids]

    def push_steps(self, audio: np.ndarray, *, final: bool = False) -> list[tuple[list[int], list[int]]]:
        """Like ``push``, step by step: each step's (token ids, the frames of the step they fired on)."""
        if self.closed:
            raise ValueError("audio pushed after the stream's final piece")
        audio = np.concatenate([self.pending, np.asarray(audio, dtype=np.float32)])
        size = self.chunk.chunk_samples
        num_steps = len(audio) // size + int(final)
        steps = [self.step(audio[i * size: (i + 1) * size], final and i == num_steps - 1) for i in range(num_steps)]
        self.pending = audio[num_steps * size:] if not final else np.zeros(0, dtype=np.float32)
        self.closed = final
        return steps

    @torch.inference_mode()
    def step(self, piece: np.ndarray, final: bool) -> tuple[list[int], list[int]]:
        """One step's samples (``chunk_samples`` of them unless ``final``) -> (token ids, their fire frames)."""
        model = self.model
        device = model.decoder.output_layer.weight.device
        tail = final and len(piece) < TAIL_SAMPLES
        if tail:
            features = torch.zeros(1, 0, model.config.encoder.input_size, device=device)
        else:
            self.frontend.push(piece)
            features = self.frontend.take(final, device)
        dtype = model.decoder.output_layer.weight.dtype
        hidden = model.encode_chunk(features.to(dtype), self.state, self.chunk, tail=tail)
        embeds, frames = model.fire_chunk(hidden, self.state, self.chunk, final=final, with_frames=True)
        if embeds.shape[1] == 0:
            return [], []
        logits = model.decode_chunk(embeds.to(dtype), hidden, self.state, self.chunk)
        kept = [(t, f) for t, f in zip(logits[0].argmax(dim=-1).tolist(), frames) if t not in model.dropped_ids]
        return [t for t, _ in kept], [f for _, f in kept]
