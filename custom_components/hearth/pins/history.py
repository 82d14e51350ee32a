"""What each agent last pinned, kept across Home Assistant restarts.

A restart or an upgrade of Home Assistant can change the rendered prefix: a new prompt
text in core, or a house changed while Home Assistant was down. The first pin after it
then replaces a pin made in an earlier run, so it counts as a rebuild like any other
(``rebuilds.py``); without this record it would look like a first pin.

Each pin's *base* (the prefix last rendered in full, ``prefix/delta.py``) is kept too, so
that a restart after a told change (a rename, say) pins the same bytes again, base and
told changes, and the engine finds them cached, instead of prefilling the whole house.
A base that no longer fits what Home Assistant renders (an upgrade that rewords its
prompt, other options) is simply not composed with (``house_delta.compose``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from homeassistant.const import __version__ as HA_VERSION
from homeassistant.core import HomeAssistant
from homeassistant.helpers.storage import Store

from ..const import DOMAIN
from ..house.diff import HouseEntity, HouseSnapshot
from ..prefix.value import HousePrefix

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
        self._bases: dict[str, dict[str, Any]] = {}
        self._loaded_version: str | None = None
        self._saved_version: str | None = None

    async def async_load(self) -> None:
        """Read what the previous run pinned."""
        data = await self._store.async_load() or {}
        digests = data.get("digests")
        if isinstance(digests, dict):
            self._digests = {str(k): str(v) for k, v in digests.items()}
        bases = data.get("bases")
        if isinstance(bases, dict):
            self._bases = {str(k): v for k, v in bases.items() if isinstance(v, dict)}
        version = data.get("ha_version")
        self._loaded_version = self._saved_version = str(version) if version is not None else None

    def previous(self, subentry_id: str) -> str | None:
        """The digest the agent last pinned (in this run or an earlier one)."""
        return self._digests.get(subentry_id)

    def base(self, key: str) -> HousePrefix | None:
        """The base the pin ``key`` last kept (None: none stored, or unreadable)."""
        stored = self._bases.get(key)
        return base_from_dict(stored) if stored is not None else None

    @property
    def upgraded(self) -> bool:
        """Whether the previous run was another Home Assistant version."""
        return self._loaded_version is not None and self._loaded_version != HA_VERSION

    async def async_record(
        self, subentry_id: str, digest: str, base: HousePrefix | None = None
    ) -> None:
        """The agent's prefix ``digest`` is pinned now, on ``base`` (if it has one)."""
        stored = self._bases.get(subentry_id, {}).get("digest")
        new_base = base is not None and stored != base.digest
        if (
            self._digests.get(subentry_id) == digest
            and self._saved_version == HA_VERSION
            and not new_base
        ):
            return
        self._digests[subentry_id] = digest
        if base is not None and new_base:
            self._bases[subentry_id] = base_to_dict(base)
        await self._async_save()

    async def async_forget(self, subentry_ids: set[str]) -> None:
        """Drop removed agents."""
        if not subentry_ids & (self._digests.keys() | self._bases.keys()):
            return
        for subentry_id in subentry_ids:
            self._digests.pop(subentry_id, None)
            self._bases.pop(subentry_id, None)
        await self._async_save()

    async def _async_save(self) -> None:
        await self._store.async_save(
            {"ha_version": HA_VERSION, "digests": dict(self._digests), "bases": self._bases}
        )
        self._saved_version = HA_VERSION

    async def async_remove(self) -> None:
        """The entry is deleted: delete the file."""
        await self._store.async_remove()


def base_to_dict(base: HousePrefix) -> dict[str, Any]:
    """A base prefix as stored: its prompt parts, its house, and its digest."""
    house = base.house
    return {
        "digest": base.digest,
        "system": base.system,
        "tools": list(base.tools),
        "examples": list(base.examples),
        "class_lines": base.class_lines,
        "house": None
        if house is None
        else {
            "listing": house.listing,
            "left_out": sorted(house.left_out),
            "entities": {k: dataclasses.asdict(v) for k, v in house.entities.items()},
        },
    }


def base_from_dict(data: Mapping[str, Any]) -> HousePrefix | None:
    """A stored base, or None where the record is not one (or its bytes changed)."""
    try:
        stored = data["house"]
        house = None
        if stored is not None:
            house = HouseSnapshot(
                entities={k: HouseEntity(**v) for k, v in stored["entities"].items()},
                listing=str(stored["listing"]),
                left_out=frozenset(stored["left_out"]),
            )
        base = HousePrefix(
            system=str(data["system"]),
            tools=tuple(data["tools"]),
            examples=tuple(data["examples"]),
            class_lines=str(data.get("class_lines", "")),
            house=house,
        )
    except KeyError, TypeError, AttributeError:
        return None
    return base if base.digest == data.get("digest") else None
