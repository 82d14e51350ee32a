"""Actions: hearth.refresh_prefix and hearth.clear_cache (real engine)."""

from __future__ import annotations

from collections.abc import Callable

import probatio
import pytest
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import DOMAIN
from custom_components.hearth.pins.model import pin_name

from .common import EngineProcess, async_setup_entry, make_entry


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


async def test_actions_with_the_engine_down_are_translated_errors(
    hass: HomeAssistant, house: None, private_engine_factory: Callable[..., EngineProcess]
) -> None:
    """An engine that stopped: both actions fail with the integration's own error (the
    reason in words), not a client exception."""
    engine = private_engine_factory()
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    engine.stop()
    target = {"config_entry_id": entry.entry_id}
    for action in ("refresh_prefix", "clear_cache"):
        with pytest.raises(HomeAssistantError) as raised:
            await hass.services.async_call(DOMAIN, action, target, blocking=True)
        assert raised.value.translation_domain == DOMAIN
        assert raised.value.translation_key == "cannot_connect"
        assert "failed" in raised.value.translation_placeholders["error"]


async def test_actions_refuse_an_unknown_entry(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    with pytest.raises(ServiceValidationError):
        await hass.services.async_call(
            DOMAIN, "refresh_prefix", {"config_entry_id": "no-such-entry"}, blocking=True
        )
    with pytest.raises(probatio.Invalid):
        await hass.services.async_call(DOMAIN, "clear_cache", {"entity_id": "x"}, blocking=True)
