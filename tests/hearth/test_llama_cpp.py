"""The integration driving a real llama.cpp server (``llama-server``), not a Hearth engine.

``scripts/setup`` builds ``llama-server`` once from the pinned llama-cpp-python sdist
(``bench/hearth_bench/llama_server.py``); it serves the default model's GGUF (SmolLM2-135M
Q4_1) with two slots and Hearth's Hermes chat template, so tools render and tool calls
parse as with the engine. A missing build fails these tests with the set-up command,
never a silent skip. Nothing is mocked: ``ChatSpy`` only records the request bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from homeassistant import config_entries
from homeassistant.const import CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_fire_time_changed

from custom_components.hearth.backend.server_info import ServerKind
from custom_components.hearth.const import (
    CONF_MAX_TOKENS,
    CONF_REPIN_DEBOUNCE,
    CONF_TOOL_FIRST,
    DOMAIN,
)
from hearth_bench.llama_server import BUILD_WAIT_S, LlamaServer, LlamaServerMissingError

from .common import KITCHEN_LIGHT, ChatSpy, async_setup_entry, converse, hearth_traces, make_entry
from .conftest import sockets_allowed

# The first test that needs llama-server may wait for scripts/test's background build
# (find_llama_server): its set-up counts toward the test's timeout.
pytestmark = pytest.mark.timeout(BUILD_WAIT_S + 600)

PIN = "sensor.hearth_prefix_pin"
REUSE_GOAL = 0.9  # of the prompt, on the first request after a (primed) house change


@pytest.fixture(scope="session")
def llama_cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama.cpp server for the module: two slots (one for the agent's pin)."""
    try:
        with sockets_allowed():
            server = LlamaServer(tmp_path_factory.mktemp("llama") / "llama.log", parallel=2)
            server.start()
    except LlamaServerMissingError as err:
        pytest.fail(f"{err} (scripts/setup builds llama-server)")
    yield server
    server.stop()


@pytest.fixture
def llama_cpp(llama_cpp_server: LlamaServer, socket_enabled: None) -> LlamaServer:
    """The shared server, with sockets allowed for the test."""
    return llama_cpp_server


@pytest.fixture
async def llama_entry(hass: HomeAssistant, house: None, llama_cpp: LlamaServer) -> MockConfigEntry:
    """An entry on the llama.cpp server; each turn's first request must call a tool
    (llama.cpp then constrains it to the offered tools), re-pins after 1 s."""
    entry = make_entry(
        llama_cpp.url, **{CONF_REPIN_DEBOUNCE: 1.0, CONF_TOOL_FIRST: True, CONF_MAX_TOKENS: 64}
    )
    await async_setup_entry(hass, entry)
    return entry


def _reuse(request: dict[str, Any]) -> float:
    return request["cached_tokens"] / request["prompt_tokens"]


async def test_config_flow_says_what_it_found(
    hass: HomeAssistant, house: None, llama_cpp: LlamaServer
) -> None:
    """The flow probes the server: a llama.cpp server with its slots, no pins."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: llama_cpp.url}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["description"] == "detected"
    placeholders = result["description_placeholders"]
    assert placeholders["server"] == "llama.cpp server"
    assert "2 slots" in placeholders["features"]
    assert "Prometheus metrics" in placeholders["features"]


async def test_tool_loop_streams_with_a_warm_prefix(
    hass: HomeAssistant,
    entity_registry_enabled_by_default: None,
    llama_cpp: LlamaServer,
    llama_entry: MockConfigEntry,
) -> None:
    """The house is primed at start; a turn streams a call of an offered tool, Home
    Assistant runs it and sends its result back with the same prefix; the prompt's
    house came from llama.cpp's cache. Sensors show what llama.cpp reports (reuse,
    TTFT); the rest is unavailable.

    What the 135M model writes after the tool result differs between CPUs (greedy, but
    other kernels); it may even be a broken call, which llama.cpp answers with an error:
    the turn then ends in Home Assistant's error speech. Either way the turn ends.
    """
    server = llama_entry.runtime_data.backend.info
    assert server is not None and server.kind is ServerKind.LLAMA_CPP
    # Its context per slot (/props): the whole KV split over the slots.
    assert server.context_length == llama_cpp.ctx_size // llama_cpp.parallel
    pin = hass.states.get(PIN)
    assert pin is not None and pin.state == "ready"
    assert pin.attributes["tokens"] > 500  # the priming request's prompt

    with ChatSpy() as spy:
        result = await converse(hass, "Turn on the kitchen light")
    assert result.response.speech["plain"]["speech"]
    first, *rest = spy.bodies
    assert first["tool_choice"] == "required"
    assert first["cache_prompt"] is True
    assert "id_slot" not in first  # the server picks the slot with the most alike prompt
    assert "hearth" not in first  # Hearth's grammar extension goes to Hearth only
    assert rest, "the tool result went back to the server"
    assert rest[0]["messages"][0] == first["messages"][0]  # the same house prefix
    offered = {tool["function"]["name"] for tool in first["tools"]}
    sent_back = rest[0]["messages"]
    calls = next(m["tool_calls"] for m in sent_back if m.get("tool_calls"))
    assert calls and {call["function"]["name"] for call in calls} <= offered
    assert sent_back[-1]["role"] == "tool"

    requests = hearth_traces()[-1]["requests"]
    assert requests and _reuse(requests[0]) >= REUSE_GOAL, requests[0]
    await llama_entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    hit_rate = float(hass.states.get("sensor.hearth_engine_cache_hit_rate").state)
    assert hit_rate >= REUSE_GOAL * 100
    assert float(hass.states.get("sensor.hearth_engine_ttft_median").state) > 0
    assert float(hass.states.get("sensor.hearth_engine_prompt_tokens").state) >= sum(
        r["prompt_tokens"] for r in requests
    )
    for unreported in ("kv_cache_used", "evictions", "pinned_prefix_tokens"):
        assert hass.states.get(f"sensor.hearth_engine_{unreported}").state == "unavailable"
    assert hass.states.get("binary_sensor.hearth_engine_connected").state == "on"


async def test_rename_is_primed_before_the_next_request(
    hass: HomeAssistant, llama_entry: MockConfigEntry, llama_cpp: LlamaServer
) -> None:
    """After a rename, the debounced priming request puts the new house in llama.cpp's
    cache (the pinned house's bytes and a closing message with the change,
    prefix/delta.py): the first request after it sends the new prefix and reuses most
    of it."""
    agent = llama_entry.runtime_data.prefixes.agent(next(iter(llama_entry.subentries)))
    assert agent is not None and agent.pinned is not None
    before = agent.pinned.digest
    prompt_before = llama_cpp.metrics()["llamacpp:prompt_tokens_total"]

    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Cooker Light")
    await hass.async_block_till_done()
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=5))  # the debounce
    await hass.async_block_till_done(wait_background_tasks=True)
    assert agent.pinned.digest != before
    assert "Kitchen Light was renamed to Cooker Light." in agent.pinned.tail
    assert agent.pinned.messages[:-1] == agent.base.messages  # type: ignore[union-attr]
    # The priming request prefilled the changed part of the house on the server.
    assert llama_cpp.metrics()["llamacpp:prompt_tokens_total"] > prompt_before

    with ChatSpy() as spy:
        await converse(hass, "Turn on the cooker light")
    sent = spy.bodies[0]["messages"]
    assert sent[: len(agent.pinned.messages)] == agent.pinned.messages  # the new house
    first = hearth_traces()[-1]["requests"][0]
    assert _reuse(first) >= REUSE_GOAL, first


async def test_stopped_server_is_a_translated_error(
    hass: HomeAssistant, house: None, socket_enabled: None, tmp_path: Path
) -> None:
    """A llama.cpp server that goes away: the turn ends in HA's own error speech, the
    connectivity sensor goes off; nothing hangs."""
    server = LlamaServer(tmp_path / "llama.log", parallel=2).start()
    entry = make_entry(server.url, **{CONF_REPIN_DEBOUNCE: 1.0})
    try:
        await async_setup_entry(hass, entry)
    finally:
        server.stop()
    result = await converse(hass, "Turn on the kitchen light")
    assert result.response.error_code is not None
    await entry.runtime_data.coordinator.async_refresh()
    await hass.async_block_till_done()
    assert hass.states.get("binary_sensor.hearth_engine_connected").state == "off"
