"""Polls the server's counters: a Hearth engine's ``/v1/stats`` and pins
(``/v1/prefixes``); for other servers what they report (``server_stats.py``).

The server is probed once, before the first poll (``server_info.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from .api import HearthAuthError, HearthClient, HearthError
from .const import DOMAIN, LOGGER, SCAN_INTERVAL
from .server_info import ServerInfo, async_probe
from .server_stats import RequestWindow, parse_metrics, server_stats


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
        self.server: ServerInfo | None = None  # probed before the first poll
        self.requests = RequestWindow()  # this entry's requests, for other servers

    async def _async_setup(self) -> None:
        """Probe the server once (a reload probes again: it may have been replaced)."""
        async with self._translated_errors():
            self.server = await async_probe(self.client)
        LOGGER.debug("%s at %s: %s", self.server.name, self.client.url, self.server.as_dict())

    async def _async_update_data(self) -> EngineStatus:
        fetched_at = time.monotonic()
        async with self._translated_errors():
            if self.server is not None and not self.server.pins:
                return await self._async_poll_other(self.server, fetched_at)
            # /health first: an engine whose worker stopped still answers the other
            # routes, but serves nothing (503 here): it counts as disconnected.
            await self.client.async_health()
            stats = await self.client.async_stats()
            pins = await self.client.async_list_prefixes()
        return EngineStatus(
            stats=stats,
            pins={str(pin["name"]): pin for pin in pins if isinstance(pin, dict) and "name" in pin},
            fetched_at=fetched_at,
        )

    async def _async_poll_other(self, server: ServerInfo, fetched_at: float) -> EngineStatus:
        """A server without the pin API: alive, and what its metrics say."""
        if server.health:
            await self.client.async_optional_text("/health")
        else:
            await self.client.async_models()
        metrics = None
        if server.metrics and (text := await self.client.async_optional_text("/metrics")):
            metrics = parse_metrics(text)
        stats = server_stats(server.kind, metrics, self.requests)
        stats["model"] = server.model
        return EngineStatus(stats=stats, pins={}, fetched_at=fetched_at)

    @asynccontextmanager
    async def _translated_errors(self) -> AsyncIterator[None]:
        """Client errors as the coordinator's errors (re-auth, or the poll failed)."""
        try:
            yield
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
