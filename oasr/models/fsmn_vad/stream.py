"""FSMN-VAD on a live stream, as FunASR's streaming call runs it (``AutoModel.generate(input=piece, cache=...)``
with ``chunk_size`` = ``PIECE_MS``, never ``is_final``): samples gathered into whole pieces; each piece's
complete 25 ms fbank frames made, LFR-stacked once their right context has come (the first frame repeated
before the stream) and CMVN'd; the encoder run over them with its FSMN memories carried; FunASR's dynamic
silence schedule set for the piece; and the state machine fed, its start and end events handed on as speech
edges (``oasr.vad.stream.StreamSegments``).

A live stream has no last frame, so a segment ends only on silence (or at FunASR's longest segment); the caller
restarts the stream where it cuts the audio itself (a realtime commit or clear).
"""

from __future__ import annotations

import numpy as np
import torch

from oasr.errors import CheckpointError
from oasr.models.fsmn_vad.net import FsmnVadNet
from oasr.vad.fsmn_segments import IN_SPEECH, DynamicSilence, FsmnSegmentConfig, FsmnSegmenter, frame_decibels
from oasr.vad.stream import SpeechEdge, StreamSegments

# FunASR's streaming example feeds 200 ms pieces (its golden streams too, tests/data/funasr/fsmn_vad.json): the
# piece bounds how late an event is heard, and is the step of the dynamic silence schedule.
PIECE_MS = 200


class FsmnStream:
    def __init__(self, net: FsmnVadNet, segment_config: FsmnSegmentConfig, device: torch.device,
                 piece_ms: int = PIECE_MS) -> None:
        frontend = net.frontend.config
        if frontend.lfr_n != 1:  # the state machine steps one 10 ms frame per score
            raise CheckpointError(f"FSMN-VAD streams need LFR frames every fbank frame (lfr_n 1), not {frontend.lfr_n}")
        self.net = net
        self.device = device
        self.frontend = frontend
        self.piece_samples = piece_ms * frontend.sample_rate // 1000
        self.samples_per_ms = frontend.sample_rate // 1000
        self.left = (frontend.lfr_m - 1) // 2  # copies of the first fbank frame before the stream
        self.right = frontend.lfr_m - 1 - self.left  # fbank frames an LFR frame waits for
        self.cmvn = (torch.tensor([frontend.cmvn_shift, frontend.cmvn_scale])[:, : frontend.feature_size]
                     if frontend.cmvn_shift else torch.tensor([[0.0], [1.0]])).to(self.device)
        self.segmenter = FsmnSegmenter(segment_config)
        self.schedule = DynamicSilence(piece_ms)
        self._pending = np.zeros(0, dtype=np.float32)  # samples short of a whole piece
        self._audio = np.zeros(0, dtype=np.float32)  # samples from the next fbank frame's first
        self._fbank = torch.zeros(0, frontend.num_mel_bins, device=self.device)  # from the next LFR frame's taps
        self._decibels: list[float] = []  # of the fbank frames not yet scored
        self._memory: list[torch.Tensor] | None = None
        self.num_fbank = 0
        self.num_scored = 0

    def push(self, samples: np.ndarray) -> StreamSegments:
        audio = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        num_pieces = len(audio) // self.piece_samples
        edges: list[SpeechEdge] = []
        for index in range(num_pieces):
            piece = audio[index * self.piece_samples : (index + 1) * self.piece_samples]
            self.schedule.before_piece(self.segmenter)
            silence, decibels = self._score(piece)
            events = self.segmenter.feed(silence, decibels, final=False)
            self.schedule.after_piece(events)
            for start_ms, end_ms in events:
                if start_ms >= 0:
                    edges.append(SpeechEdge(True, start_ms * self.samples_per_ms))
                if end_ms >= 0:
                    edges.append(SpeechEdge(False, end_ms * self.samples_per_ms))
        self._pending = audio[num_pieces * self.piece_samples :]
        return StreamSegments(tuple(edges), self._settled(), self._speech_until())

    def _settled(self) -> int:
        """No segment starts before the state machine's first frame not yet handed out or dropped."""
        return self.segmenter.next_free_frame * self.frontend.hop_length

    def _speech_until(self) -> int:
        """An open segment ends no earlier than the first frame of its current silence run."""
        segmenter = self.segmenter
        if segmenter.state != IN_SPEECH:
            return self._settled()
        return (segmenter.num_frames - segmenter.silence_run) * self.frontend.hop_length

    @torch.inference_mode()
    def _score(self, piece: np.ndarray) -> tuple[list[float], list[float]]:
        """A piece's samples -> the silence probability and loudness of each LFR frame they complete."""
        c = self.frontend
        self._audio = np.concatenate([self._audio, piece])
        num_new = max(0, (len(self._audio) - c.win_length) // c.hop_length + 1)
        if num_new:
            used = (num_new - 1) * c.hop_length + c.win_length
            waveform = torch.from_numpy(self._audio[:used].copy()).to(self.device)[None]
            fbank = self.net.frontend.fbank(waveform, num_new)[0]
            if self.num_fbank == 0:
                fbank = torch.cat([fbank[:1].expand(self.left, -1), fbank])
            self._fbank = torch.cat([self._fbank, fbank])
            self._decibels += frame_decibels(self._audio, num_new, c.win_length, c.hop_length)
            self._audio = self._audio[num_new * c.hop_length :]
            self.num_fbank += num_new
        num_ready = max(0, self.num_fbank - self.right) - self.num_scored
        if num_ready == 0:
            return [], []
        stacked = self._fbank.unfold(0, c.lfr_m, 1)[:num_ready]  # [T, n_mels, lfr_m]
        features = (stacked.transpose(1, 2).reshape(num_ready, -1) + self.cmvn[0]) * self.cmvn[1]
        scores, self._memory = self.net.encoder(features[None], self._memory)
        self._fbank = self._fbank[num_ready:]
        decibels, self._decibels = self._decibels[:num_ready], self._decibels[num_ready:]
        self.num_scored += num_ready
        return self.net.silence(scores[0]).float().cpu().tolist(), decibels
