"""Demo valves (water, gas): open, close, and a position when they report one."""

from __future__ import annotations

from typing import Any

from homeassistant.components.valve import ValveDeviceClass, ValveEntity, ValveEntityFeature
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform


class DemoValve(DemoEntity, ValveEntity):
    """A valve that reaches its position at once (0 = closed, 100 = open)."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_device_class = ValveDeviceClass(options["device_class"])
        self._attr_reports_position = bool(options["set_position"])
        features = ValveEntityFeature.OPEN | ValveEntityFeature.CLOSE | ValveEntityFeature.STOP
        if options["set_position"]:
            features |= ValveEntityFeature.SET_POSITION
        self._attr_supported_features = features
        self._position: int = options["position"]
        if not self._attr_reports_position:
            self._position = 100 if self._position else 0

    @property
    def current_valve_position(self) -> int | None:
        """Position, for valves that report one."""
        return self._position if self.reports_position else None

    @property
    def is_closed(self) -> bool:
        """Closed at position 0."""
        return self._position == 0

    def _move_to(self, position: int) -> None:
        self._position = position
        self.async_write_ha_state()

    async def async_open_valve(self) -> None:
        """Open fully."""
        self._move_to(100)

    async def async_close_valve(self) -> None:
        """Close fully."""
        self._move_to(0)

    async def async_set_valve_position(self, position: int) -> None:
        """Move to a position."""
        self._move_to(position)

    async def async_stop_valve(self) -> None:
        """Nothing moves for long: stopping keeps the position."""
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.VALVE, DemoValve)
