"""Where the first token's time goes: ``usage.hearth`` splits the server's time to the
first token into waiting for the prepare thread, preparing, the engine's queue and
prefill, and names the part spent behind pin work (a real ``serve`` process)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Client, ServerProcess

PARTS = ("prepare_wait_ms", "prepare_ms", "queue_ms", "prefill_ms", "pin_wait_ms")


@pytest.fixture(scope="module")
def server(server_factory: Any) -> ServerProcess:
    return server_factory("--model", "tiny", "--dtype", "float32")


def check_split(hearth: dict[str, Any]) -> None:
    assert all(hearth[part] >= 0 for part in PARTS), hearth
    # The server's time to the first token is its parts, in order.
    total = hearth["prepare_wait_ms"] + hearth["prepare_ms"] + hearth["ttft_ms"]
    assert hearth["server_ttft_ms"] == pytest.approx(total, abs=0.01)
    assert hearth["ttft_ms"] == pytest.approx(hearth["queue_ms"] + hearth["prefill_ms"], abs=1)
    assert hearth["pin_wait_ms"] <= hearth["ttft_ms"] + 0.01


async def test_usage_splits_the_time_to_the_first_token(client: Client) -> None:
    messages = [{"role": "user", "content": "turn on the kitchen light"}]
    reply = await client.chat(messages=messages, max_tokens=4)
    check_split(reply["usage"]["hearth"])
    assert reply["usage"]["hearth"]["pin_wait_ms"] == 0  # no pin ran meanwhile
    events = await client.stream(
        messages=messages, max_tokens=4, stream_options={"include_usage": True}
    )
    check_split(events[-2]["usage"]["hearth"])


async def test_a_request_behind_a_pin_says_how_long_it_waited(client: Client) -> None:
    house = {"role": "system", "content": "entity kitchen light " * 6000}
    await client.put_pin("big", wait=False, messages=[house])
    reply = await client.chat(
        messages=[{"role": "user", "content": "what time is it?"}], max_tokens=2
    )
    hearth = reply["usage"]["hearth"]
    check_split(hearth)
    # It arrived while a pin chunk ran, and waited for it to end.
    assert hearth["pin_wait_ms"] > 0, hearth
    await client.settled()
    status, _, _ = await client.request("DELETE", "/v1/prefixes/big")
    assert status == 200
