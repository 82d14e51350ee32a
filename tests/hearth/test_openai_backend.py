"""A server without ``/health`` (some OpenAI-compatible servers and proxies have none):
it is alive while ``/v1/models`` answers, and a refused key there starts re-auth.

``FakeServer`` is the stand-in of ``test_other_servers.py`` (vLLM's HTTP surface), with
``/health`` answering 404 and ``/v1/models`` failing on demand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from aiohttp import web
from homeassistant.config_entries import SOURCE_REAUTH, SOURCE_USER
from homeassistant.const import CONF_URL, STATE_UNAVAILABLE
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import async_fire_time_changed

from custom_components.hearth.const import DOMAIN

from .common import async_setup_entry, make_entry
from .test_other_servers import VLLM_METRICS, FakeServer

CONNECTED = "binary_sensor.hearth_engine_connected"
KV_USAGE = "sensor.hearth_engine_kv_cache_usage"


class NoHealthServer(FakeServer):
    """No ``/health``; ``/v1/models`` answers ``models_status`` when it is set."""

    models_status: int | None = None

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no route"}}, status=404)

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_status is not None:
            error = {"message": "unavailable", "type": "server_error"}
            return web.json_response({"error": error}, status=self.models_status)
        return await super()._models(request)


@pytest.fixture
async def server(socket_enabled: None) -> AsyncIterator[NoHealthServer]:
    fake = NoHealthServer("vllm", VLLM_METRICS)
    await fake.start()
    yield fake
    await fake.stop()


async def _poll(hass: HomeAssistant) -> None:
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=11))
    await hass.async_block_till_done(wait_background_tasks=True)


async def test_alive_through_its_model_list(
    hass: HomeAssistant, house: None, server: NoHealthServer
) -> None:
    entry = make_entry(server.url)
    await async_setup_entry(hass, entry)
    info = entry.runtime_data.backend.info
    assert info.health is False and info.metrics is True
    assert hass.states.get(CONNECTED).state == "on"
    assert float(hass.states.get(KV_USAGE).state) == 25.0

    server.models_status = 503
    await _poll(hass)
    assert hass.states.get(CONNECTED).state == "off"
    assert hass.states.get(KV_USAGE).state == STATE_UNAVAILABLE

    server.models_status = None
    await _poll(hass)
    assert hass.states.get(CONNECTED).state == "on"
    assert float(hass.states.get(KV_USAGE).state) == 25.0


async def test_a_key_refused_while_running_starts_reauth(
    hass: HomeAssistant, house: None, server: NoHealthServer
) -> None:
    entry = make_entry(server.url)
    await async_setup_entry(hass, entry)
    assert not hass.config_entries.flow.async_progress_by_handler(DOMAIN)

    server.models_status = 401
    await _poll(hass)
    (flow,) = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert flow["context"]["source"] == SOURCE_REAUTH
    assert flow["context"]["entry_id"] == entry.entry_id


async def test_config_flow_says_what_it_found(
    hass: HomeAssistant, house: None, server: NoHealthServer
) -> None:
    """vLLM by its model owner: priming and its metrics, no slots (llama.cpp's)."""
    result = await hass.config_entries.flow.async_init(DOMAIN, context={"source": SOURCE_USER})
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: server.url}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "vLLM"
    assert result["description_placeholders"] == {
        "server": "vLLM",
        "model": "qwen2.5-3b",
        "features": "priming of the house prefix after each change, Prometheus metrics",
    }
