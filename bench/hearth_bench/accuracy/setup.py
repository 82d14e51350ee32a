"""A home's states as the bench can pass them on, and the unit system the home is in.

Every file of the public format must run. YAML gives values JSON cannot carry (a
calendar event's ``start: 2024-06-03 10:00:00`` is a ``datetime``; a ``context_now``
is a date or a time): those go on as text, as the demo reads a fixture's own (``str``).
A value that cannot go on at all (bytes, a number that is not finite, an object YAML
made) is left out of that sentence's reset with a one-line warning, never a traceback.

A home written in °F (a unit of ``°F`` on any entity, or a thermostat whose numbers no
room has in °C) runs in a Home Assistant with the US customary unit system, so its
temperatures read back as the fixture wrote them.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .data import EntityState

US_CUSTOMARY, METRIC = "us_customary", "metric"
UNIT_SYSTEM_LINE = re.compile(r"^(\s+unit_system:) \S+$", re.MULTILINE)
_UNIT_KEYS = ("unit_of_measurement", "native_unit_of_measurement", "temperature_unit")
_ROOM_CELSIUS_MAX = 45.0  # no room is warmer in °C; a thermostat above it is in °F
_CLIMATE_KEYS = ("current_temperature", "temperature", "target_temperature")


class Unpassable(ValueError):
    """A value JSON cannot carry (its message says what it is)."""


def plain(value: Any) -> Any:
    """``value`` as JSON carries it: dates and times as text, tuples and sets as lists;
    raises Unpassable for what has no such form."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unpassable(f"{value} is not a finite number")
        return value
    if isinstance(value, dt.date | dt.time | dt.timedelta):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [plain(v) for v in items]
    raise Unpassable(f"a {type(value).__name__} has no JSON form")


def passable(
    states: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``{entity_id: {state, attributes}}`` with every value in JSON's form, and one
    warning per value left out (``entity_id attribute: why``)."""
    out: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for entity_id, entry in states.items():
        try:
            state = plain(entry.get("state"))
        except Unpassable as err:
            warnings.append(f"{entity_id} state: {err}; left as it was")
            state = None
        attributes: dict[str, Any] = {}
        for key, value in (entry.get("attributes") or {}).items():
            try:
                attributes[str(key)] = plain(value)
            except Unpassable as err:
                warnings.append(f"{entity_id} {key}: {err}; left out")
        out[entity_id] = {"state": state, "attributes": attributes}
    return out, warnings


def unit_system(entities: Mapping[str, EntityState]) -> str:
    """The unit system a home is written in: US customary where it says °F anywhere or
    a thermostat's numbers are no room's in °C; metric otherwise."""
    for entity_id, entity in entities.items():
        attributes = entity.attributes
        if any(str(attributes.get(key, "")).strip() == "°F" for key in _UNIT_KEYS):
            return US_CUSTOMARY
        if entity_id.startswith("climate."):
            for key in _CLIMATE_KEYS:
                try:
                    if float(attributes.get(key, 0) or 0) > _ROOM_CELSIUS_MAX:
                        return US_CUSTOMARY
                except (TypeError, ValueError):
                    continue
    return METRIC


def set_unit_system(configuration: Path, system: str) -> bool:
    """Make Home Assistant's unit system ``system`` in a copied configuration.yaml;
    whether it had a ``unit_system:`` line to set."""
    text = configuration.read_text()
    new, count = UNIT_SYSTEM_LINE.subn(rf"\1 {system}", text, count=1)
    if count:
        configuration.write_text(new)
    return bool(count)
