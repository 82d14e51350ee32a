"""A bigger demo house: N guest suites added to it, each furnished like the demo's rooms.

``scripts/develop --house-scale N`` and ``scripts/bench household|accuracy --house-scale
N`` start Home Assistant with ``HEARTH_HOUSE_SCALE=N``; the demo integration then adds
the floor "Guest Wing" with the areas "Guest Suite 1" to "Guest Suite N" to the house
(house.yaml or a dataset home), six exposed entities each: a ceiling light, a reading
lamp, a thermostat, blinds, a temperature sensor, and a door lock (odd suites) or a
kettle plug (even ones). With the demo's 106 entities, N = 32 makes 298 and N = 150
makes 1,006. Names, aliases and states follow from the suite's number alone, so a scale
always builds the same house.

Pure, and the standard library only: the bench (another Python, without Home
Assistant) loads this file for the same rule on N.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENV_HOUSE_SCALE = "HEARTH_HOUSE_SCALE"
MAX_ROOMS = 1000
ENTITIES_PER_ROOM = 6
FLOOR = "Guest Wing"
ROOM = "Guest Suite"


def parse_rooms(text: str) -> int:
    """N as given on a command line or in the environment; ValueError says what is wrong."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()):  # no sign, no decimals
        raise ValueError(
            f"the house scale is a whole number of guest suites from 0 to {MAX_ROOMS}, not {text!r}"
        )
    rooms = int(value)
    if rooms > MAX_ROOMS:
        raise ValueError(
            f"the house scale is at most {MAX_ROOMS} guest suites"
            f" ({MAX_ROOMS * ENTITIES_PER_ROOM} entities), not {rooms}"
        )
    return rooms


def rooms_from_env(environ: Mapping[str, str]) -> int:
    """The guest suites asked for by ``HEARTH_HOUSE_SCALE`` (unset or empty: none)."""
    text = environ.get(ENV_HOUSE_SCALE, "")
    if not text.strip():
        return 0
    try:
        return parse_rooms(text)
    except ValueError as err:
        raise ValueError(f"{ENV_HOUSE_SCALE}: {err}") from None


def guest_suite(n: int) -> dict[str, Any]:
    """Suite ``n`` (from 1) as an area of house.yaml: its name, icon and six entities."""
    room = f"{ROOM} {n}"
    target = 19.0 + (n % 4) * 0.5
    current = round(target - 0.6 + (n % 3) * 0.4, 1)
    thermostat: dict[str, Any] = {
        "name": f"{room} Thermostat",
        "target": target,
        "current": current,
        "mode": "off" if n % 7 == 0 else "heat",
        "unit": "°C",  # its numbers are °C, also in a home that runs in °F
    }
    if n % 3 == 0:
        thermostat["aliases"] = [f"Suite {n} heating"]
    area: dict[str, Any] = {
        "name": room,
        "icon": "mdi:bed",
        "light": [
            {
                "name": f"{room} Ceiling Light",
                "aliases": [f"Suite {n} light"],
                "is_on": n % 3 == 0,
                "brightness": 40 + (n * 7) % 60,
            },
            {
                "name": f"{room} Reading Lamp",
                "aliases": [f"Suite {n} bedside lamp"],
                "is_on": n % 5 == 0,
                "color": n % 4 == 0,
            },
        ],
        "climate": [thermostat],
        "cover": [{"name": f"{room} Blinds", "device_class": "blind", "position": n * 25 % 125}],
        "sensor": [{"name": f"{room} Temperature", "kind": "temperature", "value": current}],
    }
    if n % 2:
        area["lock"] = [
            {"name": f"{room} Door Lock", "aliases": [f"Suite {n} door"], "locked": n % 6 != 5}
        ]
    else:
        area["switch"] = [{"name": f"{room} Kettle", "device_class": "outlet"}]
    return area


def scale_house(house: Mapping[str, Any], rooms: int) -> dict[str, Any]:
    """The house (a ``hearth_demo:`` mapping) with ``rooms`` guest suites on a floor of
    their own; ``house`` itself is left as it was. ValueError for a number out of range
    or a house that has the guest floor already."""
    if isinstance(rooms, bool) or not isinstance(rooms, int) or not 0 <= rooms <= MAX_ROOMS:
        raise ValueError(f"rooms must be a whole number from 0 to {MAX_ROOMS}, not {rooms!r}")
    scaled = dict(house)
    if rooms == 0:
        return scaled
    floors = list(house.get("floors") or [])
    if any(str(floor.get("name", "")).casefold() == FLOOR.casefold() for floor in floors):
        raise ValueError(f"the house has a floor named {FLOOR!r} already: it cannot be scaled")
    wing = {
        "name": FLOOR,
        "level": 0,
        "icon": "mdi:bed-double",
        "areas": [guest_suite(n) for n in range(1, rooms + 1)],
    }
    scaled["floors"] = [*floors, wing]
    return scaled
