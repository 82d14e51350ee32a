"""Demo binary sensors (doors, windows, motion...): they read what they are given."""

from __future__ import annotations

import contextlib
from typing import Any

from homeassistant.components.binary_sensor import BinarySensorDeviceClass, BinarySensorEntity
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform


class DemoBinarySensor(DemoEntity, BinarySensorEntity):
    """On or off, with a device class when it names one Home Assistant knows."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_is_on = options["is_on"]
        self._attr_device_class = None
        with contextlib.suppress(ValueError):
            self._attr_device_class = BinarySensorDeviceClass(options.get("device_class", ""))


async_setup_platform = demo_platform(Platform.BINARY_SENSOR, DemoBinarySensor)
