"""The engine's shape, read from its source with ``ast`` (nothing is imported).

* No import circle between modules. Every import counts, also one inside a function or
  under ``TYPE_CHECKING``: a circle of any kind is files that must be read together.
* The folders are layers (``LAYERS``, engine/README.md): a module imports only its own
  folder and the layers below its own.
* The cache bookkeeping (radix tree, KV budget) imports no torch, so it can be tested
  and reasoned about on its own.
* No engine file is over ``MAX_LINES`` lines: the Python modules and the C++ kernels'
  sources (``LINE_RULED``).
* Subfolders count as their folder's layer (``model/quant`` is ``model``): the checks
  read every module below the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine"
PACKAGE = "hearth_engine"
MAX_LINES = 600
LINE_RULED = ("*.py", "*.cpp", "*.h")  # the files MAX_LINES holds for

# Top-level module or folder -> its layer. A module may import its own folder and any
# layer with a lower number; never a higher one, nor another folder of its own number.
LAYERS: dict[str, int] = {
    "__main__": 7,
    "server": 6,
    "cli": 5,
    "serving": 4,
    "constraints": 3,
    "chat": 2,
    "model": 1,
    "cache": 1,
    "config": 0,
    "kv_budget": -1,  # the default KV budget from the box's memory: config's, stdlib only
    "cpu_class": -2,  # HEARTH_CPU (the package's __init__ applies it before torch): stdlib only
}
# Modules whose whole import closure must stay clear of these libraries.
TORCH_FREE = (
    "hearth_engine.cache.radix",
    "hearth_engine.cache.budget",
    "hearth_engine.kv_budget",
    "hearth_engine.cpu_class",
)
HEAVY = frozenset({"torch", "transformers", "safetensors", "numpy"})


def module_name(path: Path, root: Path = ENGINE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules(root: Path = ENGINE) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def _imported(node: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """Absolute names an import statement brings in (modules or names in them)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".")
            if not is_package:
                base.pop()
            base = base[: len(base) - (node.level - 1)]
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        yield module
        yield from (f"{module}.{alias.name}" for alias in node.names)


def import_graph(root: Path = ENGINE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per module: the package modules it imports, and the outside top-level packages."""
    modules = package_modules(root)
    inside: dict[str, set[str]] = {}
    outside: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        inside[name], outside[name] = set(), set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _imported(node, name, path.name == "__init__.py"):
                if target.split(".")[0] != PACKAGE:
                    outside[name].add(target.split(".")[0])
                elif target in modules and target != name:
                    inside[name].add(target)
    return inside, outside


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and all it imports, with the packages (``__init__``) on the way."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in graph:
            continue
        seen.add(name)
        todo.extend(graph[name])
        todo.extend(".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1))
    return seen


def knots(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan): each module of a
    group reaches every other one through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per knot, as a path ``a -> b -> ... -> a``."""
    return [_circle_in(graph, group) for group in knots(graph)]


def _circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest circle through the group's first module (breadth first)."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph[node] & group):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                todo.append(nxt)
    raise AssertionError(f"no circle in {group}")


def layer_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    breaks = []
    for name, targets in sorted(graph.items()):
        if layer_of(name) not in LAYERS:
            continue
        for target in sorted(targets):
            own, other = layer_of(name), layer_of(target)
            if other not in LAYERS or own == other:
                continue
            if LAYERS[other] >= LAYERS[own]:
                breaks.append(f"{name} ({own}) imports {target} ({other})")
    return breaks


def test_no_import_circle() -> None:
    graph = import_graph()[0]
    found = [
        f"{' -> '.join(_circle_in(graph, group))} (all tangled: {', '.join(sorted(group))})"
        for group in knots(graph)
    ]
    assert not found, "import circles:\n" + "\n".join(found)


def test_every_module_has_a_layer() -> None:
    graph, _ = import_graph()
    stray = sorted(n for n in graph if n != PACKAGE and layer_of(n) not in LAYERS)
    assert not stray, f"modules outside the layers of LAYERS: {stray}"


def test_imports_go_down_the_layers() -> None:
    breaks = layer_breaks(import_graph()[0])
    assert not breaks, "imports against the layers:\n" + "\n".join(breaks)


@pytest.mark.parametrize("start", TORCH_FREE)
def test_cache_bookkeeping_imports_no_torch(start: str) -> None:
    graph, outside = import_graph()
    assert start in graph, f"{start} is not a module of the engine"
    closure = _closure(graph, start)
    heavy = sorted(f"{name} imports {lib}" for name in closure for lib in outside[name] & HEAVY)
    assert not heavy, "\n".join(heavy)


def line_ruled(root: Path = ENGINE) -> list[Path]:
    """The engine's files that ``MAX_LINES`` holds for."""
    return sorted({path for pattern in LINE_RULED for path in root.rglob(pattern)})


def test_no_long_files() -> None:
    long = {
        str(path.relative_to(ENGINE)): n
        for path in line_ruled()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"engine files over {MAX_LINES} lines: {long}"


def test_the_line_rule_reads_the_kernel_sources() -> None:
    kernels = ENGINE / PACKAGE / "model" / "kernels"
    ruled = set(line_ruled())
    sources = [*kernels.glob("*.cpp"), *kernels.glob("*.h")]
    assert sources, "no kernel sources found"
    assert set(sources) <= ruled


def test_the_checks_read_subfolders() -> None:
    """Every module below the package is in the graph, under its top folder's layer."""
    graph, _ = import_graph()
    on_disk = {
        module_name(path)
        for path in (ENGINE / PACKAGE).rglob("*.py")
        if path.parent.parent != ENGINE
    }
    nested = {name for name in graph if name.count(".") >= 3}  # hearth_engine.a.b.c
    assert nested, "no module in a subfolder was read"
    assert on_disk <= set(graph)
    assert {layer_of(name) for name in nested} <= set(LAYERS)


STEP_LINES = 25  # WorkerLoop.step, at most: it reads as schedule, run, postprocess


def test_the_step_reads_as_schedule_run_postprocess() -> None:
    path = ENGINE / PACKAGE / "serving" / "worker.py"
    tree = ast.parse(path.read_text(), str(path))
    loop = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WorkerLoop")
    step = next(n for n in loop.body if isinstance(n, ast.FunctionDef) and n.name == "step")
    assert step.end_lineno is not None
    assert step.end_lineno - step.lineno + 1 <= STEP_LINES
    called = {
        node.func.attr
        for node in ast.walk(step)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert {"_schedule", "_run", "_postprocess"} <= called


def test_the_check_sees_a_circle(tmp_path: Path) -> None:
    """The checks themselves: a circle through a function-level and a relative import,
    and an import up the layers, are found."""
    pkg = tmp_path / PACKAGE
    for folder in ("model", "serving"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "a.py").write_text("from .b import x\n")
    (pkg / "model" / "b.py").write_text("def f():\n    from ..model import a\n")
    (pkg / "model" / "c.py").write_text("from ..serving.d import y\n")
    (pkg / "serving" / "d.py").write_text("from hearth_engine.model.c import z\n")
    graph, _ = import_graph(tmp_path)
    assert cycles(graph) == [
        ["hearth_engine.model.a", "hearth_engine.model.b", "hearth_engine.model.a"],
        ["hearth_engine.model.c", "hearth_engine.serving.d", "hearth_engine.model.c"],
    ]
    assert layer_breaks(graph) == [
        "hearth_engine.model.c (model) imports hearth_engine.serving.d (serving)"
    ]


def test_the_check_sees_a_circle_and_a_break_in_subfolders(tmp_path: Path) -> None:
    """A circle between two subfolders' modules, and a subfolder's import up the layers
    (``model/quant`` into ``serving/sub``), are found as in top folders."""
    pkg = tmp_path / PACKAGE
    for folder in ("model", "model/quant", "model/prepare", "serving", "serving/sub"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "quant" / "a.py").write_text("from ..prepare.b import x\n")
    (pkg / "model" / "prepare" / "b.py").write_text("from ...model.quant import a\n")
    (pkg / "model" / "quant" / "c.py").write_text("from ...serving.sub.d import y\n")
    (pkg / "serving" / "sub" / "d.py").write_text("z = 1\n")
    graph, _ = import_graph(tmp_path)
    assert cycles(graph) == [
        [
            "hearth_engine.model.prepare.b",
            "hearth_engine.model.quant.a",
            "hearth_engine.model.prepare.b",
        ],
    ]
    assert layer_breaks(graph) == [
        "hearth_engine.model.quant.c (model) imports hearth_engine.serving.sub.d (serving)"
    ]
