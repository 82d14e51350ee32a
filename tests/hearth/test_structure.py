"""The integration's module structure: no import cycles, ``data`` holds types only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "custom_components" / "hearth"


def _imports(path: Path) -> set[str]:
    """Sibling modules ``path`` imports, including under ``TYPE_CHECKING``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
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


def test_no_import_cycles() -> None:
    """Not even under TYPE_CHECKING: each module depends only on the layers below."""
    assert _cycle(_graph()) is None


def test_data_holds_types_only() -> None:
    """``data`` is imported by the runtime modules; it imports only types (api's usage,
    the backend interface)."""
    graph = _graph()
    assert graph["data"] - {"coordinator", "pins"} <= {"api", "backend"}
    assert "data" not in graph["coordinator"] | graph["pins"] | graph["prefix"]


def test_render_and_pin_lifecycle_are_split() -> None:
    """``prefix`` renders; ``pins`` pins: the render knows nothing of the engine."""
    graph = _graph()
    assert graph["prefix"].isdisjoint({"api", "coordinator", "pins", "data"})
    assert "prefix" in graph["pins"]
