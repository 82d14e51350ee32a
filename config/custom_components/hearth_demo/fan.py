"""Demo fans: on/off, a speed in percent, oscillation."""

from __future__ import annotations

from typing import Any

from homeassistant.components.fan import FanEntity, FanEntityFeature
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform

FULL_SPEED = 100


class DemoFan(DemoEntity, FanEntity):
    """A fan: on means a speed above 0 (full speed when turned on without one)."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        features = FanEntityFeature.TURN_ON | FanEntityFeature.TURN_OFF
        if options["set_speed"]:
            features |= FanEntityFeature.SET_SPEED
        if options["oscillate"]:
            features |= FanEntityFeature.OSCILLATE
        self._attr_supported_features = features
        self._attr_oscillating = options["oscillating"] if options["oscillate"] else None
        self._speed = options["percentage"] if options["is_on"] else 0
        if options["is_on"] and not self._speed:
            self._speed = FULL_SPEED

    @property
    def is_on(self) -> bool:
        """On at any speed."""
        return self._speed > 0

    @property
    def percentage(self) -> int | None:
        """Speed in percent (0 when off)."""
        return self._speed if FanEntityFeature.SET_SPEED in self.supported_features else None

    async def async_turn_on(
        self, percentage: int | None = None, preset_mode: str | None = None, **kwargs: Any
    ) -> None:
        """On, at ``percentage`` or full speed."""
        self._speed = percentage if percentage else FULL_SPEED
        self.async_write_ha_state()

    async def async_turn_off(self, **kwargs: Any) -> None:
        """Off."""
        self._speed = 0
        self.async_write_ha_state()

    async def async_set_percentage(self, percentage: int) -> None:
        """A speed; 0 turns the fan off."""
        self._speed = percentage
        self.async_write_ha_state()

    async def async_oscillate(self, oscillating: bool) -> None:
        """Swing or not."""
        self._attr_oscillating = oscillating
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.FAN, DemoFan)
