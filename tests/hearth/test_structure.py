"""The integration's module structure: folders by job, no import cycles, ``data`` holds
types only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "custom_components" / "hearth"
# Each folder imports only the folders before it (the top, Home Assistant's platforms
# and the entry's wiring, imports them all).
LAYERS = ("language", "house", "prefix", "backend", "pins", "turn")


def _name(path: Path) -> str:
    """A module's dotted name within the package: ``turn.decide``, ``entity``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports (dotted), including under ``TYPE_CHECKING``."""
    here = _name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package[: len(package) - (node.level - 1)]
        module = [*base, *(node.module.split(".") if node.module else ())]
        if node.module:
            found.add(".".join(module))
        else:
            found.update(".".join([*module, alias.name]) for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: _imports(path) & modules.keys() for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph[node]):
            if (found := visit(target, [*path, node])) is not None:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        if (found := visit(start, [])) is not None:
            return found
    return None


def test_the_graph_reads_subfolders() -> None:
    """The checks below see the folders' modules and their imports (not only the top's)."""
    graph = _graph()
    assert "turn.decide" in graph
    assert "house.names" in graph["turn.decide"]


def test_no_import_cycles() -> None:
    """Not even under TYPE_CHECKING: each module depends only on the layers below."""
    assert _cycle(_graph()) is None


def test_folders_import_only_the_folders_before_them() -> None:
    """language -> house -> prefix -> backend -> pins -> turn: a folder never reaches up
    to a later one, nor to the top's modules other than the shared leaves (``const``, ``errors``,
    ``tool_names``)."""
    shared = {"const", "errors", "tool_names"}
    wrong = []
    for module, targets in _graph().items():
        folder = module.split(".")[0]
        if folder not in LAYERS:
            continue
        allowed = set(LAYERS[: LAYERS.index(folder) + 1]) | shared
        wrong += [(module, t) for t in targets if t.split(".")[0] not in allowed]
    assert wrong == []


def test_data_holds_types_only() -> None:
    """``data`` is imported by the runtime modules; it imports only types (api's usage,
    the backend interface)."""
    graph = _graph()
    assert graph["data"] - {"backend.coordinator", "pins.manager"} <= {
        "backend.api",
        "backend.base",
    }
    assert (
        "data" not in graph["backend.coordinator"] | graph["pins.manager"] | graph["prefix.render"]
    )


def test_render_and_pin_lifecycle_are_split() -> None:
    """``prefix`` renders; ``pins`` pins: the render knows nothing of the engine."""
    graph = _graph()
    assert graph["prefix.render"].isdisjoint({"backend.api", "coordinator", "pins.manager", "data"})
    assert "prefix.render" in graph["pins.renders"]


MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300
MAX_ENTITY_LINES = 150  # entity.py adapts Home Assistant's chat log to the turn, no more


def _lines(node: ast.ClassDef) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_modules_and_classes_stay_small() -> None:
    """Small enough to read whole: no module over 400 lines, no class over 300, and the
    entity base a thin adapter (the turn itself is turn/'s)."""
    long_modules, long_classes = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(_name(path))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _lines(node) > MAX_CLASS_LINES:
                long_classes.append(f"{_name(path)}.{node.name}")
    assert long_modules == []
    assert long_classes == []
    assert len((PACKAGE / "entity.py").read_text().splitlines()) <= MAX_ENTITY_LINES
