"""The seams hold: the engine and the server reach model families only through the capability record and the
model's own methods, never by importing a family's package."""

from __future__ import annotations

import ast
from pathlib import Path

import oasr

PACKAGE = Path(oasr.__file__).parent
FAMILIES = sorted(p.name for p in (PACKAGE / "models").iterdir() if p.is_dir() and (p / "__init__.py").exists())


def family_imports(directory: Path) -> list[str]:
    found = []
    for path in sorted(directory.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if any(name == f"oasr.models.{f}" or name.startswith(f"oasr.models.{f}.") for f in FAMILIES):
                    found.append(f"{path.relative_to(PACKAGE)}: {name}")
    return found


def test_the_families_are_found() -> None:
    assert {"whisper", "fastconformer"} <= set(FAMILIES)


def test_no_module_of_the_engine_or_the_server_imports_a_model_family() -> None:
    assert family_imports(PACKAGE / "engine") == []
    assert family_imports(PACKAGE / "serving") == []
