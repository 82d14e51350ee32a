"""The engine entry's service device: named after the entry, and kept current; the
service devices of its agents (``agent_device_info``) and the base of the engine
device's entities (``HearthCoordinatorEntity``).

Its model and software version are what the server reports at each poll (a restarted
engine may serve another model or run a newer release), so the device registry is
updated from the coordinator rather than frozen at set-up.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.update_coordinator import CoordinatorEntity

from .backend.coordinator import HearthCoordinator
from .const import DOMAIN
from .data import HearthConfigEntry


def public_url(url: str) -> str:
    """``url`` without the user name and password it may carry (shown on the device page)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


def engine_device_info(entry: HearthConfigEntry) -> dr.DeviceInfo:
    """The service device of an engine entry: the entry's title, the served model, and
    the software serving it (Hearth, or llama.cpp, vLLM, SGLang...); its configuration
    URL without credentials."""
    data = entry.runtime_data
    status = data.coordinator.data
    return dr.DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=entry.title,
        manufacturer=data.backend.manufacturer,
        model=status.model if status else None,
        sw_version=status.version if status else None,
        configuration_url=public_url(data.client.url),
        entry_type=dr.DeviceEntryType.SERVICE,
    )


@callback
def async_register_engine_device(hass: HomeAssistant, entry: HearthConfigEntry) -> CALLBACK_TYPE:
    """Register the engine's device and keep it current; returns the unsubscribe."""
    registry = dr.async_get(hass)
    device = registry.async_get_or_create(
        config_entry_id=entry.entry_id, **engine_device_info(entry)
    )
    entry.runtime_data.engine_device_id = device.id

    @callback
    def _async_update() -> None:
        if (current := registry.async_get(device.id)) is None:
            return  # removed by the user
        info = engine_device_info(entry)
        changes = {
            key: info.get(key)
            for key in ("name", "model", "sw_version", "manufacturer")
            if info.get(key) is not None and getattr(current, key) != info.get(key)
        }
        if changes:
            registry.async_update_device(device.id, **changes)

    return entry.runtime_data.coordinator.async_add_listener(_async_update)


MANUFACTURER = "Hearth"


def agent_device_info(
    entry: HearthConfigEntry, subentry: ConfigSubentry, model: str = "Conversation agent"
) -> dr.DeviceInfo:
    """The service device of an agent or AI task (subentry), served by the engine's device."""
    info = dr.DeviceInfo(
        identifiers={(DOMAIN, subentry.subentry_id)},
        name=subentry.title,
        manufacturer=MANUFACTURER,
        model=model,
        entry_type=dr.DeviceEntryType.SERVICE,
    )
    if (engine_device_id := entry.runtime_data.engine_device_id) is not None:
        info["via_device_id"] = engine_device_id  # the engine device is registered first
    return info


class HearthCoordinatorEntity(CoordinatorEntity[HearthCoordinator]):
    """An entity of the engine's service device, fed by the coordinator."""

    _attr_has_entity_name = True

    def __init__(self, entry: HearthConfigEntry, key: str) -> None:
        """Attach to the engine device of ``entry``."""
        coordinator = entry.runtime_data.coordinator
        super().__init__(coordinator)
        self.entry = entry
        self._attr_unique_id = f"{entry.entry_id}_{key}"
        self._attr_device_info = engine_device_info(entry)
