"""The import graph of ``oasr/`` has no cycles, and its arrows point down the layers but for the few named here.

Read from the source alone (``ast``; nothing of ``oasr`` is imported), so the test costs a second. Every
``import`` and ``from ... import`` counts, at module level and deferred inside functions alike: a deferred
import is still a dependency, only a later one. Imports under ``if TYPE_CHECKING:`` are left out: they exist for
annotations and never run; the cycle test reads them too, since a module that annotates with another's class
while that one builds it is as tied to it as an import that runs. A registry's lazy entries (module paths as strings) are not imports either: the
registry is the seam, and it names only modules of its own package.

``from oasr.pkg import Name`` where ``oasr/pkg/__init__.py`` re-exports ``Name`` from one of its submodules is
an arrow to that submodule (the package's face hands it on; the submodule is what is used).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "oasr"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# The layers, bottom to top; each names packages (a package covers its submodules) or top-level modules. A module
# may import from its own layer and any layer below; docs/architecture.md says why each stands where it does.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("oasr", "oasr.errors", "oasr.registry", "oasr.heap", "oasr.devices", "oasr.uploads", "oasr.cache_memory"),
    ("oasr.audio", "oasr.features", "oasr.tokenizers"),
    ("oasr.kernels", "oasr.layers"),
    ("oasr.quantization",),
    ("oasr.vad",),
    ("oasr.types",),
    ("oasr.decode",),
    ("oasr.streaming",),
    ("oasr.models",),
    ("oasr.engine", "oasr.diarization"),
    ("oasr.transcription",),
    ("oasr.scale",),
    ("oasr.hosting",),
    ("oasr.serving",),
    ("oasr.api",),
    ("oasr.transcribe_command", "oasr.quantize_command", "oasr.diarize_command", "oasr.bench"),
    ("oasr.cli",),
)

# Imports from a lower layer up to a higher one that are allowed, each with its reason (docs/architecture.md
# names each one, by its two modules, under "Arrows that run up"). At most three.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
}
MAX_UPWARD = 3


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        found[name] = Module(name, path, is_package)
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_statements(tree: ast.AST, *, annotations: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, but those under ``if TYPE_CHECKING:`` (its ``else`` counts) unless
    ``annotations``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not annotations:
                for branch in child.orelse:
                    visit_one(branch)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        visit(node)

    visit(tree)
    return found


class Graph:
    def __init__(self, *, annotations: bool = False) -> None:
        self.annotations = annotations  # imports under ``if TYPE_CHECKING:`` count too
        self.modules = modules()
        self.trees = {name: ast.parse(m.path.read_text()) for name, m in self.modules.items()}
        self.reexports = {name: self._reexports(name) for name, m in self.modules.items() if m.is_package}
        self.edges = {name: self._targets(name) for name in self.modules}

    def _owner(self, dotted: str) -> str | None:
        """The module a dotted name lies in (a module, or the package whose attribute it is)."""
        while dotted and dotted not in self.modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def _base(self, name: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = name if self.modules[name].is_package else name.rpartition(".")[0]
        parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    def _reexports(self, package: str) -> dict[str, str]:
        """Names a package's ``__init__`` imports from its own submodules at module level -> that submodule."""
        found = {}
        for node in self.trees[package].body:
            if isinstance(node, ast.ImportFrom):
                base = self._base(package, node)
                if base.startswith(package + ".") and base in self.modules:
                    found.update({alias.asname or alias.name: base for alias in node.names})
        return found

    def _resolve(self, base: str, name: str) -> str | None:
        full = f"{base}.{name}"
        if full in self.modules:
            return full
        owner = self._owner(base)
        if owner is not None and owner == base and name in self.reexports.get(owner, {}):
            return self.reexports[owner][name]
        return owner

    def _targets(self, name: str) -> set[str]:
        targets: set[str] = set()
        for node in import_statements(self.trees[name], annotations=self.annotations):
            if isinstance(node, ast.Import):
                targets.update(self._owner(a.name) for a in node.names if a.name.split(".")[0] == "oasr")
                continue
            base = self._base(name, node)
            if base.split(".")[0] == "oasr":
                targets.update(self._resolve(base, alias.name) for alias in node.names)
        targets.discard(name)
        targets.discard(None)
        return targets  # type: ignore[return-value]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # recursion depth is the longest import chain: a few dozen
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(_one_cycle(sorted(component), edges))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return components


def _one_cycle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A path from the component's first module back to itself, through the component (breadth first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(edges[node] & members):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    return component


def layer_of(name: str) -> int:
    best, found = -1, None
    for depth, layer in enumerate(LAYERS):
        for entry in layer:
            if (name == entry or name.startswith(entry + ".")) and len(entry) > best:
                best, found = len(entry), depth
    if found is None:
        raise AssertionError(f"{name} is in no layer: add its package to LAYERS (and to docs/architecture.md)")
    return found


def upward(graph: Graph) -> set[tuple[str, str]]:
    return {(source, target) for source, targets in graph.edges.items() for target in targets
            if layer_of(target) > layer_of(source)}


GRAPH = Graph()
ANNOTATED = Graph(annotations=True)


def test_the_graph_is_read() -> None:
    # A sample of arrows known to exist, so that a reader that finds nothing cannot pass.
    edges = GRAPH.edges
    assert "oasr.engine.engine" in edges["oasr.transcription.offline"]  # module level
    assert "oasr.models.loader" in edges["oasr.cli"]  # deferred, inside a function
    assert "oasr.layers.basic" in edges["oasr.layers.attention"]
    assert "oasr.layers.backend" in edges["oasr.models.loader"]  # re-exported by oasr.layers: the submodule
    assert len(edges) > 200 and sum(map(len, edges.values())) > 700


def test_type_checking_imports_are_left_out() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import oasr.a\nelse:\n"
                     "    import oasr.b\ndef f():\n    import oasr.c\n")
    assert [a.name for n in import_statements(tree) for a in n.names if a.name.startswith("oasr")] == [
        "oasr.b", "oasr.c"]
    assert [a.name for n in import_statements(tree, annotations=True) for a in n.names
            if a.name.startswith("oasr")] == ["oasr.a", "oasr.b", "oasr.c"]


def test_the_cycle_finder_names_the_modules_of_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]


def test_no_import_cycles() -> None:
    found = cycles(GRAPH.edges)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_no_import_cycles_through_annotations() -> None:
    # engine.contracts annotates with the block pool it never imports at run time: the annotated graph reads it.
    assert "oasr.engine.block_pool" in ANNOTATED.edges["oasr.engine.contracts"] - GRAPH.edges["oasr.engine.contracts"]
    found = cycles(ANNOTATED.edges)
    assert not found, "import cycles through annotations:\n" + "\n".join(" -> ".join(c) for c in found)


def test_every_module_has_a_layer() -> None:
    for name in GRAPH.modules:
        layer_of(name)


def test_arrows_point_down_but_for_the_allowed_ones() -> None:
    found = upward(GRAPH)
    unexplained = sorted(found - set(ALLOWED_UPWARD))
    assert not unexplained, "imports from a lower layer up to a higher one:\n" + "\n".join(
        f"{source} (layer {layer_of(source)}) -> {target} (layer {layer_of(target)})" for source, target in unexplained)
    assert len(ALLOWED_UPWARD) <= MAX_UPWARD
    stale = sorted(set(ALLOWED_UPWARD) - found)
    assert not stale, f"allowed upward imports that no longer exist (remove them here and in the doc): {stale}"


def test_each_allowed_upward_import_is_explained_in_the_architecture_doc() -> None:
    text = ARCHITECTURE.read_text()
    assert "## Arrows that run up" in text
    section = text.split("## Arrows that run up", 1)[1].split("\n## ", 1)[0]
    for source, target in ALLOWED_UPWARD:
        assert f"`{source}` -> `{target}`" in section, f"docs/architecture.md does not explain {source} -> {target}"


def test_the_architecture_doc_lists_the_layers_as_the_test_does() -> None:
    # One line per layer, top to bottom: "- **N** `oasr.a`, `oasr.b` — why it stands there".
    section = ARCHITECTURE.read_text().split("## The layers, top to bottom", 1)[1].split("\n## ", 1)[0]
    documented = {int(number): tuple(re.findall(r"`(oasr[\w.]*)`", names))
                  for number, names in re.findall(r"^- \*\*(\d+)\*\* (.*?) — ", section, flags=re.MULTILINE)}
    assert documented == {depth + 1: layer for depth, layer in enumerate(LAYERS)}
