"""Polls the server every ``SCAN_INTERVAL`` through its backend (``backend/base.py``): a
Hearth engine's ``/health``, ``/v1/stats`` and pins; another server's liveness and what
it reports (``backend/server_stats.py``).

The server is probed once, before the first poll, and its backend chosen
(``backend/kinds.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from homeassistant.config_entries import ConfigEntry
from homeassistant.const import CONF_API_KEY
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryAuthFailed
from homeassistant.helpers.update_coordinator import DataUpdateCoordinator, UpdateFailed

from ..const import (
    CONF_CONTEXT_LENGTH,
    CONF_STALL_TIMEOUT,
    DEFAULT_STALL_TIMEOUT,
    DOMAIN,
    LOGGER,
    SCAN_INTERVAL,
)
from ..errors import BACKEND_ERRORS, describe, is_auth_error
from .api import HearthClient
from .base import Backend, EngineStatus
from .kinds import async_connect
from .server_stats import RequestWindow

__all__ = ["EngineStatus", "HearthCoordinator"]


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
        self._backend: Backend | None = None  # chosen before the first poll
        self.requests = RequestWindow()  # this entry's requests, for other servers

    @property
    def backend(self) -> Backend:
        """The server's backend (known once the entry's first refresh has run)."""
        if self._backend is None:
            raise RuntimeError("the server has not been probed yet")
        return self._backend

    @property
    def context_length(self) -> int | None:
        """The served model's context in tokens: what the server reports, else the
        entry's option (None: unknown). Read fresh: the option applies without a reload."""
        if self._backend is not None and self._backend.info.context_length is not None:
            return self._backend.info.context_length
        told = self.config_entry.options.get(CONF_CONTEXT_LENGTH)
        return int(told) if told else None

    async def _async_setup(self) -> None:
        """Probe the server once (a reload probes again: it may have been replaced)."""
        api_key = self.config_entry.data.get(CONF_API_KEY)
        async with self._translated_errors():
            stall = float(self.config_entry.options.get(CONF_STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT))
            self._backend = await async_connect(self.hass, self.client, api_key, stall)
        info = self._backend.info
        LOGGER.debug("%s at %s: %s", info.kind.value, self.client.url, info.as_dict())

    async def _async_update_data(self) -> EngineStatus:
        async with self._translated_errors():
            return await self.backend.async_poll(time.monotonic(), self.requests)

    @asynccontextmanager
    async def _translated_errors(self) -> AsyncIterator[None]:
        """Client errors as the coordinator's errors (re-auth, or the poll failed)."""
        try:
            yield
        except BACKEND_ERRORS as err:
            if is_auth_error(err):
                raise ConfigEntryAuthFailed(
                    translation_domain=DOMAIN, translation_key="invalid_auth"
                ) from err
            raise UpdateFailed(
                translation_domain=DOMAIN,
                translation_key="update_failed",
                translation_placeholders={"error": describe(err)},
            ) from err
