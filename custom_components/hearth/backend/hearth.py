"""Hearth's engine as a ``Backend``: pinned prefixes, ``/v1/stats`` and its extension."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..prefix.value import HousePrefix
from .api import HearthClient
from .base import EngineStatus
from .chat import ChatClient
from .server_info import ServerInfo
from .server_stats import RequestWindow

MANUFACTURER = "Hearth"


# The engine's /v1/stats extensions for leaving an argument out and requiring one: a
# call may be kept from naming a thing only where the place it names is required too.
PRESENCE = frozenset({"empty_argument_values", "required_arguments"})


class HearthBackend:
    """A Hearth engine: every capability the integration knows."""

    narrows_tools = True
    lists_pins = True
    clears_cache = True
    manufacturer = MANUFACTURER

    def __init__(self, info: ServerInfo, client: HearthClient, chat: ChatClient) -> None:
        """Pin through ``client`` (the pin API), chat through ``chat``."""
        self.info = info
        self.client = client
        self.chat = chat

    def request_extensions(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        """The ``hearth`` field: the house's argument values for the tool-call grammar
        (arguments left out, an empty list, or required, only where the engine takes
        both: an older engine would refuse the request)."""
        if not values:
            return {}
        told = values.get("argument_values")
        if not self.info.extensions >= PRESENCE:
            values = {k: v for k, v in values.items() if k != "required_arguments"}
            if isinstance(told, Mapping):
                values["argument_values"] = {k: v for k, v in told.items() if v}
        return {"hearth": dict(values)}

    def reports(self, stat: str, status: EngineStatus) -> bool:
        """The engine reports every figure the sensors show."""
        return True

    def features(self) -> tuple[str, ...]:
        """What a Hearth engine offers."""
        return ("pins", "counters")

    async def async_poll(self, fetched_at: float, requests: RequestWindow) -> EngineStatus:
        """``/health``, ``/v1/stats`` and ``/v1/prefixes``.

        ``/health`` first: an engine whose worker stopped still answers the other
        routes but serves nothing (503 there), so it counts as disconnected.
        """
        await self.client.async_health()
        stats = await self.client.async_stats()
        pins = await self.client.async_list_prefixes()
        return EngineStatus(
            stats=stats,
            pins={str(pin["name"]): pin for pin in pins if isinstance(pin, dict) and "name" in pin},
            fetched_at=fetched_at,
        )

    async def async_pin(self, name: str, prefix: HousePrefix) -> Mapping[str, Any]:
        """``PUT /v1/prefixes/{name}?wait=true``: answered once the pin is ready."""
        return await self.client.async_put_prefix(name, prefix.pin_body())

    async def async_unpin(self, name: str) -> None:
        """``DELETE /v1/prefixes/{name}``."""
        await self.client.async_delete_prefix(name)

    async def async_clear_cache(self) -> int:
        """``POST /v1/cache/clear``."""
        return await self.client.async_clear_cache()
