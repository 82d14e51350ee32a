"""``--max-context``: the engine serves less context than the model has, and says so.

A small box may want a shorter context than the model's own (the KV of one request is
bounded by it); the integration reads the served context from ``/v1/models`` to size the
pinned house (custom_components/hearth/prefix/budget.py), and its tests shrink the tiny
model's 32,768 tokens this way to try a house that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .conftest import Client, ServerProcess, run_serve
from .test_server_chat import system, user

CONTEXT = 300


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--model", "tiny", "--max-context", str(CONTEXT))


async def test_the_served_context_is_reported_and_enforced(client: Client) -> None:
    models = await client.get("/v1/models")
    assert [m["context_length"] for m in models["data"]] == [CONTEXT]
    reply = await client.chat(messages=[user("hi")], max_tokens=4)
    assert reply["usage"]["prompt_tokens"] < CONTEXT
    error = await client.error(
        "POST",
        "/v1/chat/completions",
        422,
        "context_length_exceeded",
        json_body={"messages": [system(words=400), user("hi")], "max_tokens": 4},
    )
    assert str(CONTEXT) in error["message"]
    error = await client.error(
        "PUT",
        "/v1/prefixes/house",
        422,
        "context_length_exceeded",
        json_body={"messages": [system(words=400)]},
    )


def test_a_context_that_is_not_a_positive_number_is_refused() -> None:
    for bad in ("0", "-5", "many"):
        result = run_serve("--model", "tiny", "--max-context", bad)
        assert result.returncode == 2, result.stderr
        assert "--max-context" in result.stderr
