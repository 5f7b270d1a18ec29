"""NeMo ``.nemo`` archives: a tar (plain or gzipped) of ``model_config.yaml``, ``model_weights.ckpt`` (a torch
state dict) and the tokenizer's files, read straight from the tar without unpacking it.

``nemo_config`` maps the config to an OASR architecture (refusing what OASR cannot serve, by field name) and
``nemo_keys`` holds every key rename. The SentencePiece model is the one file written out: the tokenizer registry
takes a path, so it is copied once into OASR's cache (``$XDG_CACHE_HOME/oasr/nemo``, named by its content's hash).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path
from typing import IO

import torch
import yaml

from oasr.errors import CheckpointError
from oasr.models import CONVERTERS
from oasr.models.checkpoint import Checkpoint, ModelSource
from oasr.models.converters.nemo_canary import canary_tokens
from oasr.models.converters.nemo_config import map_config
from oasr.models.converters.nemo_keys import rename_state

CONFIG_MEMBER = "model_config.yaml"
WEIGHTS_MEMBER = "model_weights.ckpt"


@CONVERTERS.register("nemo")
class NemoConverter:
    @staticmethod
    def detect(source: ModelSource) -> bool:
        return source.archive is not None

    @staticmethod
    def load(source: ModelSource) -> Checkpoint:
        assert source.archive is not None
        with _open(source.archive) as archive:
            members = {_base_name(m.name): m for m in archive.getmembers() if m.isfile()}
            config = _read_yaml(source, _member(archive, members, CONFIG_MEMBER, source))
            model = map_config(config, str(source))
            tokenizer_bytes = _member(archive, members, model.tokenizer_member, source).read()
            weights = _read_weights(source, _member(archive, members, WEIGHTS_MEMBER, source))
        state, dropped = rename_state(model.architecture, weights, model.dropped_prefixes)
        config = model.config
        if model.architecture == "canary":
            config = {**config, **dataclasses.asdict(canary_tokens(tokenizer_bytes, str(source)))}
        return Checkpoint(
            architecture=model.architecture,
            config=config,
            state_dict=state,
            tokenizer_file=_cached_tokenizer(tokenizer_bytes),
            format="nemo",
            dropped_keys=dropped,
            tokenizer="sentencepiece",
        )


def _open(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r:*")
    except (tarfile.TarError, OSError) as exc:
        raise CheckpointError(f"{path}: not a readable .nemo archive (a tar file): {exc}") from None


def _base_name(name: str) -> str:
    """A member's file name without its folder; NeMo writes ``./model_config.yaml``."""
    return name.rsplit("/", 1)[-1]


def _member(archive: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str, source: ModelSource) -> IO[bytes]:
    member = members.get(name)
    handle = archive.extractfile(member) if member is not None else None
    if handle is None:
        raise CheckpointError(f"{source}: the archive has no {name} (it holds: {', '.join(sorted(members)) or 'nothing'})")
    return handle


def _read_yaml(source: ModelSource, handle: IO[bytes]) -> dict:
    try:
        values = yaml.safe_load(handle.read())
    except yaml.YAMLError as exc:
        raise CheckpointError(f"{source}: {CONFIG_MEMBER} is not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise CheckpointError(f"{source}: {CONFIG_MEMBER} is not a mapping")
    return values


def _read_weights(source: ModelSource, handle: IO[bytes]) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(io.BytesIO(handle.read()), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise CheckpointError(f"{source}: {WEIGHTS_MEMBER} is not a torch state dict: {exc}") from None
    if isinstance(state, dict) and "state_dict" in state:  # a Lightning checkpoint rather than the bare dict
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointError(f"{source}: {WEIGHTS_MEMBER} is not a state dict")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _cached_tokenizer(content: bytes) -> Path:
    """The SentencePiece model written under OASR's cache, once per distinct content."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oasr" / "nemo"
    path = root / f"{hashlib.sha256(content).hexdigest()[:24]}.model"
    if path.is_file() and path.stat().st_size == len(content):
        return path
    root.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")  # renamed into place: a reader never sees half a file
    partial.write_bytes(content)
    partial.replace(path)
    return path


def find_archive(directory: Path) -> Path | None:
    """The one ``.nemo`` in ``directory``, None when there is none; several are refused, listed."""
    archives = sorted(p for p in directory.glob("*.nemo") if p.is_file())
    if len(archives) > 1:
        from oasr.errors import ModelNotFoundError

        names = ", ".join(p.name for p in archives)
        raise ModelNotFoundError(f"{directory} holds several .nemo archives ({names}); name the one to load")
    return archives[0] if archives else None
