"""Actions: hearth.refresh_prefix and hearth.clear_cache (real engine)."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN
from custom_components.hearth.pins import pin_name

from .common import EngineProcess


async def test_refresh_prefix(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess
) -> None:
    """Pins again now; an unchanged prefix is not counted as a re-pin."""
    name = pin_name(next(iter(entry.subentries)))
    engine.request("DELETE", f"/v1/prefixes/{name}")
    await hass.services.async_call(
        DOMAIN, "refresh_prefix", {"config_entry_id": entry.entry_id}, blocking=True
    )
    assert name in engine.pins()
    assert entry.runtime_data.prefixes.repins == 0


async def test_clear_cache(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    response = await hass.services.async_call(
        DOMAIN, "clear_cache", {}, blocking=True, return_response=True
    )
    assert isinstance(response["freed_bytes"], int)
    assert response["freed_bytes"] >= 0


async def test_actions_need_a_loaded_entry(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    await hass.config_entries.async_unload(entry.entry_id)
    with pytest.raises(HomeAssistantError):
        await hass.services.async_call(
            DOMAIN, "clear_cache", {"config_entry_id": entry.entry_id}, blocking=True
        )
