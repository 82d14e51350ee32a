"""Warming the prompt cache of a server without Hearth's pin API.

llama.cpp, vLLM and SGLang reuse the longest cached token prefix of a new prompt. Every
request of an agent starts with its house prefix (``prefix.py``), so after a house
change one short request with the new prefix (``max_tokens`` 1) puts it in their cache,
and the first real request after a rename is warm instead of a cold prefill.

llama.cpp keeps each prompt in a slot: ``cache_prompt`` asks it to reuse it, and where
the server has slots to spare, each pin gets one of its own (``id_slot``), so the
house prefixes of two agents or device classes do not evict each other. One slot is
always left free for other traffic. A request waits for its slot while another
request of the same pin runs in it.
"""

from __future__ import annotations

from typing import Any

from .api import HearthClient
from .prefix import HousePrefix
from .server_info import ServerInfo, ServerKind

# The user message after the prefix in a priming request. Anything works: real requests
# share the prefix's tokens only, which end before it.
PRIMING_TEXT = "Hello"


class SlotTable:
    """llama.cpp slots given to pins, in the order the pins are first primed."""

    def __init__(self, server: ServerInfo | None) -> None:
        """Slots of ``server``: all but one, if it has two or more."""
        usable = server is not None and server.kind is ServerKind.LLAMA_CPP
        self._free = max(0, server.slots - 1) if usable and server is not None else 0
        self._slots: dict[str, int] = {}

    def slot(self, pin: str | None) -> int | None:
        """The slot of ``pin`` (given on first use; None: no slot of its own)."""
        if pin is None:
            return None
        if pin not in self._slots and len(self._slots) < self._free:
            self._slots[pin] = len(self._slots)
        return self._slots.get(pin)


def request_extras(server: ServerInfo | None, slot: int | None) -> dict[str, Any]:
    """Fields a request to ``server`` adds: llama.cpp's cache reuse and slot."""
    if server is None or server.kind is not ServerKind.LLAMA_CPP:
        return {}
    extras: dict[str, Any] = {"cache_prompt": True}
    if slot is not None:
        extras["id_slot"] = slot
    return extras


def priming_body(prefix: HousePrefix, server: ServerInfo, slot: int | None) -> dict[str, Any]:
    """The priming request: the prefix, a short user message and one token to generate."""
    body: dict[str, Any] = {
        "messages": [*prefix.messages, {"role": "user", "content": PRIMING_TEXT}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    if prefix.tools:
        body["tools"] = list(prefix.tools)
    body.update(request_extras(server, slot))
    return body


async def async_prime(
    client: HearthClient, prefix: HousePrefix, server: ServerInfo, slot: int | None
) -> dict[str, Any]:
    """Send the priming request; answer like a pin (``tokens``: its prompt tokens).

    Raises ``HearthError`` as a refused or failed pin would.
    """
    answer = await client.async_chat(priming_body(prefix, server, slot))
    usage = answer.get("usage") or {}
    return {"tokens": usage.get("prompt_tokens")}
