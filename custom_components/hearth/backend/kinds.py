"""Which ``Backend`` serves an engine entry: probe the server, then pick its class.

``BACKENDS`` names the class of each kind of server with more than the OpenAI chat
API; every other kind gets the OpenAI-compatible backend.
"""

from __future__ import annotations

from collections.abc import Callable

from homeassistant.core import HomeAssistant

from ..const import DEFAULT_STALL_TIMEOUT
from .api import HearthClient
from .base import Backend
from .chat import ChatClient, async_create_chat_client
from .hearth import HearthBackend
from .openai_compat import OpenAIBackend
from .server_info import ServerInfo, ServerKind, async_probe

type BackendClass = Callable[[ServerInfo, HearthClient, ChatClient], Backend]

BACKENDS: dict[ServerKind, BackendClass] = {ServerKind.HEARTH: HearthBackend}


def backend_class(kind: ServerKind) -> BackendClass:
    """The backend class of a kind of server."""
    return BACKENDS.get(kind, OpenAIBackend)


async def async_connect(
    hass: HomeAssistant,
    client: HearthClient,
    api_key: str | None,
    stall: float = DEFAULT_STALL_TIMEOUT,
) -> Backend:
    """Probe ``client``'s server and return its backend (raises ``HearthError``);
    ``stall``: the most seconds a streamed reply may send nothing."""
    info = await async_probe(client)
    chat = await async_create_chat_client(hass, client.url, api_key, info.model, stall)
    return backend_class(info.kind)(info, client, chat)
