"""A FunASR online-Paraformer model folder, and one stream decoded through it as FunASR's ``generate(input=piece,
cache=cache, is_final=...)`` decodes it: pieces of any length are cut into ``chunk_samples`` steps (a remainder
waits for the next piece), each step's tokens handed back as they are decided.

``load_paraformer_streaming(folder)`` reads the folder as FunASR saves it (``config.yaml`` naming
``ParaformerStreaming``, ``model.pt``, ``am.mvn``, ``tokens.json``); the module names are the offline
Paraformer's, so every key loads by name and a missing one is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oasr.errors import CheckpointError
from oasr.features.funasr_fbank import FunasrFbank
from oasr.models.checkpoint import ModelSource
from oasr.models.converters.funasr import CMVN_FILE, read_cmvn, read_config, read_weights, token_file
from oasr.models.paraformer.config import ParaformerConfig
from oasr.models.paraformer_streaming.config import ChunkConfig
from oasr.models.paraformer_streaming.frontend import OnlineFrontend
from oasr.models.paraformer_streaming.model import ParaformerStreamingNet, StreamState
from oasr.tokenizers.funasr_tokens import FunasrTokenizer

MODEL_CLASS = "ParaformerStreaming"
ENCODERS = ("SANMEncoderChunkOpt",)
FRONTENDS = ("WavFrontendOnline",)
# A last step shorter than one LFR frame (60 ms) is not put through the frontend: FunASR re-encodes the previous
# step's overlap instead (``ParaformerStreamingNet.encode_chunk``'s ``tail``).
TAIL_SAMPLES = 960


@dataclass
class StreamingParaformer:
    """A loaded online Paraformer: the network, its frontend settings and token list."""

    net: ParaformerStreamingNet
    fbank: FunasrFbank
    tokenizer: FunasrTokenizer
    device: torch.device

    def open(self, chunk: ChunkConfig | None = None) -> ParaformerStream:
        return ParaformerStream(self, chunk or ChunkConfig())


def load_paraformer_streaming(directory: Path | str, device: str | torch.device = "cpu") -> StreamingParaformer:
    source = ModelSource(directory=Path(directory))
    if not source.directory.is_dir():
        raise CheckpointError(f"streaming Paraformer folder {source} does not exist")
    config = read_config(source)
    for name, accepted in (("model", (MODEL_CLASS,)), ("encoder", ENCODERS), ("frontend", FRONTENDS),
                           ("decoder", ("ParaformerSANMDecoder",)), ("predictor", ("CifPredictorV2",))):
        if config.get(name) not in accepted:
            raise CheckpointError(f"{source}: config.yaml field {name} is {config.get(name)!r}; the streaming "
                                  f"Paraformer serves {', '.join(accepted)}")
    tokens = FunasrTokenizer(token_file(source))
    frontend = dict(config.get("frontend_conf") or {})
    if (source.directory / CMVN_FILE).is_file():
        frontend["cmvn_shift"], frontend["cmvn_scale"] = read_cmvn(source.directory / CMVN_FILE, source)
    try:
        model_config = ParaformerConfig.from_dict({**config, "frontend_conf": frontend,
                                                   "vocab_size": len(tokens.token_list)})
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: config.yaml does not fit the streaming Paraformer: {exc}") from None
    net = ParaformerStreamingNet(model_config)
    missing, _ = net.load_state_dict(read_weights(source), strict=False)
    if missing:
        raise CheckpointError(f"{source}: model.pt lacks {len(missing)} keys the streaming Paraformer needs: "
                              f"{missing[:5]}")
    device = torch.device(device)
    return StreamingParaformer(net.to(device).eval(), FunasrFbank(model_config.frontend), tokens, device)


class ParaformerStream:
    """One stream: ``push(samples, final=...)`` -> the token ids decided by the steps those samples completed."""

    def __init__(self, model: StreamingParaformer, chunk: ChunkConfig) -> None:
        self.model, self.chunk = model, chunk
        self.frontend = OnlineFrontend(model.fbank)
        self.state = StreamState()
        self.pending = np.zeros(0, dtype=np.float32)  # samples short of a whole step
        self.closed = False

    @torch.inference_mode()
    def push(self, audio: np.ndarray, *, final: bool = False) -> list[int]:
        if self.closed:
            raise ValueError("audio pushed after the stream's final piece")
        audio = np.concatenate([self.pending, np.asarray(audio, dtype=np.float32)])
        step = self.chunk.chunk_samples
        num_steps = len(audio) // step + int(final)
        tokens: list[int] = []
        for index in range(num_steps):
            piece = audio[index * step: (index + 1) * step]
            last = final and index == num_steps - 1
            tokens += self._step(piece, last)
        self.pending = audio[num_steps * step:] if not final else np.zeros(0, dtype=np.float32)
        self.closed = final
        return tokens

    def _step(self, piece: np.ndarray, final: bool) -> list[int]:
        net, device = self.model.net, self.model.device
        tail = final and len(piece) < TAIL_SAMPLES
        if tail:
            features = torch.zeros(1, 0, net.config.encoder.input_size, device=device)
        else:
            self.frontend.push(piece)
            features = self.frontend.take(final, device)
        hidden = net.encode_chunk(features, self.state, self.chunk, tail=tail)
        embeds = net.fire_chunk(hidden, self.state, self.chunk, final=final)
        if embeds.shape[1] == 0:
            return []
        logits = net.decode_chunk(embeds, hidden, self.state, self.chunk)
        dropped = net.dropped_ids
        return [t for t in logits[0].argmax(dim=-1).tolist() if t not in dropped]
