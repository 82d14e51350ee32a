"""Hearth: a local voice-assistant backend with a pinned, cached house prefix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.const import CONF_API_KEY, CONF_URL, Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.helpers.typing import ConfigType

from .backend.api import HearthClient, HearthError
from .backend.coordinator import HearthCoordinator
from .config_flow_options import stall_timeout
from .const import (
    DOMAIN,
    LOGGER,
    SIGNAL_AGENT_OPTIONS_UPDATED,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from .data import HearthConfigEntry, HearthData
from .engine_device import async_register_engine_device
from .house.device_class import DeviceClass
from .pins.history import PinHistory
from .pins.manager import PrefixManager
from .pins.model import pin_key, pin_name
from .pins.repairs import async_delete_all as async_delete_issues
from .services import async_setup_services

CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)
PLATFORMS = (Platform.AI_TASK, Platform.BINARY_SENSOR, Platform.CONVERSATION, Platform.SENSOR)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Register the integration's actions."""
    async_setup_services(hass)
    return True


async def async_setup_entry(hass: HomeAssistant, entry: HearthConfigEntry) -> bool:
    """Connect to the engine, create the entities and pin every agent's prefix."""
    client = _client(hass, entry.data)
    coordinator = HearthCoordinator(hass, entry, client)
    await coordinator.async_config_entry_first_refresh()

    prefixes = PrefixManager(hass, entry, client, coordinator)
    await prefixes.async_load()
    entry.runtime_data = HearthData(
        client=client,
        coordinator=coordinator,
        prefixes=prefixes,
        loaded_data=dict(entry.data),
        loaded_subentries=_subentry_signature(entry),
        subentry_options={sid: dict(sub.data) for sid, sub in entry.subentries.items()},
    )
    # The engine's device first: agent devices name it as the device that serves them.
    entry.async_on_unload(async_register_engine_device(hass, entry))
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)

    prefixes.async_start()
    entry.async_on_unload(prefixes.async_stop)
    entry.async_on_unload(entry.add_update_listener(_async_update_listener))
    return True


async def async_unload_entry(hass: HomeAssistant, entry: HearthConfigEntry) -> bool:
    """Unload the entities (pins stay in the engine: a restart re-uses them)."""
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)


async def async_remove_entry(hass: HomeAssistant, entry: HearthConfigEntry) -> None:
    """The entry is deleted: drop its agents' pins from the engine (best effort)."""
    await _async_delete_pins(_client(hass, entry.data), entry.subentries)
    await PinHistory(hass, entry.entry_id).async_remove()


async def _async_update_listener(hass: HomeAssistant, entry: HearthConfigEntry) -> None:
    """Reload on engine or agent-set changes; re-pin an agent whose options changed;
    a new stall time applies from the next request."""
    data = entry.runtime_data
    data.backend.chat.stall = stall_timeout(entry.options)
    removed = {sid for sid, *_ in data.loaded_subentries} - set(entry.subentries)
    if removed:
        # Waits for a pin of theirs in flight, so its PUT cannot re-create what is deleted.
        await data.prefixes.async_remove_agents(removed)
        keys = {pin_key(sid, cls) for sid in removed for cls in DeviceClass}
        await data.prefixes.history.async_forget(keys)
        for key in keys:
            async_delete_issues(hass, key)
    if dict(entry.data) != data.loaded_data or _subentry_signature(entry) != data.loaded_subentries:
        hass.config_entries.async_schedule_reload(entry.entry_id)
        return
    for subentry_id, subentry in entry.subentries.items():
        if dict(subentry.data) == data.subentry_options.get(subentry_id):
            continue
        data.subentry_options[subentry_id] = dict(subentry.data)
        data.prefixes.async_options_changed(subentry_id)
        async_dispatcher_send(hass, SIGNAL_AGENT_OPTIONS_UPDATED.format(subentry_id))


def _client(hass: HomeAssistant, data: Mapping[str, Any]) -> HearthClient:
    return HearthClient(async_get_clientsession(hass), data[CONF_URL], data.get(CONF_API_KEY))


def _subentry_signature(entry: HearthConfigEntry) -> frozenset[tuple[str, str, str]]:
    return frozenset((sid, sub.subentry_type, sub.title) for sid, sub in entry.subentries.items())


async def _async_delete_pins(client: HearthClient, subentry_ids: Any) -> None:
    """Delete every pin of the subentries, one per device class (most do not exist)."""
    for subentry_id in subentry_ids:
        for cls in DeviceClass:
            try:
                await client.async_delete_prefix(pin_name(subentry_id, cls))
            except HearthError as err:
                LOGGER.debug("Could not delete the pin of %s (%s): %s", subentry_id, cls, err)


__all__ = ["DOMAIN", "SUBENTRY_AI_TASK", "SUBENTRY_CONVERSATION", "HearthConfigEntry"]
