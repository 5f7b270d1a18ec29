"""Where the Silero VAD weights come from: the ``silero-vad`` package's data files, read without running its code.

The package ships two different 16 kHz checkpoints of the same network:

- ``jit``: ``silero_vad.jit``, the model ``silero_vad.load_silero_vad()`` returns (its ONNX files carry the
  same weights). It is what ``get_speech_timestamps`` and most tools use, so it is the default here; its
  tensors are read from the TorchScript archive, nothing of it is run.
- ``safetensors``: ``silero_vad_16k.safetensors``, published with the package's tinygrad port. Its weights
  differ from the jit model's (about 3% of chunks flip at threshold 0.5 on our English clips).

Both load into the same ``SileroVADNet``; each table below maps a checkpoint key onto a module key.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Literal

import torch

from oasr.errors import CheckpointError, OASRError
from oasr.vad.silero_net import SileroVADNet

SileroWeights = Literal["jit", "safetensors"]
PACKAGE = "silero-vad"
FILES: dict[str, str] = {"jit": "silero_vad.jit", "safetensors": "silero_vad_16k.safetensors"}

# The package stores one LSTM cell; it is the only layer of our LSTM.
_LSTM = {name: f"lstm.{name}_l0" for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
SAFETENSORS_RENAMES: dict[str, str] = {f"lstm_cell.{k}": v for k, v in _LSTM.items()}
# TorchScript module paths of the 16 kHz submodule (``_model``; ``_model_8k`` is not used).
JIT_RENAMES: dict[str, str] = {
    "_model.stft.forward_basis_buffer": "stft_conv.weight",
    **{f"_model.encoder.{i}.reparam_conv.{p}": f"conv{i + 1}.{p}" for i in range(4) for p in ("weight", "bias")},
    **{f"_model.decoder.rnn.{k}": v for k, v in _LSTM.items()},
    "_model.decoder.decoder.2.weight": "final_conv.weight",
    "_model.decoder.decoder.2.bias": "final_conv.bias",
}


class MissingVADPackageError(OASRError):
    """The package that ships a detector's weights is not installed."""


def weights_path(weights: SileroWeights = "jit") -> Path:
    if weights not in FILES:
        raise ValueError(f"unknown silero weights {weights!r}; choose one of {', '.join(FILES)}")
    # find_spec locates the package without importing it: importing silero_vad calls torch.set_num_threads(1).
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise MissingVADPackageError(f"the silero VAD needs the {PACKAGE} package for its weights: pip install {PACKAGE}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / FILES[weights]
    if not path.is_file():
        raise MissingVADPackageError(f"{PACKAGE} is installed but has no {FILES[weights]}: pip install -U {PACKAGE}")
    return path


def read_checkpoint(weights: SileroWeights = "jit", path: Path | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under module keys; keys outside the rename table (the 8 kHz model) are dropped."""
    path = path or weights_path(weights)
    if weights == "safetensors":
        from safetensors.torch import load_file

        return {SAFETENSORS_RENAMES.get(k, k): v for k, v in load_file(str(path)).items()}
    with warnings.catch_warnings():  # torch 2.9+ deprecates TorchScript; only the tensors are read here
        warnings.simplefilter("ignore", DeprecationWarning)
        archive = torch.jit.load(str(path), map_location="cpu")
    tensors = dict(archive.state_dict())
    return {JIT_RENAMES[k]: v.detach().clone() for k, v in tensors.items() if k in JIT_RENAMES}


def load_net(weights: SileroWeights = "jit", path: Path | None = None) -> SileroVADNet:
    """The network with the package's weights, in eval mode on CPU; fails on any missing or unexpected key."""
    net = SileroVADNet()
    missing, unexpected = net.load_state_dict(read_checkpoint(weights, path), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"silero VAD {weights} weights do not fit the network: missing {missing}, "
                              f"unexpected {unexpected}")
    return net.eval()
