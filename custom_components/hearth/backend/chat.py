"""Chat completions through the ``openai`` SDK (as Home Assistant core's OpenAI
integrations do): one ``AsyncOpenAI`` per engine entry on HA's shared httpx client.

Hearth and every OpenAI-compatible server speak the same chat API; what a server adds
(Hearth's ``hearth`` grammar values, llama.cpp's ``cache_prompt``) travels in
``extra_body``, and what it sends back beyond OpenAI's fields (``usage.hearth``,
llama.cpp's ``timings``) is kept from the response's extras: chunks are handed on as
plain dicts (``model_dump``), extras included.

The SDK raises its typed errors (``openai.APIConnectionError``, ``AuthenticationError``,
``APIStatusError``...); ``errors.py`` maps them to translated errors in one place.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
import openai
from homeassistant.core import HomeAssistant
from homeassistant.helpers.httpx_client import get_async_client

from ..const import DEFAULT_STALL_TIMEOUT, PIN_TIMEOUT, REQUEST_TIMEOUT

# Request fields the SDK's ``chat.completions.create`` takes by name; any other field
# of a request body is a server extension and goes through ``extra_body``.
SDK_FIELDS = frozenset(
    {
        "messages",
        "max_tokens",
        "response_format",
        "seed",
        "stop",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_p",
    }
)
PRIMING_TIMEOUT = httpx.Timeout(PIN_TIMEOUT, connect=REQUEST_TIMEOUT)
_READER_CLOSE_STEPS = 16  # event loop steps: two per nested generator, and spare
_NO_KEY = "no-key"  # the SDK needs a key; a keyless server gets no Authorization header


class EngineStalled(openai.APITimeoutError):
    """The server sent nothing for ``stall`` seconds: not its first token, not the next."""

    def __init__(self, request: httpx.Request, stall: float) -> None:
        openai.APIConnectionError.__init__(
            self, message=f"no reply for {stall:g} s: the server stalled", request=request
        )
        self.stall = stall


def _stalled(err: httpx.TimeoutException) -> bool:
    """A read timeout (nothing came), not a failed connect."""
    return isinstance(err, httpx.ReadTimeout)


class ChatClient:
    """``/v1/chat/completions`` of one server, through an ``AsyncOpenAI`` client."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str | None,
        keyed: bool,
        stall: float = DEFAULT_STALL_TIMEOUT,
    ) -> None:
        """Use ``client``; ``model``: the served model's id (any id where unknown);
        ``stall``: the most seconds a streamed reply may send nothing."""
        self._client = client
        self._model = model or "default"
        self.stall = stall
        # Without a key no Authorization header is sent (the SDK would send its own).
        self._headers: dict[str, Any] = {} if keyed else {"Authorization": openai.Omit()}

    def _arguments(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` as the SDK's arguments: its own fields by name, the rest as extras."""
        arguments = {key: value for key, value in body.items() if key in SDK_FIELDS}
        extras = {key: value for key, value in body.items() if key not in SDK_FIELDS | {"stream"}}
        if extras:
            arguments["extra_body"] = extras
        return {"model": self._model, "extra_headers": self._headers, **arguments}

    async def async_chat_stream(self, body: Mapping[str, Any]) -> AsyncGenerator[dict[str, Any]]:
        """Stream a chat completion: each chunk as a dict (extras included).

        An error the server sends inside the stream raises ``openai.APIError``. A
        stream that breaks off (the server died, the connection dropped) raises
        ``openai.APIConnectionError`` and one that sends nothing for ``stall`` seconds
        (before its first chunk or between two) ``EngineStalled``,
        as a failed connect does: the SDK wraps transport errors only until the
        response starts, not while its body streams.
        """
        timeout = httpx.Timeout(self.stall, connect=REQUEST_TIMEOUT)
        try:
            stream = await self._client.chat.completions.create(
                **self._arguments(body), stream=True, timeout=timeout
            )
        except openai.APITimeoutError as err:
            if isinstance(err.__cause__, httpx.TimeoutException) and _stalled(err.__cause__):
                raise EngineStalled(err.request, self.stall) from err
            raise
        try:
            async with stream:  # closed when the reader stops early, too
                async for chunk in stream:
                    yield chunk.model_dump(exclude_none=True)
        except httpx.TimeoutException as err:
            if _stalled(err):
                raise EngineStalled(stream.response.request, self.stall) from err
            raise openai.APITimeoutError(request=stream.response.request) from err
        except httpx.TransportError as err:
            raise openai.APIConnectionError(
                message=f"the reply broke off: {err}", request=stream.response.request
            ) from err
        finally:
            # The SDK leaves its SSE reader (six nested async generators: openai, httpx,
            # httpcore) suspended after ``[DONE]``; the event loop closes each in a task
            # of its own, one after the other. Let them run before the turn goes on.
            for _ in range(_READER_CLOSE_STEPS):
                await asyncio.sleep(0)

    async def async_chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A chat completion without streaming (the priming request), as a dict."""
        completion = await self._client.chat.completions.create(
            **self._arguments(body), stream=False, timeout=PRIMING_TIMEOUT
        )
        return completion.model_dump(exclude_none=True)


async def async_create_chat_client(
    hass: HomeAssistant,
    url: str,
    api_key: str | None,
    model: str | None,
    stall: float = DEFAULT_STALL_TIMEOUT,
) -> ChatClient:
    """A chat client for the server at ``url`` on Home Assistant's httpx client.

    Built off the event loop, as core's openai_conversation does: the SDK reads the
    platform's details once, with blocking calls. No retries: a voice turn that fails
    is answered at once (the user is waiting), and the next turn tries again.
    """
    client = openai.AsyncOpenAI(
        api_key=api_key or _NO_KEY,
        base_url=f"{url.rstrip('/')}/v1",
        http_client=get_async_client(hass),
        max_retries=0,
    )
    await hass.async_add_executor_job(client.platform_headers)
    return ChatClient(client, model, keyed=bool(api_key), stall=stall)
