"""The real aiohttp application (``create_app``) over a scripted fake engine, in process.

The subprocess tests show the behaviour end to end; these pin down the paths a real
model cannot be steered into on demand: an engine error before or during a stream, a
request cancelled at shutdown, a refusal raised when the engine's event stream is first
iterated, and a client that is gone between two writes of a stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from transformers import AutoTokenizer

from hearth_engine.model.prepare.tiny import prepare_tiny_model
from hearth_engine.server.app import create_app
from hearth_engine.serving.engine import (
    ContextLengthError,
    EngineClosedError,
    EngineFailedError,
    QueueFullError,
)
from hearth_engine.serving.sequence import ErrorEvent, FinishEvent, RequestStats, TokenEvent

from .conftest import assert_error, parse_sse

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}

Script = Callable[["FakeEngine"], Iterator[Any]]


def tokens(*texts: str) -> Iterator[TokenEvent]:
    for i, text in enumerate(texts):
        yield TokenEvent(i + 1, text)


def finish(reason: str = "stop", text: str = "") -> FinishEvent:
    return FinishEvent(reason, text, RequestStats(prompt_tokens=5, completion_tokens=2))


@dataclass
class FakeEngine:
    """What the server uses of ``Engine``; ``stream`` plays ``script`` (an exception in
    it is raised)."""

    tokenizer: Any
    script: Script = lambda engine: iter([finish()])
    info: Any = field(
        default_factory=lambda: SimpleNamespace(name="fake", context_length=4096, vocab_size=8192)
    )
    config: Any = field(default_factory=lambda: SimpleNamespace(default_max_tokens=16))
    output: Any = field(
        default_factory=lambda: SimpleNamespace(finished_listeners=[], stop_token_ids=frozenset())
    )
    alive: bool = True
    started_at: float = 0.0
    transport: Any = None  # the current request's, for the disconnect test
    streams_opened: int = 0
    streams_closed: int = 0

    @property
    def runner(self) -> Any:
        return SimpleNamespace(tokenizer=self.tokenizer)

    def check_context(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.info.context_length:
            raise ContextLengthError("too long")

    async def stream(
        self,
        prompt: list[int],
        params: Any,
        *,
        salt: str | None = None,
        constraint: Any = None,
        stats: Any = None,
    ) -> Any:
        self.streams_opened += 1
        try:
            for item in self.script(self):
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.streams_closed += 1


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(prepare_tiny_model())


@pytest.fixture
def engine(tokenizer: Any) -> FakeEngine:
    return FakeEngine(tokenizer)


@pytest.fixture
async def http(engine: FakeEngine) -> AsyncIterator[TestClient[Any, Any]]:
    app = create_app(engine)  # type: ignore[arg-type]

    @web.middleware
    async def keep_transport(request: web.Request, handler: Any) -> web.StreamResponse:
        engine.transport = request.transport
        return await handler(request)  # type: ignore[no-any-return]

    app.middlewares.append(keep_transport)
    async with TestClient(TestServer(app)) as client:
        yield client


async def post(http: TestClient[Any, Any], **extra: Any) -> tuple[int, Any, str]:
    response = await http.post(CHAT, json={**BODY, **extra})
    return response.status, response.headers, await response.text()


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


# ---------------------------------------------------------------- normal paths


async def test_content_and_finish(http: TestClient[Any, Any], engine: FakeEngine) -> None:
    engine.script = lambda e: iter([*tokens("Hel", "lo"), finish("length", "!")])
    status, _, text = await post(http)
    assert status == 200
    reply = json.loads(text)
    assert reply["choices"][0]["message"]["content"] == "Hello!"
    assert reply["choices"][0]["finish_reason"] == "length"
    status, _, text = await post(http, stream=True)
    events = parse_sse(text)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "Hello!"
    assert events[-1] == "[DONE]"
    assert engine.streams_closed == engine.streams_opened == 2


# ---------------------------------------------------------------- refusals and failures


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("refusal", "retry_after"),
    [(QueueFullError("9 requests are already waiting"), 1), (EngineClosedError("closing"), 5)],
)
async def test_refusal_at_the_first_event_is_503(
    http: TestClient[Any, Any],
    engine: FakeEngine,
    stream: bool,
    refusal: Exception,
    retry_after: int,
) -> None:
    """Regression: ``Engine.stream`` refuses when first iterated, not when called; the
    refusal escaped the mapping and became a 500."""
    engine.script = lambda e: iter([refusal])
    status, headers, text = await post(http, stream=stream)
    assert_error(status, json.loads(text), 503, "overloaded")
    assert headers["Retry-After"] == str(retry_after)
    assert headers["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("stream", [False, True])
async def test_cancelled_at_shutdown_is_503_not_an_empty_answer(
    http: TestClient[Any, Any], engine: FakeEngine, stream: bool
) -> None:
    """Regression: a request the engine cancelled at shutdown came back as a 200 with
    whatever it had so far, as if it were complete."""
    engine.script = lambda e: iter([finish("cancelled")])
    status, headers, text = await post(http, stream=stream)
    error = assert_error(status, json.loads(text), 503, "overloaded")
    assert "shutting down" in error["message"]
    assert int(headers["Retry-After"]) >= 1


async def test_cancelled_at_shutdown_mid_answer(
    http: TestClient[Any, Any], engine: FakeEngine
) -> None:
    engine.script = lambda e: iter([*tokens("Hel", "lo"), finish("cancelled")])
    status, _, text = await post(http)
    assert_error(status, json.loads(text), 503, "overloaded")
    status, _, text = await post(http, stream=True)
    assert status == 200  # already streaming: the error comes as the last event
    events = parse_sse(text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "overloaded"
    assert not any(e["choices"][0]["finish_reason"] for e in events[:-2])


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_error_before_output_is_500_json(
    http: TestClient[Any, Any], engine: FakeEngine, stream: bool
) -> None:
    engine.script = lambda e: iter([ErrorEvent("internal engine error: RuntimeError")])
    status, headers, text = await post(http, stream=stream)
    assert_error(status, json.loads(text), 500, "engine_error")
    assert headers["Content-Type"].startswith("application/json")


async def test_engine_error_mid_stream_is_an_error_event(
    http: TestClient[Any, Any], engine: FakeEngine
) -> None:
    engine.script = lambda e: iter([*tokens("a", "b"), ErrorEvent("internal engine error: X")])
    status, _, text = await post(http, stream=True)
    assert status == 200
    events = parse_sse(text)
    assert events[-1] == "[DONE]"
    assert_error(500, events[-2], 500, "engine_error")


@pytest.mark.parametrize("stream", [False, True])
async def test_events_ending_without_a_finish_are_500(
    http: TestClient[Any, Any], engine: FakeEngine, stream: bool
) -> None:
    engine.script = lambda e: iter(list(tokens("a")))
    status, _, text = await post(http, stream=stream)
    if stream:
        events = parse_sse(text)
        assert events[-1] == "[DONE]"
        assert_error(500, events[-2], 500, "engine_error")
    else:
        assert_error(status, json.loads(text), 500, "engine_error")


# ---------------------------------------------------------------- client gone


async def test_client_gone_between_writes_is_not_an_error(
    http: TestClient[Any, Any], engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a write after the client went away raised ConnectionResetError out of
    the handler, and aiohttp logged it with a traceback as an error. The connection
    drops after two tokens, and the events keep coming without a pause in between (as
    from a fast model), so the next write finds the transport closing."""

    def script(engine: FakeEngine) -> Iterator[Any]:
        yield from tokens("one ", "two ")
        engine.transport.abort()  # the client is gone (a reset)
        yield from tokens(*["more "] * 20)
        yield finish()

    engine.script = script
    caplog.set_level(logging.DEBUG)
    with pytest.raises(aiohttp.ClientError):
        response = await http.post(CHAT, json={**BODY, "stream": True})
        await response.read()
    assert engine.streams_closed == engine.streams_opened == 1  # the request was closed
    assert errors_logged(caplog) == []
    assert "Traceback" not in caplog.text


async def test_health_is_503_when_the_worker_stopped(
    http: TestClient[Any, Any], engine: FakeEngine
) -> None:
    assert (await http.get("/health")).status == 200
    engine.alive = False
    response = await http.get("/health")
    assert response.status == 503
    assert (await response.json())["status"] == "error"


async def test_a_stopped_engine_is_a_503_not_a_500(
    http: TestClient[Any, Any], engine: FakeEngine
) -> None:
    def refuse(e: FakeEngine) -> Any:
        yield EngineFailedError("the engine stopped: internal engine error: RuntimeError")

    engine.script = refuse
    status, headers, text = await post(http)
    assert status == 503
    assert json.loads(text)["error"]["code"] == "engine_stopped"
    assert "Retry-After" in headers


async def test_min_tokens_above_max_tokens_is_400(http: TestClient[Any, Any]) -> None:
    status, _, text = await post(http, max_tokens=4, min_tokens=5)
    assert status == 400
    assert json.loads(text)["error"]["param"] == "min_tokens"
