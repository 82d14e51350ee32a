"""``logprobs`` and ``top_logprobs`` (issue 26, item 8): Hearth computes no log
probabilities, so asking for them is a clear 400 naming the parameter, not a reply that
silently leaves them out. Their "off" values are accepted, as OpenAI's clients send them.
The real application over a real engine, in process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hearth_engine.server.app import create_app
from hearth_engine.serving.engine import Engine

from .conftest import assert_error

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
async def http(make_engine: Callable[..., Engine]) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(create_app(make_engine()))) as client:
        yield client


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": True, "stream": True}, "logprobs"),
        ({"top_logprobs": 0}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
    ],
)
async def test_asking_for_log_probabilities_is_a_400(
    http: TestClient[Any, Any], extra: dict[str, Any], param: str
) -> None:
    response = await http.post(CHAT, json={**BODY, **extra})
    error = assert_error(response.status, await response.json(), 400, "unsupported_parameter")
    assert error["param"] == param
    assert "not supported" in error["message"]


@pytest.mark.parametrize("extra", [{"logprobs": False}, {"logprobs": None, "top_logprobs": None}])
async def test_their_off_values_are_accepted(
    http: TestClient[Any, Any], extra: dict[str, Any]
) -> None:
    response = await http.post(CHAT, json={**BODY, **extra})
    assert response.status == 200, await response.text()
    assert (await response.json())["choices"][0]["logprobs"] is None
