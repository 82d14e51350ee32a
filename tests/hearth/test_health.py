"""An engine whose worker stopped answers ``/health`` with 503: connectivity goes off,
and the entities that need the engine (sensors, the agent, the AI Task) go unavailable.

A real engine's worker cannot be made to die on demand (every known way to kill it is
fixed), so a small loopback proxy in front of the real shared engine forwards every
route unchanged and answers ``/health`` the way a stopped worker makes the engine
answer (503), or (``stats``) changes what ``/v1/stats`` says of the engine, as an
upgraded engine would. Everything else is the real engine and the real integration.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from homeassistant.const import STATE_UNAVAILABLE
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import async_fire_time_changed

import custom_components.hearth  # noqa: F401 - resolve the real package first
from custom_components.hearth.const import DOMAIN

from .common import EngineProcess, async_setup_entry, make_entry

CONNECTED = "binary_sensor.hearth_engine_connected"
AGENT = "conversation.hearth"
KV_USAGE = "sensor.hearth_engine_kv_cache_usage"


class HealthProxy:
    """Forwards to ``target``; ``/health`` answers 503 while ``stopped``."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.stopped = False
        self.stats: dict[str, Any] = {}  # fields that replace the engine's in /v1/stats
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        if request.path == "/health" and self.stopped:
            return web.json_response({"status": "error", "reason": "engine stopped"}, status=503)
        assert self._session is not None
        async with self._session.request(
            request.method,
            self.target + request.path_qs,
            data=await request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
        ) as upstream:
            body = await upstream.read()
            if request.path == "/v1/stats" and self.stats:
                body = json.dumps({**json.loads(body), **self.stats}).encode()
            return web.Response(
                body=body, status=upstream.status, content_type=upstream.content_type
            )

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


@pytest.fixture
async def proxy(engine: EngineProcess) -> AsyncIterator[HealthProxy]:
    proxy = HealthProxy(engine.url)
    await proxy.start()
    yield proxy
    await proxy.stop()


async def _poll(hass: HomeAssistant) -> None:
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=11))
    await hass.async_block_till_done(wait_background_tasks=True)


async def test_a_stopped_worker_turns_connectivity_off(
    hass: HomeAssistant, house: None, proxy: HealthProxy
) -> None:
    entry = make_entry(proxy.url)
    await async_setup_entry(hass, entry)
    assert hass.states.get(CONNECTED).state == "on"
    assert hass.states.get(AGENT).state != STATE_UNAVAILABLE
    proxy.stopped = True
    await _poll(hass)
    assert hass.states.get(CONNECTED).state == "off"
    assert hass.states.get(AGENT).state == STATE_UNAVAILABLE
    assert hass.states.get(KV_USAGE).state == STATE_UNAVAILABLE
    proxy.stopped = False
    await _poll(hass)
    assert hass.states.get(CONNECTED).state == "on"
    assert hass.states.get(AGENT).state != STATE_UNAVAILABLE
    assert hass.states.get(KV_USAGE).state != STATE_UNAVAILABLE


async def test_the_engine_device_follows_the_engine_and_the_entry(
    hass: HomeAssistant, house: None, proxy: HealthProxy
) -> None:
    """Named after the entry; model and version as the engine reports them at each poll
    (an engine restarted with another model, or upgraded), not frozen at set-up."""
    entry = make_entry(proxy.url)
    await async_setup_entry(hass, entry)
    devices = dr.async_get(hass)
    device = devices.async_get_device_by_identifier((DOMAIN, entry.entry_id), entry.entry_id)
    assert device is not None
    assert (device.name, device.manufacturer, device.model) == (
        "Hearth engine",
        "Hearth",
        "tiny-tools",
    )
    proxy.stats = {"version": "9.9.9", "model": "another-model"}
    hass.config_entries.async_update_entry(entry, title="Attic engine")
    await _poll(hass)
    device = devices.async_get(device.id)
    assert device is not None
    assert (device.name, device.model, device.sw_version) == (
        "Attic engine",
        "another-model",
        "9.9.9",
    )
