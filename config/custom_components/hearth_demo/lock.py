"""Demo door locks."""

from __future__ import annotations

from typing import Any

from homeassistant.components.lock import LockEntity
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform


class DemoLock(DemoEntity, LockEntity):
    """A lock that locks and unlocks at once."""

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_is_locked = options["locked"]

    async def async_lock(self, **kwargs: Any) -> None:
        """Lock."""
        self._attr_is_locked = True
        self.async_write_ha_state()

    async def async_unlock(self, **kwargs: Any) -> None:
        """Unlock."""
        self._attr_is_locked = False
        self.async_write_ha_state()


async_setup_platform = demo_platform(Platform.LOCK, DemoLock)
