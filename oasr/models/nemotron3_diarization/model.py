"""Nemotron 3 Diarization (transformers' ``Nemotron3DiarizationForAudioFrameClassification``): per 10 ms mel
frame, the probability that each of up to ``num_speakers`` speakers talks, speakers numbered in order of arrival.

Audio runs chunk by chunk: each step encodes the speaker cache, the FIFO and the chunk with its context
(``speaker_cache``), the head scores every frame of the step, and the chunk's scores are the output. Whole files
(``diarize``) are cut into ``chunk_length`` frames with ``chunk_left_context`` / ``chunk_right_context`` around
them and a FIFO of ``fifo_length``, all rows of a batch stepping together; streams (``stream_step``) bring one
chunk per step with the look-ahead of their latency mode and the streaming FIFO.

A row's result never depends on its batch: a shorter row's padding is masked from attention, zeroed before the
upsampler's convolution, and only enters the cache after the row's last frame.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from oasr.layers import Linear, ReLU
from oasr.models import DIARIZATION_ARCHITECTURES
from oasr.models.nemotron3_diarization.convert import is_diarization_checkpoint, read_checkpoint
from oasr.models.nemotron3_diarization.config import Nemotron3DiarizationConfig, tiny_config
from oasr.models.nemotron3_diarization.encoder import DiarizationBackbone
from oasr.models.nemotron3_diarization.speaker_cache import CachePolicy, CacheState, push
from oasr.streaming.geometry import StateField


class ClassificationHead(nn.Module):
    def __init__(self, hidden: int, num_speakers: int) -> None:
        super().__init__()
        self.act = ReLU()
        self.dense = Linear(hidden, hidden)
        self.out_proj = Linear(hidden, num_speakers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj.after(self.act, self.dense.after(self.act, x))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@DIARIZATION_ARCHITECTURES.register("nemotron3_diarization")
class Nemotron3Diarization(nn.Module):
    config_class: ClassVar[type] = Nemotron3DiarizationConfig
    feature_extractor = "nemotron_logmel"
    streaming = "speaker_cache"  # the runtime in oasr.streaming that serves its streams
    # How the diarization loader tells and reads this family's checkpoints (transformers' layout).
    recognizes = staticmethod(is_diarization_checkpoint)
    read_checkpoint = staticmethod(read_checkpoint)

    def __init__(self, config: Nemotron3DiarizationConfig) -> None:
        super().__init__()
        self.config = config
        self.factor = config.audio_config.subsampling_factor
        self.model = DiarizationBackbone(config.audio_config, config.head_config)
        self.classifier = ClassificationHead(config.head_config.hidden_size, config.num_speakers)
        self.silence_embeds = nn.Parameter(torch.zeros(config.audio_config.hidden_size))
        streaming = config.streaming_config
        self.offline_policy = CachePolicy.build(streaming, config.fifo_length, config.speaker_cache_update_period)
        self.stream_policy = CachePolicy.build(streaming, streaming.fifo_length, streaming.speaker_cache_update_period)

    @classmethod
    def from_config(cls, config: Nemotron3DiarizationConfig) -> Nemotron3Diarization:
        return cls(config)

    @staticmethod
    def tiny_config() -> Nemotron3DiarizationConfig:
        return tiny_config()

    @staticmethod
    def example_inputs(config: Nemotron3DiarizationConfig, batch_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([200 - 37 * i for i in range(batch_size)])
        return torch.randn(batch_size, 201, config.num_mel_bins), lengths

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.diarize(features, lengths)

    def new_state(self, policy: CachePolicy, batch: int) -> CacheState:
        weight = self.silence_embeds
        return CacheState.empty(policy, batch, weight.shape[0], weight.device, weight.dtype)

    def _step(self, policy: CachePolicy, state: CacheState, chunk: torch.Tensor, valid: torch.Tensor,
              present: torch.Tensor, lookback: int, num_chunk: int) -> tuple[torch.Tensor, CacheState]:
        """One step: chunk [B, K, D] stacked frames (look-back, chunk, look-ahead); valid: bool [B, K] frames a
        row attends to; present: [B] frames of the step a row really has (the rest pad the batch).
        -> (the chunk frames' logits [B, num_chunk * factor, S], the state after the step)."""
        cached = state.frames()
        step = torch.cat([cached, chunk], dim=1)
        mask = torch.cat([valid.new_ones(valid.shape[0], cached.shape[1]), valid], dim=1)
        # a row with nothing to attend to (a batch's padding row) would give NaN that nothing reads
        mask[:, 0] |= ~mask.any(dim=1)
        logits = self.classifier(self.model(step, mask, present + cached.shape[1]))
        new_state = push(policy, state, step, logits, self.silence_embeds, cached.shape[1] + lookback, num_chunk,
                         mask)
        start = (cached.shape[1] + lookback) * self.factor
        return logits[:, start : start + num_chunk * self.factor], new_state

    def diarize(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """features: [B, T, n_mels] (``nemotron_logmel``, zero past each row's end); lengths: [B] real mel frames
        -> speaker logits [B, T, num_speakers] (a row's are meaningful up to its length)."""
        config, factor = self.config, self.factor
        embeds = self.model.audio_tower.embedder(features.to(self.silence_embeds.dtype))
        num_embeds = embeds.shape[1]
        lengths = lengths.to(embeds.device)
        # Alone, a row's features hold length + 1 frames (the extractor's last, zeroed): its encoder sees
        # ceil((length + 1) / factor) frames and attends to the ceil(length / factor) whose first frame is real.
        own = torch.div(lengths + factor, factor, rounding_mode="floor")
        attended = torch.div(lengths + factor - 1, factor, rounding_mode="floor")
        index = torch.arange(num_embeds, device=embeds.device)[None, :]
        valid = index < attended[:, None]
        state = self.new_state(self.offline_policy, features.shape[0])
        out = []
        for start in range(0, num_embeds, config.chunk_length):
            end = min(start + config.chunk_length, num_embeds)
            first = max(start - config.chunk_left_context, 0)
            last = min(end + config.chunk_right_context, num_embeds)
            present = (own - first).clamp(min=0, max=last - first)
            logits, state = self._step(self.offline_policy, state, embeds[:, first:last], valid[:, first:last],
                                       present, start - first, end - start)
            out.append(logits)
        return torch.cat(out, dim=1)[:, : features.shape[1]]

    def stream_step(self, state: CacheState, features: torch.Tensor, lookahead: int,
                    num_frames: int | None = None) -> tuple[torch.Tensor, CacheState]:
        """One chunk of each row's stream: features [B, K, n_mels], the chunk's mel frames and its ``lookahead``
        encoder frames of look-ahead (the next chunk starts with them); ``num_frames``: the mel frames to score
        (a stream's last chunk, which has no look-ahead, may end inside its last encoder frame).
        -> (logits [B, frames scored, S], the state after the chunk)."""
        embeds = self.model.audio_tower.embedder(features.to(self.silence_embeds.dtype))
        b, k = embeds.shape[:2]
        num_chunk = k - lookahead
        if lookahead < 0 or num_chunk < 1:
            raise ValueError(f"a chunk of {k} encoder frames cannot hold {lookahead} look-ahead frames and one more")
        valid = embeds.new_ones(b, k, dtype=torch.bool)
        present = torch.full((b,), k, device=embeds.device)
        logits, state = self._step(self.stream_policy, state, embeds, valid, present, 0, num_chunk)
        return (logits if num_frames is None else logits[:, :num_frames]), state

    # -- per-stream state, for oasr.diarization.streams ----------------------------------------------------
    def stream_state_fields(self) -> tuple[StateField, ...]:
        """One stream's speaker cache (frames and the probabilities stored with them) and FIFO."""
        policy, hidden = self.stream_policy, self.config.audio_config.hidden_size
        return (StateField("speaker_cache", (policy.cache_length, hidden)),
                StateField("speaker_cache_probs", (policy.cache_length, policy.num_speakers)),
                StateField("fifo", (policy.fifo_length, hidden)))

    @staticmethod
    def stream_state(rows: dict[str, torch.Tensor], num_cache: int, num_fifo: int, compressed: bool) -> CacheState:
        """Streams' state rows (the fields above, [B, ...]) with their shared counts -> a ``CacheState``."""
        return CacheState(rows["speaker_cache"], rows["speaker_cache_probs"], rows["fifo"], num_cache, num_fifo,
                          compressed)

    @staticmethod
    def stream_rows(state: CacheState) -> dict[str, torch.Tensor]:
        return {"speaker_cache": state.embeds, "speaker_cache_probs": state.probs, "fifo": state.fifo}
