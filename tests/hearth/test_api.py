"""The pin API client (``backend/api.py``) and the probe (``backend/server_info.py``)
when the answer is not what a healthy Hearth engine sends.

The engine's own error statuses come from a real engine. What an engine never sends (an
HTML error page from a proxy, a truncated body, a model list that is not a list,
llama.cpp's numeric error code, a 403 on an optional route) comes from ``OddServer``, a
real aiohttp server on loopback that answers each route with a fixed response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant
from homeassistant.helpers.aiohttp_client import async_get_clientsession

from custom_components.hearth.backend.api import (
    HearthAuthError,
    HearthClient,
    HearthConnectionError,
    HearthNotFoundError,
    HearthResponseError,
)
from custom_components.hearth.backend.hearth import HearthBackend
from custom_components.hearth.backend.server_info import ServerKind, async_probe

from .common import EngineProcess, LoopbackServer, free_port

type Handler = Callable[[web.Request], web.Response]


def _answer(status: int = 200, text: str = "", content_type: str = "application/json") -> Handler:
    async def handler(_request: web.Request) -> web.Response:
        return web.Response(status=status, text=text, content_type=content_type)

    return handler  # type: ignore[return-value]


class OddServer(LoopbackServer):
    """A loopback HTTP server with one fixed answer per GET route (others: 404)."""

    def __init__(self, routes: dict[str, Handler]) -> None:
        super().__init__()
        self.routes = routes

    def add_routes(self, app: web.Application) -> None:
        for path, handler in self.routes.items():
            app.router.add_route("*", path, handler)


@pytest.fixture
async def odd_server(socket_enabled: None) -> AsyncIterator[Callable[..., OddServer]]:
    started: list[OddServer] = []

    async def factory(routes: dict[str, Handler]) -> OddServer:
        server = OddServer(routes)
        await server.start()
        started.append(server)
        return server

    yield factory  # type: ignore[misc]
    for server in started:
        await server.stop()


def _client(hass: HomeAssistant, url: str, api_key: str | None = None) -> HearthClient:
    return HearthClient(async_get_clientsession(hass), url, api_key)


async def test_engine_errors_keep_the_status_and_the_code(
    hass: HomeAssistant, engine: EngineProcess
) -> None:
    client = _client(hass, engine.url + "/")
    assert client.url == engine.url  # the trailing slash is dropped
    with pytest.raises(HearthNotFoundError) as raised:
        await client.async_delete_prefix("hearth.no-such-pin")
    assert raised.value.status == 404
    assert raised.value.code == "not_found"
    assert "no-such-pin" in raised.value.message
    # An optional route the engine does not have is absent, not an error.
    assert await client.async_optional_text("/no-such-route") is None
    assert await client.async_optional_text("/health") is not None


async def test_a_refused_key_is_never_an_absent_route(
    hass: HomeAssistant, keyed: EngineProcess
) -> None:
    """Without the key, /health answers and every other route is a 401, also when the
    caller only probes whether the route exists (a probe must not hide a bad key)."""
    client = _client(hass, keyed.url)
    await client.async_health()
    with pytest.raises(HearthAuthError) as raised:
        await client.async_optional_text("/v1/stats")
    assert raised.value.status == 401
    with pytest.raises(HearthAuthError):
        await _client(hass, keyed.url, "wrong-key").async_models()


async def test_nothing_listening_is_a_connection_error(
    hass: HomeAssistant, socket_enabled: None
) -> None:
    client = _client(hass, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HearthConnectionError, match="GET /health failed"):
        await client.async_health()


async def test_answers_no_engine_sends(
    hass: HomeAssistant, odd_server: Callable[..., OddServer]
) -> None:
    server = await odd_server(
        {
            # A proxy's HTML error page: the status and its reason, no code.
            "/health": _answer(502, "<html>Bad Gateway</html>", "text/html"),
            # Truncated JSON from a server that answered 200.
            "/v1/stats": _answer(200, '{"instance_id": "a'),
            # Valid JSON, but not an OpenAI model list / not Hearth's stats or pins.
            "/v1/models": _answer(200, '{"data": "qwen"}'),
            "/v1/prefixes": _answer(200, "[]"),
            # llama.cpp's error body: a numeric code and a type.
            "/v1/cache/clear": _answer(
                500, '{"error": {"code": 500, "type": "server_error", "message": "no slot"}}'
            ),
        }
    )
    client = _client(hass, server.url)

    with pytest.raises(HearthResponseError) as raised:
        await client.async_health()
    assert (raised.value.status, raised.value.code) == (502, None)
    assert raised.value.message == "Bad Gateway"
    assert not isinstance(raised.value, HearthAuthError | HearthNotFoundError)

    with pytest.raises(HearthConnectionError, match="invalid JSON"):
        await client.async_stats()
    with pytest.raises(HearthConnectionError, match="/v1/models"):
        await client.async_models()
    with pytest.raises(HearthConnectionError, match="/v1/prefixes"):
        await client.async_list_prefixes()

    with pytest.raises(HearthResponseError) as raised:
        await client.async_clear_cache()
    assert (raised.value.status, raised.value.code) == (500, "server_error")
    assert raised.value.message == "no slot"
    # A 500 on an optional route is an error, not an absent route.
    with pytest.raises(HearthResponseError):
        await client.async_optional_text("/v1/cache/clear")


async def test_shapes_that_are_read_as_nothing(
    hass: HomeAssistant, odd_server: Callable[..., OddServer]
) -> None:
    """Answers of the right status whose shape carries nothing: a stats body that is
    not Hearth's, a cache clear or a pin without a JSON object."""
    server = await odd_server(
        {
            "/v1/stats": _answer(200, '{"uptime_s": 3}'),
            "/v1/cache/clear": _answer(200, "[]"),
            "/v1/prefixes/{name}": _answer(200, "null"),
        }
    )
    client = _client(hass, server.url)
    with pytest.raises(HearthConnectionError, match="/v1/stats"):
        await client.async_stats()
    assert await client.async_clear_cache() == 0
    assert await client.async_put_prefix("hearth.x", {"messages": []}) == {}


async def test_probe_of_a_server_that_hides_its_optional_routes(
    hass: HomeAssistant, odd_server: Callable[..., OddServer]
) -> None:
    """No /health, /v1/stats that is not JSON, /metrics and /props refused (a proxy's
    403): an OpenAI-compatible server, alive through /v1/models, without metrics."""
    server = await odd_server(
        {
            "/v1/models": _answer(200, '{"data": [{"id": "m1", "owned_by": "someone"}, 3]}'),
            "/v1/stats": _answer(200, "not json", "text/plain"),
            "/metrics": _answer(403, "forbidden", "text/plain"),
            "/props": _answer(403, "forbidden", "text/plain"),
        }
    )
    info = await async_probe(_client(hass, server.url))
    assert info.kind is ServerKind.OPENAI
    assert info.model == "m1"
    assert info.health is False
    assert info.metrics is False
    assert info.slots == 0
    assert info.context_length is None  # not told: the entry's option may say it


async def test_probe_tells_llama_cpp_by_its_props(
    hass: HomeAssistant, odd_server: Callable[..., OddServer]
) -> None:
    """Metrics without a known prefix, but llama.cpp's /props with its slots and their
    context (which wins over the ``meta`` of its /v1/models)."""
    props = '{"default_generation_settings": {"n_ctx": 2048}, "total_slots": 4}'
    server = await odd_server(
        {
            "/health": _answer(200, '{"status": "ok"}'),
            "/v1/models": _answer(200, '{"data": [{"id": "smol", "meta": {"n_ctx": 8192}}]}'),
            "/metrics": _answer(200, "# nothing yet\n", "text/plain"),
            "/props": _answer(200, props),
        }
    )
    info = await async_probe(_client(hass, server.url))
    assert info.kind is ServerKind.LLAMA_CPP
    assert (info.health, info.metrics, info.slots) == (True, True, 4)
    assert info.context_length == 2048


async def test_argument_presence_goes_only_to_an_engine_that_takes_it(
    hass: HomeAssistant, engine: EngineProcess, odd_server: Callable[..., OddServer]
) -> None:
    """An argument left out (an empty list) or required is sent where the engine lists
    those extensions (this one does), and dropped for an older engine, which would
    refuse the request (the real engine's 400 is in tests/engine/test_server_constraints.py)."""
    values = {
        "argument_values": {"name": ["Den"], "HassTurnOn.name": []},
        "required_arguments": ["HassTurnOn.area"],
    }
    info = await async_probe(_client(hass, engine.url))
    assert {"empty_argument_values", "required_arguments"} <= info.extensions
    sent = HearthBackend(info, _client(hass, engine.url), None).request_extensions(values)  # type: ignore[arg-type]
    assert sent == {"hearth": values}
    older = await odd_server(
        {
            "/health": _answer(200, '{"status": "ok"}'),
            "/v1/models": _answer(200, '{"data": [{"id": "smol"}]}'),
            "/v1/stats": _answer(200, '{"instance_id": "a"}'),
        }
    )
    info = await async_probe(_client(hass, older.url))
    assert (info.kind, info.extensions) == (ServerKind.HEARTH, frozenset())
    sent = HearthBackend(info, _client(hass, older.url), None).request_extensions(values)  # type: ignore[arg-type]
    assert sent == {"hearth": {"argument_values": {"name": ["Den"]}}}
