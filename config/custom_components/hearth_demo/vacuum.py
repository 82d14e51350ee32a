"""Demo robot vacuums: start, pause, stop, return to the dock."""

from __future__ import annotations

from typing import Any

from homeassistant.components.vacuum import (
    StateVacuumEntity,
    VacuumActivity,
    VacuumEntityFeature,
)
from homeassistant.const import Platform

from .entity import DemoEntity, demo_platform


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


async_setup_platform = demo_platform(Platform.VACUUM, DemoVacuum)
