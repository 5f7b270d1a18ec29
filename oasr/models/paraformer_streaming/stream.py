"""Streams through the online Paraformer, as FunASR's ``generate(input=piece, cache=cache, is_final=...)``
decodes each: ``step_streams`` runs one step of many streams (their frontends on the host, the network batched),
``ParaformerStream`` is one stream fed pieces of any length, cut into ``chunk_samples`` steps (a remainder waits
for the next piece), each step's tokens handed back as they are decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from oasr.features.funasr_fbank import FunasrFbank
from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.models.paraformer_streaming.frontend import FbankWork, OnlineFrontend, lfr_features
from oasr.models.paraformer_streaming.state import StreamSlots

if TYPE_CHECKING:  # annotations only
    from oasr.models.paraformer_streaming.model import ParaformerStreaming

# A last step shorter than one LFR frame (60 ms) is not put through the frontend: FunASR re-encodes the previous
# step's overlap instead (``ParaformerStreaming.encode_chunk``'s ``tail``).
TAIL_SAMPLES = 960


@dataclass(frozen=True)
class StepRow:
    """One stream's step: its slot, its frontend, the step's samples (``chunk_samples`` unless ``final``)."""

    slot: int
    frontend: OnlineFrontend
    piece: np.ndarray
    final: bool

    @property
    def tail(self) -> bool:
        return self.final and len(self.piece) < TAIL_SAMPLES


@torch.inference_mode()
def step_streams(model: ParaformerStreaming, slots: StreamSlots, rows: list[StepRow]
                 ) -> list[tuple[list[int], list[int]]]:
    """One step of each row's stream -> per row, (the token ids it decided, the step frame each fired on).

    Rows of one shape (new frames, tail, final) share a forward: in a steady stream of steps that is all of
    them, the last steps of closing streams apart."""
    device = model.decoder.output_layer.weight.device
    works = []
    for row in rows:
        if not row.tail:
            row.frontend.push(row.piece)
        works.append(FbankWork(np.zeros(0, np.float32), 0, np.zeros((0, 1), np.int64)) if row.tail
                     else row.frontend.plan(row.final))
    features = lfr_features(rows[0].frontend.fbank, works, device) if rows else []
    groups: dict[tuple[int, bool, bool], list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault((len(features[index]), row.tail, row.final), []).append(index)
    out: list[tuple[list[int], list[int]]] = [([], []) for _ in rows]
    for (_, tail, final), indices in groups.items():
        members = [rows[i].slot for i in indices]
        batch = slots.gather(members)
        step = model.step_chunk(torch.stack([features[i] for i in indices]), batch, slots.chunk, tail=tail,
                                final=final)
        slots.scatter(members, batch)
        if step.logits is None:
            continue
        best = step.logits.argmax(dim=-1).tolist()
        for row, count, ids, places in zip(step.fired.rows, step.fired.counts, best, step.fired.places,
                                           strict=True):
            kept = [(t, f) for t, f in zip(ids[:count], places, strict=True) if t not in model.dropped_ids]
            out[indices[row]] = ([t for t, _ in kept], [f for _, f in kept])
    return out


class ParaformerStream:
    """``push(samples, final=...)`` -> the token ids decided by the steps those samples completed."""

    def __init__(self, model: ParaformerStreaming, fbank: FunasrFbank, chunk: ChunkConfig | None = None) -> None:
        self.model, self.chunk = model, chunk or model.chunk
        self.frontend = OnlineFrontend(fbank)
        self.slots = StreamSlots(model, self.chunk, 1)
        self.pending = np.zeros(0, dtype=np.float32)  # samples short of a whole step
        self.closed = False

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

    def step(self, piece: np.ndarray, final: bool) -> tuple[list[int], list[int]]:
        """One step's samples (``chunk_samples`` of them unless ``final``) -> (token ids, their fire frames)."""
        return step_streams(self.model, self.slots, [StepRow(0, self.frontend, piece, final)])[0]

    def reset_decoder(self) -> None:
        self.slots.reset_decoder([0])
