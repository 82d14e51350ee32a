"""A demo house of any size (issue 49.4): guest suites added by HEARTH_HOUSE_SCALE.

The scaling (hearth_demo/scale.py) is checked on the real house.yaml through the demo's
own schema and model: how many areas and entities a scale adds, that the same scale
builds the same house, that every name stays unique, and that bad numbers are refused
with a message that says what is wrong. Then a real demo integration builds a scaled
house in Home Assistant's registries, and refuses a bad HEARTH_HOUSE_SCALE.
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.setup import async_setup_component
from homeassistant.util.yaml import load_yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "config"))  # custom_components.hearth_demo lives in config/

from custom_components.hearth_demo.model import House  # noqa: E402
from custom_components.hearth_demo.scale import (  # noqa: E402
    ENTITIES_PER_ROOM,
    ENV_HOUSE_SCALE,
    FLOOR,
    MAX_ROOMS,
    parse_rooms,
    rooms_from_env,
    scale_house,
)
from custom_components.hearth_demo.schema import HOUSE_SCHEMA, house_from_config  # noqa: E402

DEMO_ENTITIES = 106  # config/README.md
DEMO_AREAS = 15


@pytest.fixture(scope="module")
def raw_house() -> dict[str, Any]:
    """config/house.yaml as Home Assistant reads it (``!env_var`` resolved)."""
    return dict(load_yaml(ROOT / "config" / "house.yaml"))


def build(raw: dict[str, Any], rooms: int) -> House:
    return house_from_config(HOUSE_SCHEMA(scale_house(raw, rooms)), ROOT / "config")


def test_the_demo_house_is_as_its_readme_says(raw_house: dict[str, Any]) -> None:
    house = build(raw_house, 0)
    assert (len(house.areas), len(house.entities)) == (DEMO_AREAS, DEMO_ENTITIES)


@pytest.mark.parametrize(("rooms", "entities"), [(1, 112), (32, 298), (150, 1006)])
def test_a_scale_adds_that_many_suites_of_six_entities(
    raw_house: dict[str, Any], rooms: int, entities: int
) -> None:
    house = build(raw_house, rooms)
    assert len(house.entities) == entities == DEMO_ENTITIES + ENTITIES_PER_ROOM * rooms
    assert len(house.areas) == DEMO_AREAS + rooms
    assert [f.name for f in house.floors][-1] == FLOOR
    suites = [a for a in house.areas if a.floor == FLOOR]
    assert [a.name for a in suites] == [f"Guest Suite {n}" for n in range(1, rooms + 1)]
    for suite in suites:
        assert sum(e.area == suite.name for e in house.entities) == ENTITIES_PER_ROOM


def test_a_suite_has_the_common_kinds_with_aliases(raw_house: dict[str, Any]) -> None:
    house = build(raw_house, 12)
    twelve = {e.name: e for e in house.entities if e.area == "Guest Suite 12"}
    assert sorted(twelve) == [
        "Guest Suite 12 Blinds",
        "Guest Suite 12 Ceiling Light",
        "Guest Suite 12 Kettle",
        "Guest Suite 12 Reading Lamp",
        "Guest Suite 12 Temperature",
        "Guest Suite 12 Thermostat",
    ]
    lamp = twelve["Guest Suite 12 Reading Lamp"]
    assert (str(lamp.platform), lamp.unique_id) == ("light", "guest_suite_12_reading_lamp")
    assert lamp.aliases == ("Suite 12 bedside lamp",)
    assert twelve["Guest Suite 12 Thermostat"].options["unit"] == "°C"
    eleven = {e.name: e for e in house.entities if e.area == "Guest Suite 11"}
    assert str(eleven["Guest Suite 11 Door Lock"].platform) == "lock"
    platforms = {str(e.platform) for e in house.entities if e.area and "Guest Suite" in e.area}
    assert platforms == {"light", "climate", "cover", "sensor", "lock", "switch"}


def test_the_same_scale_builds_the_same_house(raw_house: dict[str, Any]) -> None:
    assert build(raw_house, 40) == build(raw_house, 40)
    assert scale_house(raw_house, 40) == scale_house(raw_house, 40)


def test_scaling_leaves_the_house_it_was_given_as_it_was(raw_house: dict[str, Any]) -> None:
    before = copy.deepcopy(raw_house)
    scale_house(raw_house, 5)
    assert raw_house == before
    assert scale_house(raw_house, 0) == raw_house


def test_every_name_and_alias_stays_unique(raw_house: dict[str, Any]) -> None:
    """No name a user could say means two things: entity names and aliases, area names."""
    house = build(raw_house, MAX_ROOMS)
    said = [n.casefold() for e in house.entities for n in (e.name, *e.aliases)]
    assert len(said) == len(set(said))
    areas = [n.casefold() for a in house.areas for n in (a.name, *a.aliases)]
    assert len(areas) == len(set(areas))
    ids = [f"{e.platform}.{e.unique_id}" for e in house.entities]
    assert len(ids) == len(set(ids))


def test_a_validated_house_validates_to_itself(raw_house: dict[str, Any]) -> None:
    """The integration scales the house Home Assistant validated, then validates again."""
    once = HOUSE_SCHEMA(raw_house)
    assert HOUSE_SCHEMA(once) == once


def test_a_house_scaled_twice_is_refused(raw_house: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="floor named 'Guest Wing' already"):
        scale_house(scale_house(raw_house, 2), 2)


@pytest.mark.parametrize("rooms", [-1, MAX_ROOMS + 1, 2.0, True, "3"])
def test_scale_house_refuses_a_bad_number(raw_house: dict[str, Any], rooms: Any) -> None:
    with pytest.raises(ValueError, match=f"from 0 to {MAX_ROOMS}"):
        scale_house(raw_house, rooms)


@pytest.mark.parametrize(("text", "rooms"), [("0", 0), ("32", 32), (" 150 ", 150), ("007", 7)])
def test_parse_rooms_reads_a_whole_number(text: str, rooms: int) -> None:
    assert parse_rooms(text) == rooms


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("abc", "whole number of guest suites from 0 to 1000, not 'abc'"),
        ("-3", "not '-3'"),
        ("3.5", "not '3.5'"),
        ("", "not ''"),
        ("\u00b2", "not '\u00b2'"),
        ("1001", "at most 1000 guest suites (6000 entities), not 1001"),
    ],
)
def test_parse_rooms_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=r"^the house scale is ") as raised:
        parse_rooms(text)
    assert str(raised.value).endswith(says)


def test_the_environment_names_itself_in_its_error() -> None:
    assert rooms_from_env({}) == 0
    assert rooms_from_env({ENV_HOUSE_SCALE: " "}) == 0
    assert rooms_from_env({ENV_HOUSE_SCALE: "4"}) == 4
    with pytest.raises(ValueError, match=f"^{ENV_HOUSE_SCALE}: the house scale is"):
        rooms_from_env({ENV_HOUSE_SCALE: "four"})


def demo_config(raw: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """house.yaml without Hearth, its secrets in tmp_path."""
    return {
        **raw,
        "hearth": {"enabled": False},
        "user": {
            "password_file": str(tmp_path / "password"),
            "token_file": str(tmp_path / "token"),
        },
    }


async def setup_demo(hass: HomeAssistant, config: dict[str, Any]) -> bool:
    assert await async_setup_component(hass, "homeassistant", {})
    with patch("custom_components.hearth_demo.async_ensure_access"):
        done = await async_setup_component(hass, "hearth_demo", {"hearth_demo": config})
        await hass.async_block_till_done()
    return done


async def test_the_integration_builds_the_scaled_house(
    hass: HomeAssistant, raw_house: dict[str, Any], tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv(ENV_HOUSE_SCALE, "3")
    assert await setup_demo(hass, demo_config(raw_house, tmp_path))
    wing = fr.async_get(hass).async_get_floor_by_name(FLOOR)
    assert wing is not None
    suite = ar.async_get(hass).async_get_area_by_name("Guest Suite 3")
    assert suite is not None
    assert suite.floor_id == wing.floor_id
    entry = er.async_get(hass).async_get("light.guest_suite_3_reading_lamp")
    assert entry is not None
    assert (entry.area_id, entry.aliases[1:]) == (suite.id, ["Suite 3 bedside lamp"])
    assert async_should_expose(hass, "conversation", "light.guest_suite_3_reading_lamp")
    demo = [e for e in er.async_get(hass).entities.values() if e.platform == "hearth_demo"]
    assert len(demo) == DEMO_ENTITIES + 3 * ENTITIES_PER_ROOM
    await hass.async_block_till_done()
    thermostat = hass.states.get("climate.guest_suite_3_thermostat")
    assert thermostat is not None
    assert thermostat.attributes["temperature"] == 20.5


async def test_a_bad_scale_in_the_environment_stops_the_demo(
    hass: HomeAssistant,
    raw_house: dict[str, Any],
    tmp_path: Path,
    monkeypatch: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(ENV_HOUSE_SCALE, "lots")
    with caplog.at_level(logging.ERROR):
        assert not await setup_demo(hass, demo_config(raw_house, tmp_path))
    assert f"Invalid demo house in house.yaml: {ENV_HOUSE_SCALE}: the house scale" in caplog.text
    assert ar.async_get(hass).async_get_area_by_name("Kitchen") is None
