"""The demo integration builds a dataset home from its `_fixtures.yaml`, in a real HA.

The accuracy benchmark relies on this: entity ids as the fixture writes them, the
fixture's states, entities that obey Assist's intents like real ones (a light turned on
reports on, a fan runs at full speed, a to-do item is counted, a vacuum starts), and
`hearth_demo.set_states` putting a home back in a given state between requests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import yaml
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "config"))  # custom_components.hearth_demo lives in config/

FIXTURE: dict[str, Any] = {
    "areas": [
        {"name": "Kitchen", "id": "kitchen", "floor": "Ground"},
        {"name": "Bedroom", "id": "bedroom"},
    ],
    "devices": [
        {"name": "Kitchen Light", "id": "kitchen_light", "area": "kitchen"},
        {"name": "Satellite", "id": "satellite", "area": "kitchen"},
    ],
    "entities": [
        {
            "name": "Kitchen Light",
            "id": "light.kitchen_light",
            "device": "kitchen_light",
            "attributes": {"supported_color_modes": ["brightness"], "brightness": 100},
        },
        {
            "name": "Bedroom Fan",
            "id": "fan.bedroom_fan",
            "area": "bedroom",
            "state": "off",
            "attributes": {"supported_features": ["fan.FanEntityFeature.SET_SPEED"]},
        },
        {
            "name": "Garage Door",
            "id": "cover.garage_door",
            "area": "kitchen",
            "state": False,
            "attributes": {"device_class": "cover.CoverDeviceClass.GARAGE"},
        },
        {"name": "Shopping", "id": "todo.shopping", "attributes": {"todo_items": ["milk"]}},
        {"name": "Robot", "id": "vacuum.robot", "area": "bedroom", "state": "docked"},
        {
            "name": "Water Valve",
            "id": "valve.water_valve",
            "area": "kitchen",
            "attributes": {"current_position": 0, "reports_position": True},
        },
        {"name": "Back Door", "id": "lock.back_door", "area": "kitchen", "state": "locked"},
        {
            "name": "Thermostat",
            "id": "climate.thermostat",
            "area": "bedroom",
            "attributes": {"hvac_mode": "heat", "target_temperature": 19},
        },
        {
            "name": "Speaker",
            "id": "media_player.speaker",
            "area": "kitchen",
            "state": "playing",
            "attributes": {"volume_level": 0.6, "media_track": 1},
        },
        {"name": "Plug", "id": "switch.plug", "area": "kitchen", "state": True},
        {
            "name": "Battery",
            "id": "sensor.battery",
            "area": "kitchen",
            "state": "90",
            "attributes": {
                "device_class": "sensor.SensorDeviceClass.BATTERY",
                "native_unit_of_measurement": "%",
            },
        },
        {"name": "Door", "id": "binary_sensor.door", "area": "kitchen", "state": True},
    ],
}


@pytest.fixture
async def home(hass: HomeAssistant, tmp_path: Path) -> HomeAssistant:
    """A running demo integration with the fixture home and no Hearth.

    The demo user and token (access.py) are left out: the test instance has no
    Home Assistant auth provider, and they have nothing to do with the home.
    """
    path = tmp_path / "_fixtures.yaml"
    path.write_text(yaml.safe_dump(FIXTURE))
    config = {
        "hearth": {"enabled": False},
        "fixtures": str(path),
        "user": {
            "password_file": str(tmp_path / "password"),
            "token_file": str(tmp_path / "token"),
        },
    }
    assert await async_setup_component(hass, "homeassistant", {})
    with patch("custom_components.hearth_demo.async_ensure_access"):
        assert await async_setup_component(hass, "hearth_demo", {"hearth_demo": config})
        await hass.async_block_till_done()
    return hass


def state(hass: HomeAssistant, entity_id: str) -> Any:
    current = hass.states.get(entity_id)
    assert current is not None, f"{entity_id} does not exist"
    return current


async def test_the_fixture_home_is_built_with_its_ids_areas_and_states(home: HomeAssistant):
    light = state(home, "light.kitchen_light")
    assert (light.state, light.attributes["brightness"]) == ("on", 100)
    assert state(home, "fan.bedroom_fan").state == "off"
    assert state(home, "cover.garage_door").state == "closed"
    assert state(home, "todo.shopping").state == "1"
    assert state(home, "vacuum.robot").state == "docked"
    assert state(home, "valve.water_valve").state == "closed"
    assert state(home, "lock.back_door").state == "locked"
    assert state(home, "climate.thermostat").attributes["temperature"] == 19
    assert state(home, "media_player.speaker").attributes["volume_level"] == 0.6
    assert state(home, "switch.plug").state == "on"
    assert state(home, "sensor.battery").state == "90.0"
    assert state(home, "binary_sensor.door").state == "on"
    entry = er.async_get(home).async_get("light.kitchen_light")
    assert entry is not None
    area = ar.async_get(home).async_get_area(entry.area_id or "")
    assert area is not None and area.name == "Kitchen"  # the device's area


@pytest.mark.parametrize(
    ("intent_type", "slots", "entity_id", "expected"),
    [
        ("HassTurnOff", {"name": "Kitchen Light"}, "light.kitchen_light", {"state": "off"}),
        ("HassTurnOn", {"name": "Bedroom Fan"}, "fan.bedroom_fan", {"percentage": 100}),
        ("HassTurnOn", {"name": "Garage Door"}, "cover.garage_door", {"state": "open"}),
        ("HassTurnOn", {"name": "Water Valve"}, "valve.water_valve", {"current_position": 100}),
        ("HassVacuumStart", {"name": "Robot"}, "vacuum.robot", {"state": "cleaning"}),
        ("HassListAddItem", {"name": "Shopping", "item": "eggs"}, "todo.shopping", {"state": "2"}),
        ("HassTurnOff", {"name": "Back Door"}, "lock.back_door", {"state": "unlocked"}),
        ("HassMediaNext", {"name": "Speaker"}, "media_player.speaker", {"media_track": 2}),
        ("HassMediaPause", {"name": "Speaker"}, "media_player.speaker", {"state": "paused"}),
        ("HassClimateSetTemperature", {"name": "Thermostat", "temperature": 22},
         "climate.thermostat", {"temperature": 22}),
    ],
)  # fmt: skip
async def test_entities_obey_assist_intents(
    home: HomeAssistant, intent_type: str, slots: dict[str, Any], entity_id: str, expected: dict
) -> None:
    for component in ("intent", "todo", "vacuum", "media_player", "climate"):
        assert await async_setup_component(home, component, {})
    await intent.async_handle(
        home, "test", intent_type, {k: {"value": v} for k, v in slots.items()}
    )
    await home.async_block_till_done()
    after = state(home, entity_id)
    got = {key: after.state if key == "state" else after.attributes.get(key) for key in expected}
    assert got == expected


async def test_set_states_puts_the_home_back(home: HomeAssistant) -> None:
    await home.services.async_call(
        "hearth_demo",
        "set_states",
        {"states": {
            "light.kitchen_light": {"state": "off"},
            "fan.bedroom_fan": {"state": "on", "attributes": {
                "percentage": 40, "supported_features": ["fan.FanEntityFeature.SET_SPEED"]}},
            "todo.shopping": {"attributes": {"todo_items": ["a", "b", "c"]}},
        }},
        blocking=True,
    )  # fmt: skip
    assert state(home, "light.kitchen_light").state == "off"
    fan = state(home, "fan.bedroom_fan")
    assert (fan.state, fan.attributes["percentage"]) == ("on", 40)
    assert state(home, "todo.shopping").state == "3"


async def test_set_states_refuses_unknown_entities(home: HomeAssistant) -> None:
    with pytest.raises(ServiceValidationError, match=r"light\.nowhere"):
        await home.services.async_call(
            "hearth_demo",
            "set_states",
            {"states": {"light.nowhere": {"state": "on"}}},
            blocking=True,
        )
