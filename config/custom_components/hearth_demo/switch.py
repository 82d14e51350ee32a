"""Demo switches and smart plugs."""

from __future__ import annotations

from typing import Any

from homeassistant.components.switch import SwitchDeviceClass, SwitchEntity
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform


class DemoSwitch(DemoEntity, SwitchEntity):
    """A switch or an outlet."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_is_on = options["is_on"]
        self._attr_device_class = SwitchDeviceClass(options["device_class"])

    async def async_turn_on(self, **kwargs: Any) -> None:
        """Turn on."""
        self._attr_is_on = True
        self.async_write_ha_state()

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Turn off."""
        self._attr_is_on = False
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.SWITCH, DemoSwitch)
