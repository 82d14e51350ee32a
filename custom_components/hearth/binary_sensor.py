"""Engine connectivity (stays available: "off" while the engine is down)."""

from __future__ import annotations

from homeassistant.components.binary_sensor import (
    BinarySensorEntity,
    BinarySensorEntityDescription,
)
from homeassistant.components.binary_sensor.const import BinarySensorDeviceClass
from homeassistant.const import EntityCategory
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .data import HearthConfigEntry
from .engine_device import HearthCoordinatorEntity

PARALLEL_UPDATES = 0  # the coordinator does all the I/O

ENGINE_CONNECTED = BinarySensorEntityDescription(
    key="engine_connected",
    translation_key="engine_connected",
    device_class=BinarySensorDeviceClass.CONNECTIVITY,
    entity_category=EntityCategory.DIAGNOSTIC,
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the connectivity sensor."""
    async_add_entities([HearthConnectivitySensor(entry)])


class HearthConnectivitySensor(HearthCoordinatorEntity, BinarySensorEntity):
    """On while the last poll of the engine succeeded."""

    entity_description = ENGINE_CONNECTED

    def __init__(self, entry: HearthConfigEntry) -> None:
        """Attach to ``entry``'s engine device."""
        super().__init__(entry, ENGINE_CONNECTED.key)

    @property
    def available(self) -> bool:
        """Always available: a down engine is "disconnected", not "unknown"."""
        return True

    @property
    def is_on(self) -> bool:
        """Whether the engine answered the last poll."""
        return self.coordinator.last_update_success
