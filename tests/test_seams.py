"""The seams hold: nothing outside ``oasr/models/`` reaches a model family but through the registries, the
capability record (which names the family's runner, strategies, streaming runtime and word aligner) and the
model's own methods; no module there imports a family's package, nor probes a model or its features with
``hasattr``."""

from __future__ import annotations

import ast
from pathlib import Path

import oasr

PACKAGE = Path(oasr.__file__).parent
# Every package under oasr/models/ is a family but ``converters``: the checkpoint-format registry every family
# shares, which the CLI's convert and quantize commands use as such.
FAMILIES = sorted(p.name for p in (PACKAGE / "models").iterdir()
                  if p.is_dir() and (p / "__init__.py").exists() and p.name != "converters")


def family_imports(place: Path) -> list[str]:
    """``file: module`` for each import of a family's package under ``place`` (a folder or one file)."""
    found = []
    for path in sorted(place.rglob("*.py")) if place.is_dir() else [place]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if any(name == f"oasr.models.{f}" or name.startswith(f"oasr.models.{f}.") for f in FAMILIES):
                    found.append(f"{path.relative_to(PACKAGE)}: {name}")
    return found


def test_the_families_are_found() -> None:
    assert {"whisper", "fastconformer"} <= set(FAMILIES)


def outside_models() -> list[Path]:
    """Every module of ``oasr`` that is not under ``oasr/models/``: the top-level ones and every other package."""
    return [path for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "models"]


def test_no_module_of_the_engine_or_the_server_imports_a_model_family() -> None:
    assert family_imports(PACKAGE / "engine") == []
    assert family_imports(PACKAGE / "serving") == []


def test_no_module_outside_the_models_imports_a_model_family() -> None:
    paths = outside_models()
    assert {"engine", "serving", "transcription", "hosting", "bench", "cli.py"} <= {
        p.relative_to(PACKAGE).parts[0] for p in paths}
    assert [hit for path in paths for hit in family_imports(path)] == []


def test_the_transcription_layer_probes_no_model_with_hasattr() -> None:
    probes = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
              for path in sorted((PACKAGE / "transcription").rglob("*.py"))
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"]
    assert probes == []
