"""What each agent last pinned, kept across Home Assistant restarts.

A restart or an upgrade of Home Assistant can change the rendered prefix: a new prompt
text in core, or a house changed while Home Assistant was down. The first pin after it
then replaces a pin made in an earlier run, so it counts as a rebuild like any other
(``PrefixManager``); without this record it would look like a first pin.
"""

from __future__ import annotations

from typing import Any

from homeassistant.const import __version__ as HA_VERSION
from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store

from .const import DOMAIN

STORAGE_VERSION = 1


def storage_key(entry_id: str) -> str:
    """The ``.storage`` file of an engine entry's pin history."""
    return f"{DOMAIN}.{entry_id}.pins"


class PinHistory:
    """The digest each agent last pinned, and the Home Assistant version that did it."""

    def __init__(self, hass: HomeAssistant, entry_id: str) -> None:
        """The history of ``entry_id``'s agents (empty until ``async_load``)."""
        self._store: Store[dict[str, Any]] = Store(hass, STORAGE_VERSION, storage_key(entry_id))
        self._digests: dict[str, str] = {}
        self._loaded_version: str | None = None
        self._saved_version: str | None = None

    async def async_load(self) -> None:
        """Read what the previous run pinned."""
        data = await self._store.async_load() or {}
        digests = data.get("digests")
        if isinstance(digests, dict):
            self._digests = {str(k): str(v) for k, v in digests.items()}
        version = data.get("ha_version")
        self._loaded_version = self._saved_version = str(version) if version is not None else None

    def previous(self, subentry_id: str) -> str | None:
        """The digest the agent last pinned (in this run or an earlier one)."""
        return self._digests.get(subentry_id)

    @property
    def upgraded(self) -> bool:
        """Whether the previous run was another Home Assistant version."""
        return self._loaded_version is not None and self._loaded_version != HA_VERSION

    async def async_record(self, subentry_id: str, digest: str) -> None:
        """The agent's prefix ``digest`` is pinned now."""
        if self._digests.get(subentry_id) == digest and self._saved_version == HA_VERSION:
            return
        self._digests[subentry_id] = digest
        await self._async_save()

    async def async_forget(self, subentry_ids: set[str]) -> None:
        """Drop removed agents."""
        if not subentry_ids & self._digests.keys():
            return
        for subentry_id in subentry_ids:
            self._digests.pop(subentry_id, None)
        await self._async_save()

    async def _async_save(self) -> None:
        await self._store.async_save({"ha_version": HA_VERSION, "digests": dict(self._digests)})
        self._saved_version = HA_VERSION

    async def async_remove(self) -> None:
        """The entry is deleted: delete the file."""
        await self._store.async_remove()
