"""A dataset home (``_fixtures.yaml``) as demo house specs.

The format is the public one of allenporter/home-assistant-datasets: ``areas`` (name,
id, optional floor), ``devices`` (name, id, area) and ``entities`` (name, entity id,
area or device, ``state``, ``attributes``). Entity ids are kept exactly, because the
dataset's expected changes are keyed by them. Each entity's state becomes the options of
its demo platform (fixture_states.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import probatio
import yaml
from homeassistant.const import Platform

from .fixture_states import options_from_fixture
from .model import AreaSpec, EntitySpec, FloorSpec

Validate = Callable[[Platform, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class FixtureHome:
    """What a `_fixtures.yaml` adds to the house; ``devices`` are the device ids."""

    floors: list[FloorSpec]
    areas: list[AreaSpec]
    entities: list[EntitySpec]
    devices: tuple[str, ...]


def _platform(entity_id: str) -> Platform:
    domain = entity_id.split(".", 1)[0]
    try:
        return Platform(domain)
    except ValueError as err:
        raise probatio.Invalid(f"fixture entity {entity_id}: unknown domain {domain}") from err


def read_fixture(path: Path) -> dict[str, Any]:
    """The parsed file; raises probatio.Invalid when it is not a mapping with entities."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise probatio.Invalid(f"cannot read fixtures {path}: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("entities"), list):
        raise probatio.Invalid(f"fixtures {path}: no `entities` list")
    return data


def entity_spec(item: dict[str, Any], area: str | None, validate: Validate) -> EntitySpec:
    """One fixture entity as a spec; its state becomes the platform's options."""
    entity_id = str(item["id"])
    platform = _platform(entity_id)
    try:
        raw = options_from_fixture(platform, item.get("state"), item.get("attributes"))
    except KeyError as err:
        raise probatio.Invalid(f"fixture entity {entity_id}: unsupported domain") from err
    except (TypeError, ValueError) as err:
        raise probatio.Invalid(f"fixture entity {entity_id}: {err}") from err
    object_id = entity_id.split(".", 1)[1]
    return EntitySpec(
        platform=platform,
        unique_id=object_id,
        name=str(item.get("name") or object_id),
        area=area,
        options=validate(platform, raw),
        object_id=object_id,
    )


def load_fixture_home(path: Path, validate: Validate) -> FixtureHome:
    """Floors, areas and entities of a dataset home; raises probatio.Invalid."""
    data = read_fixture(path)
    area_names: dict[str, str] = {}
    floors: list[FloorSpec] = []
    areas: list[AreaSpec] = []
    for item in data.get("areas") or []:
        name = str(item["name"])
        area_names[str(item.get("id") or name)] = name
        floor = item.get("floor")
        if floor is not None and all(f.name != str(floor) for f in floors):
            floors.append(FloorSpec(name=str(floor), level=len(floors)))
        areas.append(AreaSpec(name=name, floor=None if floor is None else str(floor)))
    device_areas = {str(device["id"]): device.get("area") for device in data.get("devices") or []}
    entities = []
    for item in data["entities"]:
        area_id = item.get("area") or device_areas.get(str(item.get("device")))
        if area_id is not None and str(area_id) not in area_names:
            raise probatio.Invalid(f"fixture entity {item.get('id')}: unknown area {area_id}")
        entities.append(entity_spec(item, area_names.get(str(area_id)), validate))
    return FixtureHome(floors, areas, entities, tuple(device_areas))
