"""A dataset home in °F, or with a volume on another scale, runs in the demo (issue 48.9).

Before, a thermostat at 72 (°F) was refused ("value must be at most 60 at 'current'"),
and the bench's reset ended its run with a 400. Here, in a real Home Assistant with the
US customary unit system (what the bench gives a home written in °F), the demo builds
the home as written, reads it back as written, takes Assist's intents in °F, and takes
a reset in °F; a volume written as a percentage is HA's 0-1; a value no scale takes is
a clear refusal of the reset, not a crash.
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
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component
from homeassistant.util.unit_system import US_CUSTOMARY_SYSTEM

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "config"))  # custom_components.hearth_demo lives in config/

FIXTURE: dict[str, Any] = {
    "areas": [{"name": "Den", "id": "den"}],
    "entities": [
        {"name": "Thermostat", "id": "climate.thermostat", "area": "den", "state": "heat",
         "attributes": {"current_temperature": 72, "temperature": 70}},
        {"name": "Speaker", "id": "media_player.speaker", "area": "den", "state": "playing",
         "attributes": {"volume_level": 30, "media_track": 2}},
        {"name": "Porch", "id": "sensor.porch", "area": "den", "state": "64",
         "attributes": {"device_class": "temperature", "unit_of_measurement": "°F"}},
    ],
}  # fmt: skip


@pytest.fixture
async def home(hass: HomeAssistant, tmp_path: Path) -> HomeAssistant:
    """The fixture home in a running demo integration, Home Assistant in °F."""
    hass.config.units = US_CUSTOMARY_SYSTEM
    path = tmp_path / "_fixtures.yaml"
    path.write_text(yaml.safe_dump(FIXTURE, allow_unicode=True))
    config = {"hearth": {"enabled": False}, "fixtures": str(path)}
    assert await async_setup_component(hass, "homeassistant", {})
    with patch("custom_components.hearth_demo.async_ensure_access"):
        assert await async_setup_component(hass, "hearth_demo", {"hearth_demo": config})
        await hass.async_block_till_done()
    for component in ("intent", "climate", "media_player"):
        assert await async_setup_component(hass, component, {})
    return hass


async def set_states(hass: HomeAssistant, states: dict[str, Any]) -> None:
    await hass.services.async_call("hearth_demo", "set_states", {"states": states}, blocking=True)
    await hass.async_block_till_done()


async def test_a_home_in_fahrenheit_reads_back_as_written(home: HomeAssistant) -> None:
    thermostat = home.states.get("climate.thermostat")
    assert thermostat is not None
    attributes = thermostat.attributes
    assert (attributes["current_temperature"], attributes["temperature"]) == (72, 70)
    assert (attributes["min_temp"], attributes["max_temp"]) == (45, 86)  # 7-30 °C, as HA shows °F
    porch = home.states.get("sensor.porch")
    assert (float(porch.state), porch.attributes["unit_of_measurement"]) == (64, "°F")
    await intent.async_handle(
        home, "test", "HassClimateSetTemperature",
        {"name": {"value": "Thermostat"}, "temperature": {"value": 68}},
    )  # fmt: skip
    await home.async_block_till_done()
    assert home.states.get("climate.thermostat").attributes["temperature"] == 68
    # The reset the bench sends before each sentence, in °F (refused before: max 60).
    warm = {"current_temperature": 75, "temperature": 74}
    await set_states(home, {"climate.thermostat": {"state": "cool", "attributes": warm}})
    after = home.states.get("climate.thermostat")
    assert after.state == "cool" and after.attributes["current_temperature"] == 75


async def test_a_volume_as_a_percentage_is_home_assistants_scale(home: HomeAssistant) -> None:
    assert home.states.get("media_player.speaker").attributes["volume_level"] == 0.3
    await set_states(home, {"media_player.speaker": {"attributes": {"volume_level": 0.55}}})
    assert home.states.get("media_player.speaker").attributes["volume_level"] == 0.55
    await set_states(home, {"media_player.speaker": {"attributes": {"volume_level": 80}}})
    assert home.states.get("media_player.speaker").attributes["volume_level"] == 0.8
    # No scale has 300: the reset is refused with the entity and the reason, and
    # nothing of it is applied.
    with pytest.raises(ServiceValidationError, match=r"media_player\.speaker: .*volume"):
        await set_states(
            home,
            {
                "climate.thermostat": {"attributes": {"temperature": 71}},
                "media_player.speaker": {"attributes": {"volume_level": 300}},
            },
        )
    assert home.states.get("climate.thermostat").attributes["temperature"] == 70
