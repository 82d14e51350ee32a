"""The server behind an engine entry, as one interface: ``Backend``.

Every question of what the server can do is asked here, and only here:

* ``backend_hearth.HearthBackend``: Hearth's engine. House prefixes are pinned
  (``PUT``/``DELETE``/``GET /v1/prefixes``), its counters come from ``/v1/stats``, its
  cache can be cleared, and requests carry its extension (argument values for the
  grammar, OpenAI's ``allowed_tools``);
* ``backend_openai.OpenAIBackend``: any other OpenAI-compatible server (llama.cpp,
  vLLM, SGLang...). House prefixes are primed with a short request, its figures come
  from ``/metrics`` and from the usage of this entry's requests.

Chat goes through the ``openai`` SDK for both (``backend/chat.py``); the pin API through the
small aiohttp client (``backend/api.py``). Another kind of server is one more module with a
class of this shape, named in ``backends.BACKENDS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..prefix.value import HousePrefix
from .chat import ChatClient
from .server_info import ServerInfo
from .server_stats import RequestWindow


@dataclass(frozen=True, slots=True)
class EngineStatus:
    """One poll of the server."""

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
        """The server's software version (older engines do not report it)."""
        version = self.stats.get("version")
        return str(version) if version is not None else None


class Backend(Protocol):
    """What the integration asks of the server behind an engine entry."""

    info: ServerInfo  # what the probe found
    chat: ChatClient  # ``/v1/chat/completions`` (the openai SDK)

    @property
    def manufacturer(self) -> str | None:
        """Who makes the serving software (the engine device's manufacturer)."""

    @property
    def narrows_tools(self) -> bool:
        """Whether a request may name the tools a command can call (OpenAI's
        ``allowed_tools``, forced) and narrow their argument values (Hearth's grammar)."""

    @property
    def lists_pins(self) -> bool:
        """Whether a poll shows the pins (so a missing one is pinned again)."""

    @property
    def clears_cache(self) -> bool:
        """Whether the server's cache can be cleared from Home Assistant."""

    def request_extensions(self, values: Mapping[str, Any] | None) -> dict[str, Any]:
        """Server fields of a chat request (``extra_body``); ``values``: the house's
        argument values for the grammar (``house/values.py``), where the turn has any."""

    def reports(self, stat: str, status: EngineStatus) -> bool:
        """Whether the server reports the figure ``stat`` (else its sensor is unavailable)."""

    def features(self) -> tuple[str, ...]:
        """What the server offers, as keys (``common.feature_<key>``, ``names.py``)."""

    async def async_poll(self, fetched_at: float, requests: RequestWindow) -> EngineStatus:
        """Whether the server is alive, and its figures (raises a client error if not)."""

    async def async_pin(self, name: str, prefix: HousePrefix) -> Mapping[str, Any]:
        """Keep ``prefix`` warm under ``name``: pin or prime it (``tokens``: its size)."""

    async def async_unpin(self, name: str) -> None:
        """Forget the prefix pinned under ``name`` (nothing to do where it was primed)."""

    async def async_clear_cache(self) -> int:
        """Drop what the cache holds beyond the pins; returns the bytes freed."""
