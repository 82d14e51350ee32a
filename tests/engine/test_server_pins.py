"""Prefix pins over HTTP: ``PUT/GET/DELETE /v1/prefixes/{name}`` and ``GET /v1/prefixes``.

Restoring pins after a restart (``--prefix-store``) is in test_server_lifecycle.py; a pin
larger than the KV budget in test_server_limits.py.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

import pytest

from .conftest import Client, ServerProcess
from .test_server_chat import TOOLS, system, user


@pytest.fixture(scope="module")
def server(tools_server: ServerProcess) -> ServerProcess:
    return tools_server


def pin_name() -> str:
    return f"house.{uuid.uuid4().hex[:12]}:test"


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def pinned_by(reply: dict[str, Any]) -> str | None:
    return reply["usage"]["hearth"]["pin"]  # type: ignore[no-any-return]


async def listed(client: Client) -> dict[str, dict[str, Any]]:
    body = await client.get("/v1/prefixes")
    assert body["object"] == "list"
    return {p["name"]: p for p in body["data"]}


async def test_pin_lifecycle_create_hit_repin_delete(client: Client) -> None:
    name = pin_name()
    house = system(words=60)

    # Before the pin, a request with this system text finds (almost) nothing cached.
    cold = await client.chat(messages=[house, user("hi")])
    assert cached(cold) < 10
    assert pinned_by(cold) is None

    # create
    pin = await client.put_pin(name, messages=[house])
    assert pin["name"] == name
    assert pin["state"] == "ready"
    assert pin["restored"] is False
    assert pin["tokens"] > 60
    assert re.fullmatch(r"[0-9a-f]{16}", pin["hash"])
    assert (pin["hits"], pin["tokens_reused"]) == (0, 0)
    tokens = pin["tokens"]
    assert (await listed(client))[name]["hash"] == pin["hash"]

    # hit: every request that starts with the pinned tokens reuses all of them
    for n, text in enumerate(["good evening", "what time is it"], start=1):
        reply = await client.chat(messages=[house, user(text)])
        assert cached(reply) >= tokens
        assert pinned_by(reply) == name
        shown = await client.get(f"/v1/prefixes/{name}")
        assert (shown["hits"], shown["tokens_reused"]) == (n, n * tokens)

    # re-pin the name with another prefix: requests now hit the new one
    new_house = system(words=30)
    repin = await client.put_pin(name, messages=[new_house])
    assert repin["state"] == "ready"
    assert repin["hash"] != pin["hash"]
    assert repin["tokens"] != tokens
    shown = await client.get(f"/v1/prefixes/{name}")
    assert (shown["hash"], shown["tokens"]) == (repin["hash"], repin["tokens"])
    reply = await client.chat(messages=[new_house, user("hi")])
    assert cached(reply) >= repin["tokens"]
    assert pinned_by(reply) == name
    old = await client.chat(messages=[house, user("hi")])
    assert pinned_by(old) is None  # the old prefix is no longer pinned

    # delete
    status, _, body = await client.request("DELETE", f"/v1/prefixes/{name}")
    assert (status, body) == (200, {"name": name, "deleted": True})
    assert name not in await listed(client)
    await client.error("GET", f"/v1/prefixes/{name}", 404, "not_found")
    await client.error("DELETE", f"/v1/prefixes/{name}", 404, "not_found")
    after = await client.chat(messages=[new_house, user("hello")])
    assert pinned_by(after) is None


async def test_pin_with_tools_matches_requests_with_the_same_tools(client: Client) -> None:
    name = pin_name()
    house = system(words=20)
    pin = await client.put_pin(name, messages=[house], tools=TOOLS)
    same = await client.chat(messages=[house, user("hi")], tools=TOOLS)
    assert pinned_by(same) == name
    assert cached(same) >= pin["tokens"]
    other_tools = [TOOLS[1]]
    other = await client.chat(messages=[house, user("hi")], tools=other_tools)
    assert pinned_by(other) is None
    assert cached(other) < pin["tokens"]
    await client.request("DELETE", f"/v1/prefixes/{name}")


async def test_pin_without_wait_answers_202_then_becomes_ready(client: Client) -> None:
    name = pin_name()
    pin = await client.put_pin(name, wait=False, messages=[system(words=200)])
    assert pin["name"] == name
    assert pin["state"] == "warming"
    deadline = time.monotonic() + 120
    while True:
        shown = await client.get(f"/v1/prefixes/{name}")
        if shown["state"] != "warming" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert shown["state"] == "ready"
    assert shown["hash"] == pin["hash"]
    await client.request("DELETE", f"/v1/prefixes/{name}")


async def test_pinning_cached_tokens_again_costs_no_prefill(client: Client) -> None:
    name = pin_name()
    house = system(words=20)
    first = await client.put_pin(name, messages=[house])
    again = await client.put_pin(name, messages=[house])
    assert again["state"] == "ready"
    assert again["hash"] == first["hash"]
    assert again["prefill_ms"] == 0
    await client.request("DELETE", f"/v1/prefixes/{name}")


async def test_a_re_pin_that_keeps_the_old_bytes_computes_only_what_follows(
    client: Client,
) -> None:
    """The plugin re-pins a changed house as the pinned messages plus one message that
    tells the change: the engine prefills that message, not the house again."""
    name = pin_name()
    house = system(words=200)
    first = await client.put_pin(name, messages=[house])
    assert first["prefilled_tokens"] > 0.8 * first["tokens"]  # (the template's start is shared)
    told = {"role": "system", "content": "Changes: Lamp was renamed to Desk Lamp."}
    repin = await client.put_pin(name, messages=[house, told])
    added = repin["tokens"] - first["tokens"]
    assert 0 < repin["prefilled_tokens"] <= added + 8  # a few tokens of the old tail
    assert repin["prefilled_tokens"] < 0.15 * repin["tokens"]
    again = await client.put_pin(name, messages=[house, told])
    assert (again["prefilled_tokens"], again["prefill_ms"]) == (0, 0)
    await client.request("DELETE", f"/v1/prefixes/{name}")


async def test_repinning_the_same_prefix_keeps_counting_hits(client: Client) -> None:
    name = pin_name()
    house = system(words=20)
    await client.put_pin(name, messages=[house])
    await client.put_pin(name, messages=[house])  # e.g. Home Assistant restarted
    reply = await client.chat(messages=[house, user("hi")])
    try:
        assert pinned_by(reply) == name
        assert (await client.get(f"/v1/prefixes/{name}"))["hits"] == 1
    finally:
        await client.request("DELETE", f"/v1/prefixes/{name}")


async def test_pin_names_at_the_limits(client: Client) -> None:
    house = [system(words=4)]
    for name in ("a", "0" + "z" * 127, "Area_1-kitchen.v2:hearth"):
        pin = await client.put_pin(name, messages=house)
        assert pin["name"] == name
        status, _, _ = await client.request("DELETE", f"/v1/prefixes/{name}")
        assert status == 200


@pytest.mark.parametrize(
    "raw_name",
    [
        "-leading-dash",
        ".hidden",
        "a" * 129,
        "with%20space",
        "slash%2Fname",
        "trailing-newline%0A",  # regression: the pattern ended in "$", which allows "\n"
        "tab%09",
        "caf%C3%A9",
    ],
)
async def test_invalid_pin_names_are_400(client: Client, raw_name: str) -> None:
    body = {"messages": [system(words=4)]}
    for method in ("PUT", "GET", "DELETE"):
        error = await client.error(
            method,
            f"/v1/prefixes/{raw_name}",
            400,
            "invalid_name",
            json_body=body if method == "PUT" else None,
        )
        assert error["param"] == "name"
    assert not any(n.startswith(("trailing", "a" * 129)) for n in await listed(client))


async def test_pin_wait_flag_must_be_a_boolean(client: Client) -> None:
    error = await client.error(
        "PUT",
        f"/v1/prefixes/{pin_name()}?wait=maybe",
        400,
        "invalid_value",
        json_body={"messages": [system(words=4)]},
    )
    assert error["param"] == "wait"


@pytest.mark.parametrize(
    "body",
    [{}, {"messages": []}, {"messages": "hi"}, {"messages": [{"role": "robot", "content": "x"}]}],
)
async def test_pin_body_is_validated(client: Client, body: dict[str, Any]) -> None:
    name = pin_name()
    await client.error("PUT", f"/v1/prefixes/{name}", 400, json_body=body)
    await client.error("GET", f"/v1/prefixes/{name}", 404, "not_found")


async def test_pin_over_the_context_is_422(client: Client) -> None:
    name = pin_name()
    house = {"role": "system", "content": "x " * 33_000}
    error = await client.error(
        "PUT",
        f"/v1/prefixes/{name}",
        422,
        "context_length_exceeded",
        json_body={"messages": [house]},
    )
    assert "32768" in error["message"]
    await client.error("GET", f"/v1/prefixes/{name}", 404, "not_found")
