"""Limits and clean-up, on a small server of its own: ``tiny`` (random weights: it talks
until ``max_tokens``), one running request, one waiting (request or pin), a 64 KiB body
limit and an 8 MiB KV budget (8,192 tokens of ``tiny``, working buffers included), no API
key and no ``--log-prompts``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import pytest

from .conftest import Client, ServerProcess

CHAT = "/v1/chat/completions"
# Tokens: seconds of decoding for tiny (~2 ms a step), so it is cut short. Its KV (~7k
# tokens with the decode buffer's copy) fits the budget; 20,000 would not (503).
LONG = 3000
BUDGET_MB = 8


@pytest.fixture(scope="module")
def server(server_factory: Any) -> ServerProcess:
    return server_factory(  # type: ignore[no-any-return]
        "--model",
        "tiny",
        "--max-running",
        "1",
        "--max-queue",
        "1",
        "--max-body-kb",
        "64",
        "--kv-cache-mb",
        str(BUDGET_MB),
    )


@pytest.fixture
async def idle(client: Client) -> Client:
    """The client, once nothing from an earlier test still runs."""
    stats = await client.settled()
    assert (stats["requests_running"], stats["requests_waiting"]) == (0, 0)
    return client


def messages(text: str | None = None) -> list[dict[str, str]]:
    """A short chat; the long requests use fixed stories, checked to run 500 tokens
    without an end-of-text (tiny's greedy output depends only on the prompt)."""
    return [
        {"role": "system", "content": "You are the voice of a small house."},
        {"role": "user", "content": text or f"tell me a story {uuid.uuid4().hex}"},
    ]


def json_headers(client: Client) -> dict[str, str]:
    return {**client.server.auth, "Content-Type": "application/json"}


class OpenStream:
    """A streamed completion that the test reads a little of, then drops."""

    def __init__(self, client: Client, body: dict[str, Any]) -> None:
        self.client = client
        self.body = {**body, "stream": True}
        self.response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> OpenStream:
        self.response = await self.client.session.post(
            self.client.url(CHAT), data=json.dumps(self.body), headers=json_headers(self.client)
        )
        assert self.response.status == 200
        for _ in range(3):  # role chunk and some content: it is decoding now
            line = await self.response.content.readline()
            while line == b"\n":
                line = await self.response.content.readline()
            assert line.startswith(b"data: {"), line
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.disconnect()

    def disconnect(self) -> None:
        if self.response is not None:
            self.response.close()  # closes the connection, not just the response


async def wait_for(client: Client, key: str, value: int, within_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        stats = await client.stats()
        if stats[key] == value or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.05)


def assert_released(stats: dict[str, Any]) -> None:
    assert stats["kv_cache_locked_nodes"] == 0
    assert stats["kv_cache_locked_bytes"] == 0
    assert stats["kv_working_bytes"] == 0
    assert stats["requests_running"] == 0
    assert stats["requests_waiting"] == 0


# ---------------------------------------------------------------- queue full


async def test_full_queue_is_503_with_retry_after(idle: Client) -> None:
    client = idle
    async with OpenStream(
        client,
        {
            "messages": messages("tell me a story about the kitchen"),
            "max_tokens": LONG,
            "min_tokens": LONG,
        },
    ):
        assert (await wait_for(client, "requests_running", 1))["requests_running"] == 1
        short = {"messages": messages("tell me a story about the porch"), "max_tokens": 2}
        waiting = asyncio.create_task(client.request("POST", CHAT, json_body=short))
        assert (await wait_for(client, "requests_waiting", 1))["requests_waiting"] == 1
        for stream in (False, True):
            status, headers, body = await client.request(
                "POST", CHAT, json_body={"messages": messages(), "stream": stream}
            )
            assert status in (429, 503), body
            assert int(headers["Retry-After"]) >= 1
            assert headers["Content-Type"].startswith("application/json")
            assert body["error"]["code"] == "overloaded"
            assert "busy" in body["error"]["message"]
    # The running stream was dropped: the waiting request gets its turn.
    status, _, body = await waiting
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 2
    assert_released(await client.settled())


# ---------------------------------------------------------------- disconnects


async def test_disconnect_mid_stream_releases_everything(
    idle: Client, server: ServerProcess
) -> None:
    client = idle
    prompt = messages("tell me a story about the hall")
    await client.chat(messages=prompt, max_tokens=1)  # cached: the stream will lock it
    before = await client.stats()
    log_start = len(server.stderr())
    async with OpenStream(
        client, {"messages": prompt, "max_tokens": LONG, "min_tokens": LONG}
    ) as stream:
        during = await client.stats()
        assert during["requests_running"] == 1
        assert during["kv_cache_locked_nodes"] >= 1
        assert during["kv_working_bytes"] > 0
        stream.disconnect()
        after = await client.settled()
    assert_released(after)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    # Regression: the disconnect logged a traceback.
    log = server.stderr()[log_start:]
    assert "Traceback" not in log
    assert "Error handling request" not in log
    # Still serving, and the cancelled request's prompt stayed cached.
    reply = await client.chat(messages=prompt, max_tokens=2)
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] >= (
        reply["usage"]["prompt_tokens"] - 1
    )


async def test_disconnect_during_a_non_streaming_request_releases_everything(
    idle: Client, server: ServerProcess
) -> None:
    client = idle
    prompt = messages("tell me a story about the garden")
    await client.chat(messages=prompt, max_tokens=1)
    before = await client.stats()
    log_start = len(server.stderr())
    body = {"messages": prompt, "max_tokens": LONG, "min_tokens": LONG}
    # A session of its own, closed below: a cancelled request's connection is then
    # closed at once (a shared session may keep it open a while).
    async with aiohttp.ClientSession() as own:
        request = asyncio.create_task(
            own.post(client.url(CHAT), data=json.dumps(body), headers=json_headers(client))
        )
        during = await wait_for(client, "requests_running", 1)
        assert during["kv_cache_locked_nodes"] >= 1
        request.cancel()  # the client gives up
        with pytest.raises(asyncio.CancelledError):
            await request
    after = await client.settled()
    assert_released(after)
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1
    assert "Traceback" not in server.stderr()[log_start:]


async def test_disconnect_while_queued_frees_the_queue_slot(idle: Client) -> None:
    client = idle
    async with OpenStream(
        client,
        {
            "messages": messages("tell me a story about the attic"),
            "max_tokens": LONG,
            "min_tokens": LONG,
        },
    ):
        queued = asyncio.create_task(
            client.request("POST", CHAT, json_body={"messages": messages(), "max_tokens": 2})
        )
        assert (await wait_for(client, "requests_waiting", 1))["requests_waiting"] == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        stats = await wait_for(client, "requests_waiting", 0)
        assert stats["requests_waiting"] == 0
        assert stats["requests_running"] == 1  # the stream goes on
    assert_released(await client.settled())


# ---------------------------------------------------------------- privacy


async def test_prompts_are_not_logged_by_default(idle: Client, server: ServerProcess) -> None:
    client = idle
    marker = f"private-words-{uuid.uuid4().hex}"
    reply = await client.chat(messages=messages(marker), max_tokens=2)
    await client.stream(messages=messages(marker), max_tokens=2)
    await client.put_pin(f"p-{marker[-8:]}", messages=messages(marker))
    await client.error(
        "POST", CHAT, 422, json_body={"messages": messages(marker), "max_tokens": 10**6}
    )
    await client.error(
        "POST", CHAT, 400, json_body={"messages": messages(marker), "temperature": "hot"}
    )
    server.wait_for_log(f"chat {reply['id'][-8:]}: prompt=")  # requests are logged...
    assert marker not in server.stderr()  # ...but not what was said
    await client.request("DELETE", f"/v1/prefixes/p-{marker[-8:]}")


# ---------------------------------------------------------------- body limit, KV budget


async def test_body_limit_follows_max_body_kb(idle: Client) -> None:
    client = idle
    over = json.dumps({"messages": messages("x" * 64 * 1024), "max_tokens": 2})
    assert len(over) > 64 * 1024
    error = await client.error(
        "POST", CHAT, 413, "request_too_large", data=over, headers=json_headers(client)
    )
    assert str(64 * 1024) in error["message"]
    under = json.dumps({"messages": messages("word " * 1000), "max_tokens": 1})
    under += " " * (64 * 1024 - 64 - len(under))  # just under the limit (JSON whitespace)
    status, _, body = await client.request("POST", CHAT, data=under, headers=json_headers(client))
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 1


async def test_pin_larger_than_the_kv_budget_is_422(idle: Client) -> None:
    client = idle
    name = "too-big"
    body = {"messages": messages("x " * 9000)}
    error = await client.error("PUT", f"/v1/prefixes/{name}", 422, "pin_too_large", json_body=body)
    assert str(BUDGET_MB << 20) in error["message"]  # says the budget
    await client.error("GET", f"/v1/prefixes/{name}", 404, "not_found")


async def test_budget_held_by_pins_is_503(idle: Client) -> None:
    client = idle
    first = await client.put_pin("first", messages=messages("a " * 4800))
    try:
        status, headers, body = await client.request(
            "PUT", "/v1/prefixes/second", json_body={"messages": messages("b " * 4800)}
        )
        assert status == 503, body
        assert body["error"]["code"] == "overloaded"
        assert int(headers["Retry-After"]) >= 1
        shown = await client.get("/v1/prefixes/first")
        assert (shown["state"], shown["hash"]) == ("ready", first["hash"])
    finally:
        await client.request("DELETE", "/v1/prefixes/first")
    await client.put_pin("second", messages=messages("b " * 4800))  # fits once it is free
    await client.request("DELETE", "/v1/prefixes/second")


async def test_a_request_that_could_never_fit_the_budget_is_503(idle: Client) -> None:
    body = {"messages": messages(), "max_tokens": 20000}  # within the context, not the KV
    error = await idle.error("POST", CHAT, 503, "overloaded", json_body=body)
    assert "max_tokens" in error["message"]
    assert "--kv-cache-mb" in error["message"]
    reply = await idle.chat(messages=messages(), max_tokens=2)  # still serving
    assert reply["usage"]["completion_tokens"] == 2
    assert_released(await idle.settled())


async def test_pins_beyond_the_queue_are_503_and_chats_are_still_served(idle: Client) -> None:
    """Regression: ``PUT ?wait=false`` queued pins without limit (only chat requests
    counted against ``--max-queue``), and then every chat got a 503."""
    client = idle
    story = {"messages": messages("tell me a story about the cellar")}
    async with OpenStream(client, {**story, "max_tokens": LONG, "min_tokens": LONG}):
        assert (await wait_for(client, "requests_running", 1))["requests_running"] == 1
        path = "/v1/prefixes/queued-{}?wait=false"
        status, _, body = await client.request(
            "PUT", path.format(1), json_body={"messages": messages("pin one")}
        )
        assert status == 202, body
        for n in (2, 3):
            status, headers, body = await client.request(
                "PUT", path.format(n), json_body={"messages": messages(f"pin {n}")}
            )
            assert status == 503, body
            assert body["error"]["code"] == "overloaded"
            assert "waiting" in body["error"]["message"]
            assert int(headers["Retry-After"]) >= 1
            await client.error("GET", f"/v1/prefixes/queued-{n}", 404, "not_found")
    # The stream was dropped: the queued pin warms up, and chats are served again.
    await wait_for(client, "requests_waiting", 0)
    reply = await client.chat(messages=messages(), max_tokens=2)
    assert reply["usage"]["completion_tokens"] == 2
    deadline = time.monotonic() + 60
    while (await client.get("/v1/prefixes/queued-1"))["state"] == "warming":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert (await client.get("/v1/prefixes/queued-1"))["state"] == "ready"
    await client.request("DELETE", "/v1/prefixes/queued-1")
    assert_released(await client.settled())
