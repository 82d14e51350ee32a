"""Warming the prompt cache of a server without Hearth's pin API.

llama.cpp, vLLM and SGLang reuse the longest cached token prefix of a new prompt. Every
request of an agent starts with its house prefix (``prefix/render.py``), so after a house
change one short request with the new prefix (``max_tokens`` 1) puts it in their cache,
and the first real request after a rename is warm instead of a cold prefill.

llama.cpp keeps each prompt in a slot: ``cache_prompt`` asks it to reuse it. Requests
are not tied to a slot (``id_slot``): the server picks the slot whose prompt is most
alike, and its host-RAM prompt cache (``--cache-ram``) brings back an evicted house. In
the household replay, tying each agent to a slot of its own stalled a request for good
on llama-server 0.3.36 (the slot re-ran its finished prompt step in a loop), while the
same replay without ``id_slot`` reused 99.6 % of its prompt tokens.
"""

from __future__ import annotations

from typing import Any

from ..prefix.value import HousePrefix
from .chat import ChatClient
from .server_info import ServerInfo, ServerKind

# The user message after the prefix in a priming request. Anything works: real requests
# share the prefix's tokens only, which end before it.
PRIMING_TEXT = "Hello"


def request_extras(server: ServerInfo | None) -> dict[str, Any]:
    """Fields a request to ``server`` adds: llama.cpp's prompt reuse."""
    if server is None or server.kind is not ServerKind.LLAMA_CPP:
        return {}
    return {"cache_prompt": True}


def priming_body(prefix: HousePrefix, server: ServerInfo) -> dict[str, Any]:
    """The priming request: the prefix, a short user message and one token to generate."""
    body: dict[str, Any] = {
        "messages": [*prefix.messages, {"role": "user", "content": PRIMING_TEXT}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    if prefix.tools:
        body["tools"] = list(prefix.tools)
    body.update(request_extras(server))
    return body


async def async_prime(chat: ChatClient, prefix: HousePrefix, server: ServerInfo) -> dict[str, Any]:
    """Send the priming request; answer like a pin (``tokens``: its prompt tokens).

    Raises the SDK's ``openai.OpenAIError`` as a refused or failed pin would.
    """
    answer = await chat.async_chat(priming_body(prefix, server))
    usage = answer.get("usage") or {}
    return {"tokens": usage.get("prompt_tokens")}
