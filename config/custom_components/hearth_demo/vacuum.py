"""Demo robot vacuums: start, pause, stop, return to the dock."""

from __future__ import annotations

from typing import Any

from homeassistant.components.vacuum import (
    StateVacuumEntity,
    VacuumActivity,
    VacuumEntityFeature,
)
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
    """Set up the demo vacuums."""
    add_demo_entities(hass, Platform.VACUUM, DemoVacuum, async_add_entities, discovery_info)


class DemoVacuum(DemoEntity, StateVacuumEntity):
    """A vacuum whose activity changes at once (it never reaches the dock by itself)."""

    _attr_supported_features = (
        VacuumEntityFeature.START
        | VacuumEntityFeature.PAUSE
        | VacuumEntityFeature.STOP
        | VacuumEntityFeature.RETURN_HOME
        | VacuumEntityFeature.STATE
    )

    def apply_options(self, options: dict[str, Any]) -> None:
        """State from house.yaml or a fixture."""
        self._attr_activity = VacuumActivity(options["state"])

    def _become(self, activity: VacuumActivity) -> None:
        self._attr_activity = activity
        self.async_write_ha_state()

    async def async_start(self) -> None:
        """Clean."""
        self._become(VacuumActivity.CLEANING)

    async def async_pause(self) -> None:
        """Pause."""
        self._become(VacuumActivity.PAUSED)

    async def async_stop(self, **kwargs: Any) -> None:
        """Stop where it is."""
        self._become(VacuumActivity.IDLE)

    async def async_return_to_base(self, **kwargs: Any) -> None:
        """Head for the dock."""
        self._become(VacuumActivity.RETURNING)
