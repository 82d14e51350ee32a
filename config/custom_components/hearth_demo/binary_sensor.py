"""Demo binary sensors (doors, windows, motion...): they read what they are given."""

from __future__ import annotations

import contextlib
from typing import Any

from homeassistant.components.binary_sensor import BinarySensorDeviceClass, BinarySensorEntity
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddEntitiesCallback
from homeassistant.helpers.typing import ConfigType, DiscoveryInfoType

from .entity import DemoEntity, add_demo_entities


async def async_setup_platform(
    hass: HomeAssistant,
    config: ConfigType,
    async_add_entities: AddEntitiesCallback,
    discovery_info: DiscoveryInfoType | None = None,
) -> None:
    """Set up the demo binary sensors."""
    add_demo_entities(
        hass, Platform.BINARY_SENSOR, DemoBinarySensor, async_add_entities, discovery_info
    )


class DemoBinarySensor(DemoEntity, BinarySensorEntity):
    """On or off, with a device class when it names one Home Assistant knows."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_is_on = options["is_on"]
        self._attr_device_class = None
        with contextlib.suppress(ValueError):
            self._attr_device_class = BinarySensorDeviceClass(options.get("device_class", ""))
