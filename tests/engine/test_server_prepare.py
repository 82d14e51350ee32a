"""Request preparation (render + tokenize) runs on the server's prepare thread.

Bug 8: rendering and tokenizing a 5k-token house prompt ran on the event loop, so every
request stalled every other one (streams, health checks) for that long. The real
``create_app`` runs here over a fake engine, in process.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from transformers import AutoTokenizer

from hearth_engine.model.prepare.tiny import prepare_tiny_model
from hearth_engine.server.app import create_app
from hearth_engine.server.state import ServerState

from .conftest import assert_error
from .test_server_inprocess import FakeEngine

CHAT = "/v1/chat/completions"
HOUSE = {"role": "system", "content": "You control a house."}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "HassTurnOn", "parameters": {"type": "object", "properties": {}}},
    }
]


class PinningEngine(FakeEngine):
    """A fake engine that also accepts pins (and remembers their tokens)."""

    pinned: list[int] | None = None

    async def pin(self, name: str, tokens: list[int], *, wait: bool = True) -> Any:
        self.pinned = tokens
        return SimpleNamespace(
            state="ready",
            tokens=len(tokens),
            restored=False,
            prefill_ms=1.0,
            error=None,
            as_dict=lambda: {"name": name, "tokens": len(tokens)},
        )

    def pin_status(self, name: str) -> None:
        return None


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(prepare_tiny_model())


@pytest.fixture
def engine(tokenizer: Any) -> PinningEngine:
    return PinningEngine(tokenizer)


@pytest.fixture
async def http(engine: PinningEngine) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(create_app(engine))) as client:  # type: ignore[arg-type]
        yield client


def _threads_of(state: ServerState) -> list[str]:
    """Record the thread each prompt encoding runs on."""
    seen: list[str] = []
    encode = state.prompts.encode

    def recording(*args: Any, **kwargs: Any) -> list[int]:
        seen.append(threading.current_thread().name)
        return encode(*args, **kwargs)

    state.prompts.encode = recording  # type: ignore[method-assign]
    return seen


async def test_chat_and_pin_are_prepared_off_the_event_loop(
    http: TestClient[Any, Any], engine: PinningEngine
) -> None:
    state = http.app[ServerState.KEY]
    seen = _threads_of(state)
    response = await http.put("/v1/prefixes/house", json={"messages": [HOUSE], "tools": TOOLS})
    assert response.status == 200, await response.text()
    messages = [HOUSE, {"role": "user", "content": "turn on the light"}]
    response = await http.post(CHAT, json={"messages": messages, "tools": TOOLS})
    assert response.status == 200, await response.text()
    assert len(seen) == 2
    assert all(name.startswith("hearth-prepare") for name in seen), seen
    assert state.prompts.hits == 1  # the request reused the pin's house tokens


async def test_the_server_formatter_does_not_share_the_workers_tokenizer(
    http: TestClient[Any, Any], engine: PinningEngine
) -> None:
    formatter = http.app[ServerState.KEY].formatter
    assert formatter.tokenizer is not engine.runner.tokenizer
    assert formatter.tokenizer.backend_tokenizer is not engine.runner.tokenizer.backend_tokenizer


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ raise_exception('no system role here') }}", "no system role here"),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "nested too deeply"),
    ],
    ids=["template-error", "recursion"],
)
@pytest.mark.parametrize("path", [CHAT, "/v1/prefixes/house"])
async def test_template_failures_on_the_prepare_thread_are_400(
    tokenizer: Any, template: str, message: str, path: str
) -> None:
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    app = create_app(PinningEngine(tok))  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as http:
        body = {"messages": [HOUSE, {"role": "user", "content": "hi"}]}
        method = http.post if path == CHAT else http.put
        response = await method(path, json=body)
        error = assert_error(response.status, await response.json(), 400)
        assert message in error["message"]
