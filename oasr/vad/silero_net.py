"""Silero VAD (v6, 16 kHz) as a batched network on ``oasr.layers``.

Each 512-sample chunk (32 ms) is scored from itself plus the last 64 samples of the chunk before it:

    [context 64 | chunk 512] -> reflect-pad 64 on the right -> STFT as a strided conv (n_fft 256, hop 128,
    4 frames) -> magnitude of 129 bins -> 4 conv + ReLU blocks (strides 1, 2, 2, 1; 4 frames -> 1)
    -> LSTM cell (128) carried from chunk to chunk -> ReLU -> 1x1 conv -> sigmoid.

Only the LSTM links chunks; everything before it is computed for all chunks of all streams at once. On GPU the
recurrence is one cuDNN ``LSTM`` call over the chunk axis; on CPU a loop of fused LSTM cells (see
``recur_steps``), all streams stepping together.
Module names follow the package's safetensors checkpoint; ``oasr.vad.silero_checkpoint`` holds the renames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from oasr.layers import LSTM, Conv1d, ReLU

SAMPLE_RATE = 16_000
CHUNK_SAMPLES = 512
CONTEXT_SAMPLES = 64  # taken from the previous chunk; zeros before the first
N_FFT = 256
HOP = 128
NUM_BINS = N_FFT // 2 + 1  # 129
HIDDEN = 128


@dataclass(frozen=True)
class SileroState:
    """What one call leaves for the next, per stream: the last 64 samples and the LSTM's (h, c).

    Shapes: ``context`` [B, 64]; ``h`` and ``c`` [1, B, 128].
    """

    context: torch.Tensor
    h: torch.Tensor
    c: torch.Tensor

    @classmethod
    def initial(cls, batch_size: int, device: torch.device | str = "cpu") -> SileroState:
        zeros = torch.zeros(1, batch_size, HIDDEN, device=device)
        return cls(torch.zeros(batch_size, CONTEXT_SAMPLES, device=device), zeros, zeros.clone())

    @property
    def batch_size(self) -> int:
        return self.context.shape[0]


class SileroVADNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # Rows 0..128 of the basis are the real parts of the DFT (times a window), rows 129..257 the imaginary.
        self.stft_conv = Conv1d(1, 2 * NUM_BINS, kernel_size=N_FFT, stride=HOP, bias=False)
        self.conv1 = Conv1d(NUM_BINS, 128, kernel_size=3, padding=1)
        self.conv2 = Conv1d(128, 64, kernel_size=3, stride=2, padding=1)
        self.conv3 = Conv1d(64, 64, kernel_size=3, stride=2, padding=1)
        self.conv4 = Conv1d(64, 128, kernel_size=3, padding=1)
        self.relu = ReLU()
        self.lstm = LSTM(HIDDEN, HIDDEN, batch_first=True)
        self.final_conv = Conv1d(HIDDEN, 1, kernel_size=1)

    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        """Chunks with their context [N, 576] -> per-chunk features [N, 128]."""
        x = F.pad(windows.unsqueeze(1), (0, CONTEXT_SAMPLES), mode="reflect")
        spectrum = self.stft_conv(x)
        real, imag = spectrum[:, :NUM_BINS], spectrum[:, NUM_BINS:]
        x = torch.sqrt(real * real + imag * imag)
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = self.relu(conv(x))
        return x.squeeze(-1)

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        """LSTM outputs [B, T, 128] -> speech probabilities [B, T]."""
        b, t, _ = hidden.shape
        x = self.relu(hidden.reshape(b * t, HIDDEN, 1))
        return torch.sigmoid(self.final_conv(x)).reshape(b, t)

    def forward(
        self,
        chunks: torch.Tensor,
        state: SileroState,
        lengths: torch.Tensor | None = None,
        max_chunks_per_pass: int = 16_384,
    ) -> tuple[torch.Tensor, SileroState]:
        """Score ``chunks`` [B, T, 512] of B streams, continuing from ``state``.

        ``lengths`` [B] (chunks per stream, on CPU) lets streams end early: their later chunks are padding, get
        meaningless probabilities, and do not advance that stream's state. The front runs in passes of at most
        ``max_chunks_per_pass`` chunks to bound memory on hours of audio. Returns probabilities [B, T] and the
        new state.
        """
        b, t, n = chunks.shape
        if n != CHUNK_SAMPLES:
            raise ValueError(f"silero VAD scores {CHUNK_SAMPLES}-sample chunks at 16 kHz, got {n}")
        if state.batch_size != b:
            raise ValueError(f"state holds {state.batch_size} streams but {b} were given")
        samples = torch.cat([state.context, chunks.reshape(b, t * n)], dim=1)
        windows = samples.unfold(1, CONTEXT_SAMPLES + CHUNK_SAMPLES, CHUNK_SAMPLES).reshape(b * t, -1)
        features = torch.cat([self.encode(part) for part in windows.split(max_chunks_per_pass)]).reshape(b, t, HIDDEN)
        lengths = torch.full((b,), t) if lengths is None else lengths.cpu()
        recur = self.recur_whole if features.is_cuda else self.recur_steps
        hidden, h, c = recur(features, state.h, state.c, lengths)
        ends = CONTEXT_SAMPLES + lengths.to(samples.device) * CHUNK_SAMPLES
        offsets = torch.arange(-CONTEXT_SAMPLES, 0, device=samples.device)
        last = samples.gather(1, ends[:, None] + offsets[None, :])
        return self.decode(hidden), SileroState(last, h, c)

    def recur_whole(
        self, features: torch.Tensor, h: torch.Tensor, c: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The LSTM over features [B, T, 128] in one call (cuDNN on GPU); streams stop at ``lengths`` [B].
        Returns outputs [B, T, 128] (zeros past a stream's end) and the final h, c [1, B, 128]."""
        t = features.shape[1]
        if bool((lengths == t).all()):
            hidden, (h, c) = self.lstm(features, (h, c))
            return hidden, h, c
        stepped = lengths > 0  # a stream with no chunks keeps its state as it was
        rows = stepped.to(features.device)
        packed = nn.utils.rnn.pack_padded_sequence(
            features[rows], lengths[stepped], batch_first=True, enforce_sorted=False
        )
        out, (h_part, c_part) = self.lstm(packed, (h[:, rows], c[:, rows]))
        hidden = features.new_zeros(features.shape[0], t, HIDDEN)
        hidden[rows] = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=t)[0]
        h, c = h.clone(), c.clone()
        h[:, rows], c[:, rows] = h_part, c_part
        return hidden, h, c

    def recur_steps(
        self, features: torch.Tensor, h: torch.Tensor, c: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``recur_whole`` one chunk at a time, for CPU: there torch's LSTM goes through oneDNN, which plans anew
        for every sequence length and runs long sequences 3-40x slower than this loop of fused LSTM cells.
        Streams are sorted longest first so the live ones are always a prefix of the batch."""
        order = torch.argsort(lengths, descending=True, stable=True)
        sorted_lengths = lengths[order].tolist()
        x = features[order]
        h, c = h[0, order].clone(), c[0, order].clone()
        hidden = features.new_zeros(features.shape)
        w = self.lstm
        live = len(sorted_lengths)
        for step in range(sorted_lengths[0] if sorted_lengths else 0):
            while sorted_lengths[live - 1] <= step:
                live -= 1
            h_new, c_new = torch.lstm_cell(
                x[:live, step], (h[:live], c[:live]), w.weight_ih_l0, w.weight_hh_l0, w.bias_ih_l0, w.bias_hh_l0
            )
            h[:live], c[:live], hidden[:live, step] = h_new, c_new, h_new
        restore = torch.argsort(order)
        return hidden[restore], h[restore][None], c[restore][None]
