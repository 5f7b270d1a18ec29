"""FunASR's FSMN-VAD as a speech detector, registered as ``fsmn`` and named with its FunASR model folder
(``--vad fsmn:DIR``): the ported network (``oasr.models.fsmn_vad.net``) scores each 10 ms frame, and FunASR's own
segment logic (``oasr.vad.fsmn_segments``) turns those scores into FunASR's segments, which the long-form window
planner cuts at (``cuts_own_segments``) instead of running OASR's segmenter over the probabilities. A live stream
(``open_stream``, the realtime server VAD) gives the same state machine's start and end events as they are found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from oasr.vad import VAD_DETECTORS
from oasr.vad.detector import Audio, as_samples
from oasr.models.fsmn_vad.net import FsmnVadNet, load_fsmn_vad
from oasr.models.fsmn_vad.stream import FsmnStream
from oasr.vad.fsmn_segments import (
    DYNAMIC_FIRST_END_SILENCE_MS,
    DYNAMIC_SPEECH_NOISE_THRES,
    FsmnSegmentConfig,
    FsmnSegmenter,
    frame_decibels,
)

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 160  # one fbank frame shift (10 ms): the network scores each


@VAD_DETECTORS.register("fsmn")
class FsmnVAD:
    """``SpeechDetector``: one speech probability (one minus the silence states') per 10 ms chunk."""

    sample_rate = SAMPLE_RATE
    chunk_samples = FRAME_SAMPLES
    model_folder = "required"  # FunASR's folder: config.yaml, model.pt, am.mvn
    cuts_own_segments = True  # ``segments(audio)`` are FunASR's; the planner cuts there

    def __init__(self, net: FsmnVadNet) -> None:
        self.net = net
        self.device = next(net.parameters()).device
        self.segment_config = FsmnSegmentConfig.from_model_conf(net.model_conf)

    @classmethod
    def load(cls, device: str | torch.device = "cpu", model_dir: Path | str | None = None) -> FsmnVAD:
        if model_dir is None:
            from oasr.errors import CheckpointError

            raise CheckpointError("the fsmn VAD needs its FunASR model folder (config.yaml, model.pt, am.mvn)")
        return cls(load_fsmn_vad(model_dir, device))

    @torch.inference_mode()
    def frame_silence(self, audio: Audio) -> np.ndarray:
        """Silence probability per fbank frame [T] (frames wholly inside the audio)."""
        samples = as_samples(audio).to(self.device)
        if len(samples) < self.net.frontend.config.win_length:
            return np.zeros(0, dtype=np.float32)
        return self.net.silence_probabilities(samples).float().cpu().numpy()

    def speech_probs(self, audios: Sequence[Audio]) -> list[np.ndarray]:
        """One float32 array per input, ``ceil(len / 160)`` long; the frames past the last whole 25 ms window
        (at most two) repeat the last score."""
        out = []
        for audio in audios:
            speech = 1.0 - self.frame_silence(audio)
            wanted = -(-len(as_samples(audio)) // FRAME_SAMPLES)
            pad_value = speech[-1] if len(speech) else 0.0
            out.append(np.concatenate([speech, np.full(wanted - len(speech), pad_value)])[:wanted].astype(np.float32))
        return out

    def open_stream(self) -> FsmnStream:
        """A live stream (``oasr.vad.stream``): FunASR's streaming events as speech edges, piece by piece."""
        return FsmnStream(self.net, self.segment_config, self.device)

    def segments(self, audio: Audio) -> list[list[int]]:
        """FunASR's ``AutoModel.generate`` segments for a whole clip under 10 s: ``[[start_ms, end_ms], ...]``
        (its offline call's dynamic silence: a 2 s end silence and a 0.5 speech threshold)."""
        silence = self.frame_silence(audio)
        config = replace(self.segment_config, max_end_silence_ms=DYNAMIC_FIRST_END_SILENCE_MS,
                         speech_noise_thres=DYNAMIC_SPEECH_NOISE_THRES)
        decibels = frame_decibels(as_samples(audio).numpy(), len(silence))
        return FsmnSegmenter(config).run(silence.tolist(), decibels)
