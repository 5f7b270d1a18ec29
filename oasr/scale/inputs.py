"""What ``oasr transcribe`` reads and where it writes: audio files and manifest entries, their output names, and
which of them a resumed run can skip.

A manifest is a JSON Lines file, one object per line: ``{"audio": PATH}`` or ``{"id": NAME, "audio": PATH}``,
``PATH`` relative to the manifest's directory (or absolute). Other keys (a reference ``text``, a ``language``)
are ignored, so a labelled data set's manifest can be read as it is. Blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from oasr.errors import OASRError


class ManifestError(OASRError):
    """A manifest line is not an entry; the message names the file and the line."""


@dataclass(frozen=True)
class TranscribeInput:
    """One input: an audio file, and the output name a manifest's ``id`` gives it (None: from the file's stem)."""

    path: Path
    id: str | None = None

    @property
    def stem(self) -> str:
        return self.id if self.id is not None else self.path.stem


def read_manifest(manifest: Path) -> list[TranscribeInput]:
    """The entries of a JSON Lines manifest, in file order; raises ``ManifestError`` naming the first bad line
    (not JSON, not an object, no ``audio`` string, an ``id`` that cannot name a file, an ``id`` used twice)."""
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"cannot read manifest {manifest}: {getattr(exc, 'strerror', None) or exc}") from None
    base = manifest.parent
    entries: list[TranscribeInput] = []
    id_lines: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        entry = _parse_line(line, f"{manifest}:{number}", base)
        if entry.id is not None:
            if entry.id in id_lines:
                raise ManifestError(f"{manifest}:{number}: id {entry.id!r} is already used on line "
                                    f"{id_lines[entry.id]}")
            id_lines[entry.id] = number
        entries.append(entry)
    return entries


def _parse_line(line: str, where: str, base: Path) -> TranscribeInput:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ManifestError(f"{where}: expected an object such as {{\"audio\": \"clip.wav\"}}, got "
                            f"{type(row).__name__}")
    audio = row.get("audio")
    if not isinstance(audio, str) or not audio:
        raise ManifestError(f"{where}: needs \"audio\", the path of an audio file (a non-empty string)")
    entry_id = row.get("id")
    if entry_id is not None:
        if isinstance(entry_id, bool) or not isinstance(entry_id, (str, int)):
            raise ManifestError(f"{where}: \"id\" must be a string or an integer")
        entry_id = str(entry_id)
        problem = _unusable_name(entry_id)
        if problem:
            raise ManifestError(f"{where}: id {entry_id!r} cannot name an output file: {problem}")
    return TranscribeInput(base / audio, entry_id)


def _unusable_name(name: str) -> str | None:
    if not name.strip():
        return "it is blank"
    if name in (".", ".."):
        return "it is a directory name"
    if any(c in name for c in "/\\\0"):
        return "it holds a path separator"
    if name.startswith("."):
        return "it would be a hidden file"
    return None


def output_names(inputs: Sequence[TranscribeInput]) -> list[str]:
    """The --output-dir stem of each input. A manifest ``id`` is its input's name as it is; other inputs take
    their file's stem, and an input whose stem an id or an earlier input already has gets STEM-1, STEM-2, ...
    (skipping any name that is an id or some input's own stem). Names depend on the whole input list only, so a
    rerun over the same list finds the same names."""
    reserved = {i.stem for i in inputs}
    ids = {i.id for i in inputs if i.id is not None}
    seen: set[str] = set(ids)
    names = []
    for item in inputs:
        if item.id is not None:
            names.append(item.id)
            continue
        name = item.path.stem
        if name in seen:
            n = 1
            while f"{name}-{n}" in reserved:
                n += 1
            name = f"{name}-{n}"
            reserved.add(name)
        seen.add(name)
        names.append(name)
    return names


def unfinished(names: Sequence[str], output_dir: Path, fmt: str) -> list[int]:
    """The indices of the inputs whose output file ``output_dir/NAME.fmt`` does not exist yet (outputs are
    renamed into place whole, so an existing one is finished)."""
    return [index for index, name in enumerate(names) if not (output_dir / f"{name}.{fmt}").exists()]
