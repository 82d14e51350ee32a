"""A client that leaves before its first token frees its place (issue 26, item 6).

The real application over a real engine, in process, served without aiohttp's handler
cancellation: ``hearth_engine serve`` asks aiohttp to cancel the handler of a client
that went away, but that missed some closes under load. What frees the request here is
the handler watching the connection while it waits for the first event. Before, a
request queued for a client that had gone waited for its turn and then ran.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hearth_engine.server.app import create_app
from hearth_engine.serving.engine import Engine

CHAT = "/v1/chat/completions"
LONG = 20000  # tokens: a minute or more of decoding for tiny, so it is cut short
WITHIN_S = 60.0  # a deadline for conditions that hold within a step or two


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}


class UncancelledServer(TestServer):
    """aiohttp's test server, minus its handler cancellation (a close it missed)."""

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return await super()._make_runner(**{**kwargs, "handler_cancellation": False})


@pytest.fixture
async def http(make_engine: Callable[..., Engine]) -> AsyncIterator[TestClient[Any, Any]]:
    engine = make_engine(max_running=1)  # one slot: a second request waits in line
    async with TestClient(UncancelledServer(create_app(engine))) as client:
        yield client


async def stats_when(
    http: TestClient[Any, Any], holds: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """``/v1/stats`` once ``holds`` is true of it (or at the deadline)."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        stats = await (await http.get("/v1/stats")).json()
        if holds(stats) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)


async def test_a_client_gone_before_its_first_token_frees_its_place(
    http: TestClient[Any, Any],
) -> None:
    # The only slot: a long stream, read until it decodes.
    running = await http.post(CHAT, json=chat("a long story", max_tokens=LONG, min_tokens=LONG,
                                                stream=True))  # fmt: skip
    assert running.status == 200
    await running.content.readline()
    # A second request on a connection of its own waits in line for that slot...
    own = aiohttp.ClientSession()
    queued = asyncio.create_task(
        own.post(http.make_url(CHAT), json=chat("a short one", max_tokens=8))
    )
    before = await stats_when(http, lambda s: s["requests_waiting"] == 1)
    assert (before["requests_running"], before["requests_waiting"]) == (1, 1)
    # ...and its client goes away before its first token.
    queued.cancel()
    await own.close()
    with pytest.raises(asyncio.CancelledError):
        await queued
    after = await stats_when(
        http, lambda s: s["requests_cancelled"] == before["requests_cancelled"] + 1
    )
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert after["requests_waiting"] == 0
    # Dropped from the line: it never ran, while the stream still holds its slot.
    assert after["requests_running"] == 1
    assert after["prefix_cache_queries_tokens"] == before["prefix_cache_queries_tokens"]
    running.close()
    idle = await stats_when(
        http, lambda s: (s["requests_running"], s["requests_waiting"], s["kv_working_bytes"])
        == (0, 0, 0),
    )  # fmt: skip
    assert idle["kv_cache_locked_nodes"] == 0
    assert idle["kv_working_bytes"] == 0
    # Still serving.
    reply = await http.post(CHAT, json=chat("and now?", max_tokens=4))
    assert reply.status == 200
    assert (await reply.json())["usage"]["completion_tokens"] >= 1
