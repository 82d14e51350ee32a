"""Polls the engine's counters (``/v1/stats``) and its pins (``/v1/prefixes``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from .api import HearthAuthError, HearthClient, HearthError
from .const import DOMAIN, LOGGER, SCAN_INTERVAL


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """One poll of the engine."""

    stats: dict[str, Any]
    pins: dict[str, dict[str, Any]]
    fetched_at: float  # time.monotonic() when the poll started

    @property
    def instance_id(self) -> str:
        """Random per engine process: a change means the engine restarted."""
        return str(self.stats.get("instance_id", ""))

    @property
    def model(self) -> str | None:
        """Name of the served model."""
        model = self.stats.get("model")
        return str(model) if model is not None else None

    @property
    def version(self) -> str | None:
        """The engine's software version (older engines do not report it)."""
        version = self.stats.get("version")
        return str(version) if version is not None else None


class HearthCoordinator(DataUpdateCoordinator[EngineStatus]):
    """Engine counters every ``SCAN_INTERVAL``; client errors become HA errors here."""

    config_entry: ConfigEntry

    def __init__(
        self, hass: HomeAssistant, config_entry: ConfigEntry, client: HearthClient
    ) -> None:
        """Poll ``client`` for ``config_entry``."""
        super().__init__(
            hass,
            LOGGER,
            config_entry=config_entry,
            name=DOMAIN,
            update_interval=SCAN_INTERVAL,
        )
        self.client = client

    async def _async_update_data(self) -> EngineStatus:
        fetched_at = time.monotonic()
        try:
            # /health first: an engine whose worker stopped still answers the other
            # routes, but serves nothing (503 here): it counts as disconnected.
            await self.client.async_health()
            stats = await self.client.async_stats()
            pins = await self.client.async_list_prefixes()
        except HearthAuthError as err:
            raise ConfigEntryAuthFailed(
                translation_domain=DOMAIN, translation_key="invalid_auth"
            ) from err
        except HearthError as err:
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="update_failed",
                translation_placeholders={"error": str(err)},
            ) from err
        return EngineStatus(
            stats=stats,
            pins={str(pin["name"]): pin for pin in pins if isinstance(pin, dict) and "name" in pin},
            fetched_at=fetched_at,
        )
