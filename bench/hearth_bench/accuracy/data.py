"""Home-control datasets in the public format of allenporter/home-assistant-datasets.

A *home* is a folder with a ``_fixtures.yaml`` (areas, devices, entities with their
states and attributes) and test files. A test file has a ``category`` (a name or a
list) and ``tests``: each with ``sentences`` (each one request), an optional ``setup``
(entity states that override the fixture's before the request), ``expect_changes``
(the state and attribute changes the request must cause), ``ignore_changes``
(attributes, or ``state``, allowed to change as well), ``expect_response`` (a substring,
or a list of which one must appear in the reply), ``expect_tool_call`` (a tool the model
must call: ``tool_name``) and ``context_device`` (the device the request comes from).
Other files (``dataset_card.yaml``...) are skipped. The fixture's ``language`` (as in
the format; ``en`` when absent or null) is the language the home is spoken to in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

FIXTURES = "_fixtures.yaml"


class DatasetError(ValueError):
    """The dataset does not follow the format (file and reason in the message)."""


@dataclass(frozen=True)
class EntityState:
    """A state and/or attributes, as the format writes them (None: not given)."""

    state: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: Any, where: str) -> EntityState:
        if value is None:
            return cls()
        if not isinstance(value, Mapping) or set(value) - {"state", "attributes"}:
            raise DatasetError(f"{where}: expected a mapping of state and attributes")
        return cls(value.get("state"), dict(value.get("attributes") or {}))

    def as_dict(self) -> dict[str, Any]:
        """The fixture form (what ``hearth_demo.set_states`` takes)."""
        return {"state": self.state, "attributes": dict(self.attributes)}


@dataclass(frozen=True)
class Task:
    """One sentence to say, with what must follow from it."""

    home: str
    record: str  # the test file, relative to the home
    categories: tuple[str, ...]
    sentence: str
    setup: dict[str, EntityState]
    expect_changes: dict[str, EntityState] | None
    ignore_changes: dict[str, set[str]]
    expect_response: tuple[str, ...]
    context_device: str | None
    expect_tool: str | None = None  # expect_tool_call's tool_name


@dataclass(frozen=True)
class Home:
    """A dataset home: its fixture file, its entities' fixture states, and its tasks."""

    name: str
    fixtures: Path
    entities: dict[str, EntityState]
    tasks: list[Task]
    language: str = "en"

    def states_for(self, task: Task) -> dict[str, dict[str, Any]]:
        """Every fixture entity's state with the task's ``setup`` laid over it."""
        states = {}
        for entity_id, base in self.entities.items():
            override = task.setup.get(entity_id, EntityState())
            states[entity_id] = {
                "state": base.state if override.state is None else override.state,
                "attributes": {**base.attributes, **override.attributes},
            }
        return states


def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise DatasetError(f"{path}: {err}") from err


def _states(value: Any, where: str) -> dict[str, EntityState]:
    if not isinstance(value, Mapping):
        raise DatasetError(f"{where}: expected a mapping of entity ids")
    return {str(k): EntityState.parse(v, f"{where} {k}") for k, v in value.items()}


def _ignored(value: Any) -> dict[str, set[str]]:
    """``{entity_id: [attribute, ...]}`` (a mapping's keys count as the list)."""
    return {str(k): {str(a) for a in (v or ())} for k, v in (value or {}).items()}


def _responses(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(str(v) for v in value) if isinstance(value, list) else (str(value),)


def _tasks(home: str, path: Path, rel: str, data: Mapping[str, Any]) -> Iterator[Task]:
    category = data.get("category", "uncategorized")
    categories = tuple(str(c) for c in category) if isinstance(category, list) else (str(category),)
    for n, test in enumerate(data.get("tests") or []):
        where = f"{path} test {n + 1}"
        sentences = test.get("sentences") or []
        if not sentences:
            raise DatasetError(f"{where}: no sentences")
        expect = test.get("expect_changes")
        for sentence in sentences:
            yield Task(
                home=home,
                record=rel,
                categories=categories,
                sentence=str(sentence),
                setup=_states(test.get("setup") or {}, f"{where} setup"),
                expect_changes=_states(expect, f"{where} expect_changes") if expect else None,
                ignore_changes=_ignored(test.get("ignore_changes")),
                expect_response=_responses(test.get("expect_response")),
                context_device=test.get("context_device"),
                expect_tool=(test.get("expect_tool_call") or {}).get("tool_name"),
            )


def load_home(folder: Path) -> Home:
    """A home folder; raises DatasetError when a file breaks the format."""
    fixtures = _load(folder / FIXTURES)
    if not isinstance(fixtures, Mapping) or not isinstance(fixtures.get("entities"), list):
        raise DatasetError(f"{folder / FIXTURES}: no `entities` list")
    entities = {
        str(item["id"]): EntityState(item.get("state"), dict(item.get("attributes") or {}))
        for item in fixtures["entities"]
    }
    tasks: list[Task] = []
    for path in sorted(folder.rglob("*.yaml")):
        data = _load(path) if path.name != FIXTURES else None
        if not isinstance(data, Mapping) or "tests" not in data:
            continue
        tasks.extend(_tasks(folder.name, path, str(path.relative_to(folder)), data))
    for task in tasks:
        named = set(task.setup) | set(task.expect_changes or {})
        if unknown := sorted(named - set(entities)):
            raise DatasetError(f"{folder / task.record}: not in the fixtures: {unknown}")
    language = str(fixtures.get("language") or "en")
    return Home(folder.name, folder / FIXTURES, entities, tasks, language)


def load_dataset(path: Path) -> list[Home]:
    """A single home (a folder with ``_fixtures.yaml``) or a folder of homes."""
    if (path / FIXTURES).is_file():
        return [load_home(path)]
    homes = [load_home(p.parent) for p in sorted(path.glob(f"*/{FIXTURES}"))]
    if not homes:
        raise DatasetError(f"{path}: no home (no {FIXTURES} here or one level down)")
    return homes
