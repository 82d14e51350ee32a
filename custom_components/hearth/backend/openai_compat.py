"""Any other OpenAI-compatible server as a ``Backend`` (llama.cpp, vLLM, SGLang...).

Such a server caches prompt prefixes on its own: the house prefix is warmed with a
priming request after each change (``backend/priming.py``), its figures come from its
``/metrics`` (where it exports them) and from the usage of this entry's requests
(``backend/server_stats.py``). It has no pins to list and no cache to clear, and takes none of
Hearth's request extensions; llama.cpp is asked to reuse its prompt cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..prefix.value import HousePrefix
from .api import HearthClient
from .base import EngineStatus
from .chat import ChatClient
from .priming import async_prime, request_extras
from .server_info import ServerInfo
from .server_stats import RequestWindow, parse_metrics, server_stats


class OpenAIBackend:
    """An OpenAI-compatible server without Hearth's pin API."""

    narrows_tools = False
    lists_pins = False
    clears_cache = False

    def __init__(self, info: ServerInfo, client: HearthClient, chat: ChatClient) -> None:
        """Probe routes through ``client``, chat (and prime) through ``chat``."""
        self.info = info
        self.client = client
        self.chat = chat

    @property
    def manufacturer(self) -> str | None:
        """Who makes the serving software (llama.cpp, vLLM...; None: not known)."""
        return self.info.maker

    def request_extensions(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        """No grammar values (not understood); llama.cpp's ``cache_prompt``."""
        return request_extras(self.info)

    def reports(self, stat: str, status: EngineStatus) -> bool:
        """Only what the server's metrics or usage gave (``backend/server_stats.py``)."""
        return stat in status.stats

    def features(self) -> tuple[str, ...]:
        """Priming, and what the probe found."""
        found = ["priming"]
        if self.info.metrics:
            found.append("metrics")
        if self.info.slots:
            found.append("slots")
        return tuple(found)

    async def async_poll(self, fetched_at: float, requests: RequestWindow) -> EngineStatus:
        """Alive (``/health``, else ``/v1/models``), and what its metrics say."""
        if self.info.health:
            await self.client.async_optional_text("/health")
        else:
            await self.client.async_models()
        metrics = None
        if self.info.metrics and (text := await self.client.async_optional_text("/metrics")):
            metrics = parse_metrics(text)
        stats = server_stats(self.info.kind, metrics, requests)
        stats["model"] = self.info.model
        return EngineStatus(stats=stats, pins={}, fetched_at=fetched_at)

    async def async_pin(self, name: str, prefix: HousePrefix) -> Mapping[str, Any]:
        """A priming request with the prefix (answered like a pin)."""
        return await async_prime(self.chat, prefix, self.info)

    async def async_unpin(self, name: str) -> None:
        """Nothing was pinned."""

    async def async_clear_cache(self) -> int:
        """Not offered (``clears_cache`` is False): nothing is freed."""
        return 0
