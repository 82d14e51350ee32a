"""Demo door locks."""

from __future__ import annotations

from typing import Any

from homeassistant.components.lock import LockEntity
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
    """Set up the demo locks."""
    add_demo_entities(hass, Platform.LOCK, DemoLock, async_add_entities, discovery_info)


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
