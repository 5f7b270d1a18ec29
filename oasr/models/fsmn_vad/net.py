"""FunASR's FSMN-VAD network (``fsmn_vad_streaming``'s ``FSMN`` encoder) and its loader from a FunASR model folder
(``config.yaml``, ``model.pt``, ``am.mvn``).

Frames: Kaldi fbank every 10 ms, stacked 5 at a time (LFR m=5, n=1) and CMVN'd, as FunASR's online frontend gives
them. Network: two affine layers and a ReLU, FSMN blocks (a projection, a causal depthwise memory over ``lorder``
past frames, an affine back and a ReLU), two affine layers out and a softmax over the states; state 0 is silence.
Module names mirror the checkpoint's keys (``encoder.in_linear1.linear.weight`` ...), so the state dict loads as
saved. The encoder also scores a live stream piece by piece, its FSMN memories carried (``FsmnEncoder.forward``'s
``memory``; ``oasr.models.fsmn_vad.stream``). The segment logic is ``oasr.vad.fsmn_segments``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from oasr.errors import CheckpointError
from oasr.features.funasr_fbank import FunasrFbank, FunasrFbankConfig
from oasr.models.checkpoint import ModelSource
from oasr.models.converters.funasr import read_cmvn, read_config, read_weights

CMVN_FILE = "am.mvn"


@dataclass(frozen=True)
class FsmnConfig:
    """``encoder_conf`` of an FSMN-VAD config.yaml (sizes of each layer, the memory's reach)."""

    input_dim: int
    input_affine_dim: int
    fsmn_layers: int
    linear_dim: int
    proj_dim: int
    lorder: int
    rorder: int
    lstride: int
    rstride: int
    output_affine_dim: int
    output_dim: int

    def __post_init__(self) -> None:
        if self.rorder != 0:  # the released model has no look-ahead memory; a streaming detector cannot wait
            raise CheckpointError(f"FSMN-VAD with rorder={self.rorder} (look-ahead memory) is not supported")
        if self.lorder < 1 or self.lstride < 1:
            raise CheckpointError(f"FSMN-VAD needs lorder and lstride >= 1; got {self.lorder}, {self.lstride}")


class Affine(nn.Module):
    """FunASR's ``AffineTransform`` / ``LinearTransform``: one ``nn.Linear`` under the name ``linear``."""

    def __init__(self, input_dim: int, output_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(input_dim, output_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class MemoryBlock(nn.Module):
    """Causal depthwise memory: each channel adds a learnt sum of its last ``lorder`` frames (``lstride`` apart)."""

    def __init__(self, dim: int, lorder: int, lstride: int) -> None:
        super().__init__()
        self.reach = (lorder - 1) * lstride
        self.conv_left = nn.Conv2d(dim, dim, (lorder, 1), dilation=(lstride, 1), groups=dim, bias=False)

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, T, D] -> [B, T, D]; ``past``: the ``reach`` frames before x [B, reach, D] (None: zeros, x
        starts the stream)."""
        if past is None:
            past = x.new_zeros(x.shape[0], self.reach, x.shape[2])
        channels = torch.cat([past, x], dim=1).transpose(1, 2).unsqueeze(-1)  # [B, D, reach + T, 1]
        return x + self.conv_left(channels).squeeze(-1).transpose(1, 2)


class FsmnLayer(nn.Module):
    def __init__(self, config: FsmnConfig) -> None:
        super().__init__()
        self.linear = Affine(config.linear_dim, config.proj_dim, bias=False)
        self.fsmn_block = MemoryBlock(config.proj_dim, config.lorder, config.lstride)
        self.affine = Affine(config.proj_dim, config.linear_dim)

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, T, linear_dim] -> (output [B, T, linear_dim], the memory's ``reach`` last input frames, the
        ``past`` of the frames that follow)."""
        projected = self.linear(x)
        output = torch.relu(self.affine(self.fsmn_block(projected, past)))
        reach = self.fsmn_block.reach
        if past is not None:
            projected = torch.cat([past, projected], dim=1)
        elif projected.shape[1] < reach:
            projected = nn.functional.pad(projected, (0, 0, reach - projected.shape[1], 0))
        return output, projected[:, projected.shape[1] - reach :]


class FsmnEncoder(nn.Module):
    """LFR frames [B, T, input_dim] -> state probabilities [B, T, output_dim]."""

    def __init__(self, config: FsmnConfig) -> None:
        super().__init__()
        self.in_linear1 = Affine(config.input_dim, config.input_affine_dim)
        self.in_linear2 = Affine(config.input_affine_dim, config.linear_dim)
        self.fsmn = nn.Sequential(*(FsmnLayer(config) for _ in range(config.fsmn_layers)))
        self.out_linear1 = Affine(config.linear_dim, config.output_affine_dim)
        self.out_linear2 = Affine(config.output_affine_dim, config.output_dim)

    def forward(self, frames: torch.Tensor, memory: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """frames [B, T, input_dim] continuing a stream whose FSMN layers last saw ``memory`` (None: a new
        stream) -> (state probabilities [B, T, output_dim], the memory after them). The network is causal, so
        a stream scored piece by piece gets the scores of one pass."""
        hidden = torch.relu(self.in_linear2(self.in_linear1(frames)))
        carried = []
        for index, layer in enumerate(self.fsmn):
            hidden, past = layer(hidden, None if memory is None else memory[index])
            carried.append(past)
        return torch.softmax(self.out_linear2(self.out_linear1(hidden)), dim=-1), carried


class FsmnVadNet(nn.Module):
    """The frontend and the encoder of one FSMN-VAD folder; ``model_conf`` holds the segment logic's settings."""

    def __init__(self, config: FsmnConfig, frontend: FunasrFbankConfig, model_conf: dict) -> None:
        super().__init__()
        self.frontend = FunasrFbank(frontend)
        self.encoder = FsmnEncoder(config)
        self.model_conf = dict(model_conf)
        self.silence_states = list(model_conf.get("sil_pdf_ids", [0]))

    def silence_probabilities(self, audio: torch.Tensor) -> torch.Tensor:
        """audio: float32 [N] at 16 kHz -> the silence states' probability per 10 ms frame [T]."""
        features, lengths = self.frontend([audio], device=audio.device)
        scores, _ = self.encoder(features[:, : int(lengths[0])])
        return self.silence(scores[0])

    def silence(self, scores: torch.Tensor) -> torch.Tensor:
        """State probabilities [T, output_dim] -> the silence states' [T]."""
        return scores[:, self.silence_states].sum(dim=-1)


def load_fsmn_vad(directory: Path | str, device: str | torch.device = "cpu") -> FsmnVadNet:
    """An FSMN-VAD model folder as FunASR saves it -> the network, its weights loaded (missing keys refused)."""
    source = ModelSource(directory=Path(directory))
    if not source.directory.is_dir():
        raise CheckpointError(f"FSMN-VAD model folder {source} does not exist")
    config = read_config(source)
    if config.get("encoder") != "FSMN":
        raise CheckpointError(f"{source}: config.yaml's encoder is {config.get('encoder')!r}, not FSMN")
    try:
        network = FsmnConfig(**config["encoder_conf"])
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f"{source}: config.yaml's encoder_conf does not fit FSMN-VAD: {exc}") from None
    frontend_values = dict(config.get("frontend_conf", {}))
    cmvn = source.directory / CMVN_FILE
    if cmvn.is_file():
        frontend_values["cmvn_shift"], frontend_values["cmvn_scale"] = read_cmvn(cmvn, source)
    net = FsmnVadNet(network, FunasrFbankConfig.from_dict(frontend_values), config.get("model_conf", {}))
    state = {k: v for k, v in read_weights(source).items() if k.startswith("encoder.")}
    missing, unexpected = net.load_state_dict(state, strict=False)
    missing = [k for k in missing if k.startswith("encoder.")]
    if missing or unexpected:
        raise CheckpointError(f"{source}: model.pt does not match FSMN-VAD's layout: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
    return net.to(device).eval()
