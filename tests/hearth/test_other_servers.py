"""Servers without Hearth's pin API that cannot run here: vLLM and SGLang need a GPU.

``FakeServer`` stands in for their HTTP surface as they document it (``/health``,
``/v1/models`` with ``owned_by``, Prometheus ``/metrics`` with their names, streamed chat
completions with ``usage.prompt_tokens_details.cached_tokens``), with a prefix cache
that is a plain set of primed prefixes. That is a mock, and the only one: Home
Assistant and the integration are real. The real second engine, llama.cpp, is tested
in ``test_llama_cpp.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from homeassistant.core import HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.server_info import ServerKind
from custom_components.hearth.const import CONF_REPIN_DEBOUNCE, DOMAIN, SERVICE_CLEAR_CACHE

from .common import (
    KITCHEN_LIGHT,
    LoopbackServer,
    async_setup_entry,
    converse,
    make_entry,
    speech,
)

REPLY = "Done."


class FakeServer(LoopbackServer):
    """vLLM's or SGLang's HTTP surface; records every chat request."""

    def __init__(self, owner: str, metrics: str, call: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.owner = owner
        self.metrics = metrics
        self.call = call  # a tool call every streamed reply makes (a model that repeats)
        self.dies_mid_stream = False  # the process dies after a reply's first chunk
        self.stalls_mid_stream = 0.0  # seconds it then hangs before going on
        self.bodies: list[dict[str, Any]] = []
        self.cached: set[str] = set()  # system prompts seen (the "prefix cache")
        self.model: dict[str, Any] = {"id": "qwen2.5-3b", "owned_by": owner}  # /v1/models

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response()  # vLLM: 200 with an empty body

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.metrics)

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [self.model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        system = body["messages"][0]["content"]
        prompt = sum(len(str(m.get("content") or "")) for m in body["messages"]) // 4
        cached = len(system) // 4 if system in self.cached else 0
        self.cached.add(system)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if not body.get("stream"):
            message = {"role": "assistant", "content": "Hi"}
            return web.json_response({"choices": [{"message": message}], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta: dict[str, Any] = {"role": "assistant", "content": REPLY}
        if self.call is not None:
            delta = {"role": "assistant", "tool_calls": [{"index": 0, **self.call}]}
        for chunk in (
            {"choices": [{"index": 0, "delta": delta}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
        ):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.dies_mid_stream:  # as kill -9 does: the connection closes mid-body
                assert request.transport is not None
                request.transport.abort()
                return response
            await asyncio.sleep(self.stalls_mid_stream)
        await response.write(b"data: [DONE]\n\n")
        return response


VLLM_METRICS = """\
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="qwen2.5-3b"} 8000.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="qwen2.5-3b"} 10000.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="qwen2.5-3b"} 0.25
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1764500000.0
"""


@pytest.fixture
async def vllm(socket_enabled: None) -> AsyncIterator[FakeServer]:
    server = FakeServer("vllm", VLLM_METRICS)
    await server.start()
    yield server
    await server.stop()


async def _entry(hass: HomeAssistant, server: FakeServer) -> MockConfigEntry:
    entry = make_entry(server.url, **{CONF_REPIN_DEBOUNCE: 1.0})
    await async_setup_entry(hass, entry)
    return entry


async def test_vllm_is_primed_and_its_figures_shown(
    hass: HomeAssistant, entity_registry_enabled_by_default: None, house: None, vllm: FakeServer
) -> None:
    """Probed as vLLM; the house is primed (one token, the prefix, no Hearth fields);
    a turn streams and reuses the primed prefix; sensors show what vLLM reports."""
    entry = await _entry(hass, vllm)
    server = entry.runtime_data.backend.info
    assert server is not None and server.kind is ServerKind.VLLM and server.metrics
    device = hass.states.get("sensor.hearth_engine_kv_cache_usage")
    assert device is not None and float(device.state) == 25.0
    assert float(hass.states.get("sensor.hearth_engine_reused_tokens").state) == 8000

    (priming,) = vllm.bodies
    assert priming["max_tokens"] == 1 and not priming["stream"]
    assert [m["role"] for m in priming["messages"]] == ["system", "user"]
    assert priming["tools"]
    assert not {"hearth", "cache_prompt", "id_slot"} & set(priming)
    assert hass.states.get("sensor.hearth_prefix_pin").state == "ready"

    result = await converse(hass, "hello")
    assert speech(result) == REPLY
    request = vllm.bodies[-1]
    assert request["messages"][0] == priming["messages"][0]
    assert not {"hearth", "cache_prompt", "id_slot"} & set(request)
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    assert float(hass.states.get("sensor.hearth_engine_cache_hit_rate").state) > 50
    for unreported in ("kv_cache_used", "evictions", "prefill_throughput"):
        assert hass.states.get(f"sensor.hearth_engine_{unreported}").state == "unavailable"

    # clear_cache is Hearth's: a translated refusal, nothing sent.
    with pytest.raises(Exception, match="has no cache to clear") as err:
        await hass.services.async_call(DOMAIN, SERVICE_CLEAR_CACHE, blocking=True)
    assert type(err.value).__name__ == "ServiceValidationError"


async def test_restarted_vllm_is_primed_again(
    hass: HomeAssistant, house: None, vllm: FakeServer
) -> None:
    """A new process start time on /metrics means a restart (an empty cache): the
    house is primed again, counted as "engine restarted"."""
    entry = await _entry(hass, vllm)
    assert len(vllm.bodies) == 1
    vllm.metrics = VLLM_METRICS.replace("1764500000.0", "1764503600.0")
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done(wait_background_tasks=True)
    assert len(vllm.bodies) == 2
    assert vllm.bodies[1]["max_tokens"] == 1
    assert entry.runtime_data.prefixes.repin_causes["engine_restarted"] == 1
    # A poll that shows the same process primes nothing.
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done(wait_background_tasks=True)
    assert len(vllm.bodies) == 2


async def test_sglang_and_a_plain_openai_server(
    hass: HomeAssistant, house: None, socket_enabled: None
) -> None:
    """SGLang is told by its metric names; a server with neither names nor owner is a
    plain OpenAI-compatible server whose metrics are not read."""
    sglang = FakeServer("someone", "sglang:cache_hit_rate 0.5\nsglang:token_usage 0.1\n")
    plain = FakeServer("someone", "http_requests_total 3\n")
    for server in (sglang, plain):
        await server.start()
    try:
        entry = await _entry(hass, sglang)
        info = entry.runtime_data.backend.info
        assert info is not None and info.kind is ServerKind.SGLANG
        assert float(hass.states.get("sensor.hearth_engine_kv_cache_usage").state) == 10.0
        assert await hass.config_entries.async_unload(entry.entry_id)
        other = await _entry(hass, plain)
        info = other.runtime_data.backend.info
        assert info is not None and info.kind is ServerKind.OPENAI and not info.metrics
        assert len(plain.bodies) == 1  # primed all the same
    finally:
        for server in (sglang, plain):
            await server.stop()


async def test_a_repeated_call_runs_once_and_the_turn_ends(
    hass: HomeAssistant, house: None, socket_enabled: None
) -> None:
    """A model that repeats its call (SmolLM2 added the same item ten times in the
    accuracy bench): the call runs once, the turn ends at the repeat, and the reply is
    what Home Assistant said of it (here the failure, in Assist's words), not "the
    model kept calling tools". A call that acts ends the turn at once, with HA's own
    sentence (LLM intents carry no speech: Assist's response for the intent)."""
    calls = {
        "Porch Light": "Sorry, I am not aware of any device called Porch Light",
        "Kitchen Light": "Turned on the light",
    }
    for name, said in calls.items():
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "HassTurnOn", "arguments": json.dumps({"name": name})},
        }
        server = FakeServer("vllm", VLLM_METRICS, call=call)
        await server.start()
        try:
            entry = await _entry(hass, server)
            result = await converse(hass, f"Turn on the {name.lower()}")
        finally:
            await server.stop()
            await hass.config_entries.async_remove(entry.entry_id)
        chats = [body for body in server.bodies if body.get("stream")]
        acted = name == "Kitchen Light"
        assert len(chats) == (1 if acted else 2)  # the call (then its repeat): no more
        assert speech(result) == said
        if not acted:
            sent_calls = [m for m in chats[1]["messages"] if m.get("tool_calls")]
            assert len(sent_calls) == 1
    assert hass.states.get(KITCHEN_LIGHT).state == "on"


async def test_a_server_that_dies_mid_stream_is_a_spoken_error(
    hass: HomeAssistant, house: None, vllm: FakeServer
) -> None:
    """The server dies after a reply's first chunk (the e2e kill -9 of the engine hit
    this at random): the turn is a translated, spoken error, not a 500 from HA's API,
    and the next turn works once the server does."""
    await _entry(hass, vllm)
    vllm.dies_mid_stream = True
    result = await converse(hass, "hello")
    assert result.response.response_type.value == "error"
    said = speech(result)
    assert said and "Traceback" not in said and "RemoteProtocolError" not in said
    vllm.dies_mid_stream = False
    assert speech(await converse(hass, "hello")) == REPLY


async def test_a_stream_that_stalls_is_a_spoken_timeout(
    hass: HomeAssistant, house: None, vllm: FakeServer
) -> None:
    """A server that hangs mid-reply longer than the stall time: a spoken error.
    (The stall time is shortened for the test; the default is DEFAULT_STALL_TIMEOUT.)"""
    entry = await _entry(hass, vllm)
    vllm.stalls_mid_stream = 2.0
    entry.runtime_data.backend.chat.stall = 0.3
    result = await converse(hass, "hello")
    assert result.response.response_type.value == "error"
    assert speech(result) == "Sorry, the Hearth engine stopped answering. Try again in a moment."
