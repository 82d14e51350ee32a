"""Demo covers: blinds, curtains and shades with a position; garage doors and gates."""

from __future__ import annotations

from typing import Any

from homeassistant.components.cover import (
    ATTR_POSITION,
    CoverDeviceClass,
    CoverEntity,
    CoverEntityFeature,
)
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform

OPEN_CLOSE_ONLY = {CoverDeviceClass.DOOR, CoverDeviceClass.GARAGE, CoverDeviceClass.GATE}


class DemoCover(DemoEntity, CoverEntity):
    """A cover that reaches its position at once (0 = closed, 100 = open)."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_device_class = CoverDeviceClass(options["device_class"])
        features = CoverEntityFeature.OPEN | CoverEntityFeature.CLOSE | CoverEntityFeature.STOP
        self._position: int = options["position"]
        settable = options.get("set_position")
        if settable is None:
            settable = self._attr_device_class not in OPEN_CLOSE_ONLY
        if settable:
            features |= CoverEntityFeature.SET_POSITION
        else:
            self._position = 100 if self._position else 0
        self._attr_supported_features = features

    @property
    def current_cover_position(self) -> int | None:
        """Position, for covers that have one."""
        if CoverEntityFeature.SET_POSITION in self.supported_features:
            return self._position
        return None

    @property
    def is_closed(self) -> bool:
        """Closed at position 0."""
        return self._position == 0

    def _move_to(self, position: int) -> None:
        self._position = position
        self.async_write_ha_state()

    async def async_open_cover(self, **kwargs: Any) -> None:
        """Open fully."""
        self._move_to(100)

    async def async_close_cover(self, **kwargs: Any) -> None:
        """Close fully."""
        self._move_to(0)

    async def async_set_cover_position(self, **kwargs: Any) -> None:
        """Move to a position."""
        self._move_to(int(kwargs[ATTR_POSITION]))

    async def async_stop_cover(self, **kwargs: Any) -> None:
        """Nothing moves for long in the demo house: stopping keeps the position."""
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.COVER, DemoCover)
