"""The bench's shape, read from its source with ``ast`` (nothing is imported).

* No import circle between ``hearth_bench`` modules, subfolders included. Every import
  counts, also one inside a function: a circle of any kind is files that must be read
  together.
* Each folder is a package (``__init__.py``) and no module is over ``MAX_LINES`` lines.
* Every mode of ``scripts/bench`` (``__main__.MODES``) names a module with a ``main``.
"""

from __future__ import annotations

import ast
import graphlib
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
PACKAGE = "hearth_bench"
MAX_LINES = 600
FOLDERS = {"accuracy", "fuzz", "harness", "household", "quant"}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its folder's)."""
    found = {}
    for path in sorted((BENCH / PACKAGE).rglob("*.py")):
        parts = path.relative_to(BENCH).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``path`` (module ``name``) imports anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    return (targets & known) - {name}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_the_graph_reaches_into_the_folders() -> None:
    graph = import_graph()
    assert {f"{PACKAGE}.harness.stack", f"{PACKAGE}.accuracy.main"} <= graph.keys()
    assert f"{PACKAGE}.harness.server" in graph[f"{PACKAGE}.harness.stack"]
    assert f"{PACKAGE}.client" in graph[f"{PACKAGE}.household.replay"]


def test_no_import_circle() -> None:
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


def test_folders_are_packages() -> None:
    root = BENCH / PACKAGE
    folders = {p.name for p in root.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert folders == FOLDERS
    assert all((root / folder / "__init__.py").is_file() for folder in folders)


def test_no_module_is_too_long() -> None:
    long = {
        str(path.relative_to(BENCH)): lines
        for path in modules().values()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_mode_names_a_module_with_main() -> None:
    main = ast.parse((BENCH / PACKAGE / "__main__.py").read_text())
    table = next(
        node.value
        for node in main.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MODES"
    )
    named = ast.literal_eval(table)
    found = modules()
    for mode, module in named.items():
        assert module in found, f"mode {mode}: no module {module}"
        tree = ast.parse(found[module].read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "main" in defined, f"mode {mode}: {module} has no main()"
