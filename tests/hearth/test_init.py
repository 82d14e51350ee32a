"""Entry lifecycle: setup, retry, unload, agents removed, entry removed."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from unittest.mock import patch

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.api import HearthClient
from custom_components.hearth.const import DOMAIN, SERVICE_REFRESH_PREFIX
from custom_components.hearth.pins.model import pin_name

from .common import (
    ENGINE_KEY,
    EngineProcess,
    async_setup_entry,
    converse,
    free_port,
    make_entry,
    speech,
)


async def test_setup_and_unload(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess
) -> None:
    name = pin_name(next(iter(entry.subentries)))
    assert entry.state is ConfigEntryState.LOADED
    assert name in engine.pins()
    assert speech(await converse(hass, "hello")) == "Hello from Hearth."

    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.NOT_LOADED
    # The pin stays: after an HA restart the same PUT finds it cached.
    assert name in engine.pins()
    assert hass.states.get("conversation.hearth").state == "unavailable"


async def test_setup_retries_while_the_engine_is_down(
    hass: HomeAssistant, house: None, socket_enabled: None
) -> None:
    entry = make_entry(f"http://127.0.0.1:{free_port()}")
    entry.add_to_hass(hass)
    assert not await hass.config_entries.async_setup(entry.entry_id)
    assert entry.state is ConfigEntryState.SETUP_RETRY


async def test_removed_agent_and_entry_drop_their_pins(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, keyed: EngineProcess
) -> None:
    subentry_id = next(iter(entry.subentries))
    assert pin_name(subentry_id) in engine.pins()
    hass.config_entries.async_remove_subentry(entry, subentry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert pin_name(subentry_id) not in engine.pins()
    assert entry.state is ConfigEntryState.LOADED
    assert hass.states.get("conversation.hearth") is None

    second = make_entry(keyed.url, api_key=ENGINE_KEY)
    await async_setup_entry(hass, second)
    second_pin = pin_name(next(iter(second.subentries)))
    assert second_pin in keyed.pins()
    await hass.config_entries.async_remove(second.entry_id)
    await hass.async_block_till_done()
    assert second_pin not in keyed.pins()


async def test_devices_show_the_engine_version_and_who_serves_the_agent(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess
) -> None:
    devices = dr.async_get(hass)
    engine_device = devices.async_get_device_by_identifier((DOMAIN, entry.entry_id), entry.entry_id)
    assert engine_device is not None
    reported = engine.request("GET", "/v1/stats")["version"]
    assert engine_device.sw_version == reported != "unknown"
    agent = devices.async_get_device_by_identifier(
        (DOMAIN, next(iter(entry.subentries))), entry.entry_id
    )
    assert agent is not None
    assert agent.via_device_id == engine_device.id


async def test_removed_agent_while_its_pin_is_in_flight_leaves_no_pin(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess
) -> None:
    """An agent removed while its PUT is in flight: the DELETE waits for the PUT's answer,
    so the engine is left without the pin (it finishes a PUT it received even when the
    client goes away: the shielded task below stands for that)."""
    subentry_id = next(iter(entry.subentries))
    name = pin_name(subentry_id)
    release = asyncio.Event()
    original = HearthClient.async_put_prefix

    async def engine_still_working(client: HearthClient, pin: str, body: Any) -> dict[str, Any]:
        async def received() -> dict[str, Any]:
            await release.wait()
            return await original(client, pin, body)

        task = hass.async_create_background_task(received(), "PUT received by the engine")
        return await asyncio.shield(task)

    with patch.object(HearthClient, "async_put_prefix", engine_still_working):
        refresh = hass.async_create_task(
            hass.services.async_call(DOMAIN, SERVICE_REFRESH_PREFIX, blocking=True)
        )
        await asyncio.sleep(0.1)  # the PUT is in flight
        hass.config_entries.async_remove_subentry(entry, subentry_id)
        await asyncio.sleep(0.5)  # time for a DELETE to reach the engine
        release.set()
        with contextlib.suppress(HomeAssistantError, asyncio.CancelledError):
            await refresh
        await hass.async_block_till_done(wait_background_tasks=True)
    assert name not in engine.pins()
    assert entry.state is ConfigEntryState.LOADED
