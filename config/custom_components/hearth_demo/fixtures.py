"""A dataset home (``_fixtures.yaml``) as demo house specs.

The format is the public one of allenporter/home-assistant-datasets: ``floors`` (name,
id), ``areas`` (name, id, optional floor: a floor's id, or its name), ``devices`` (name,
id, area) and ``entities`` (name, entity id, area or device, ``state``,
``attributes``). Entity ids are kept exactly, because the dataset's expected changes
are keyed by them. Each entity's state becomes the options of its demo platform
(fixture_states.py). An entity the demo cannot build (a domain it has no platform for,
a state it cannot take) is left out with its reason: the rest of the home is built.
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
from .helpers import HELPER_DOMAINS, HelperSpec
from .model import AreaSpec, EntitySpec, FloorSpec

Validate = Callable[[Platform, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class FixtureHome:
    """What a `_fixtures.yaml` adds to the house; ``devices`` are the device ids."""

    floors: list[FloorSpec]
    areas: list[AreaSpec]
    entities: list[EntitySpec]
    devices: tuple[str, ...]
    left_out: tuple[str, ...] = ()  # "<entity id>: <why>" for each entity not built
    helpers: tuple[HelperSpec, ...] = ()  # input_*, script: Home Assistant's own


def _platform(entity_id: str) -> Platform:
    domain = entity_id.split(".", 1)[0]
    try:
        return Platform(domain)
    except ValueError as err:
        raise probatio.Invalid(f"the demo cannot build {domain} entities") from err


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
        raise probatio.Invalid(f"the demo cannot build {platform} entities") from err
    except (TypeError, ValueError) as err:
        raise probatio.Invalid(str(err)) from err
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
    floor_names = {
        str(item.get("id") or item["name"]): str(item["name"]) for item in data.get("floors") or []
    }
    floors = [FloorSpec(name=name, level=n) for n, name in enumerate(floor_names.values())]
    area_names: dict[str, str] = {}
    areas: list[AreaSpec] = []
    for item in data.get("areas") or []:
        name = str(item["name"])
        area_names[str(item.get("id") or name)] = name
        floor = item.get("floor")
        floor = None if floor is None else floor_names.get(str(floor), str(floor))
        if floor is not None and all(f.name != floor for f in floors):
            floors.append(FloorSpec(name=floor, level=len(floors)))
        areas.append(AreaSpec(name=name, floor=floor))
    device_areas = {str(device["id"]): device.get("area") for device in data.get("devices") or []}
    entities = []
    left_out = []
    helpers = []
    for item in data["entities"]:
        area_id = item.get("area") or device_areas.get(str(item.get("device")))
        if area_id is not None and str(area_id) not in area_names:
            raise probatio.Invalid(f"fixture entity {item.get('id')}: unknown area {area_id}")
        domain, _, object_id = str(item["id"]).partition(".")
        if domain in HELPER_DOMAINS:
            name = str(item.get("name") or object_id)
            attributes = dict(item.get("attributes") or {})
            area = area_names.get(str(area_id))
            helpers.append(HelperSpec(domain, object_id, name, area, item.get("state"), attributes))
            continue
        try:
            entities.append(entity_spec(item, area_names.get(str(area_id)), validate))
        except probatio.Invalid as err:
            left_out.append(f"{item.get('id')}: {err}")
    return FixtureHome(
        floors, areas, entities, tuple(device_areas), tuple(left_out), tuple(helpers)
    )
