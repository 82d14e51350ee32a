"""Diagnostics redact the URL, the title, the API key and every prompt text."""

from __future__ import annotations

import json
from collections.abc import Callable

from homeassistant.core import HomeAssistant

from custom_components.hearth.diagnostics import async_get_config_entry_diagnostics

from .common import ENGINE_KEY, EngineProcess, async_setup_entry, converse, make_entry


async def test_diagnostics_redact(hass: HomeAssistant, house: None, keyed: EngineProcess) -> None:
    entry = make_entry(keyed.url, api_key=ENGINE_KEY, prompt="Secret house rules: be kind.")
    await async_setup_entry(hass, entry)
    hass.config_entries.async_update_entry(entry, title=keyed.url)  # as the config flow once did
    await converse(hass, "hello")
    prefix = await entry.runtime_data.prefixes.async_render(next(iter(entry.subentries)))

    diagnostics = await async_get_config_entry_diagnostics(hass, entry)
    text = json.dumps(diagnostics, default=str)

    assert ENGINE_KEY not in text
    assert keyed.url not in text  # credentials can sit in the URL
    assert diagnostics["entry"]["title"] == diagnostics["entry"]["data"]["url"] == "**REDACTED**"
    assert "kv_cache_nodes" not in diagnostics["engine"]["stats"]  # chosen figures, not a dump
    assert "Secret house rules" not in text
    assert "Kitchen Light" not in text  # the static context of the prefix
    assert prefix.system.splitlines()[-1] not in text
    assert diagnostics["entry"]["data"]["api_key"] == "**REDACTED**"
    (subentry,) = diagnostics["entry"]["subentries"]
    assert subentry["data"]["prompt"] == "**REDACTED**"
    # What is useful stays.
    agent = diagnostics["prefixes"]["agents"][next(iter(entry.subentries))]
    assert agent["digest"] == prefix.digest
    assert agent["tokens"] > 0
    assert agent["state"] == "ready"
    assert agent["rebuilds"] == 0
    assert diagnostics["prefixes"]["repin_causes"]["ha_upgrade"] == 0
    assert diagnostics["engine"]["connected"] is True
    assert diagnostics["engine"]["stats"]["model"] == "tiny-tools"
    assert diagnostics["last_turn"]["prompt_tokens"] > 0


async def test_diagnostics_of_an_engine_that_stopped(
    hass: HomeAssistant, house: None, private_engine_factory: Callable[..., EngineProcess]
) -> None:
    """Before any turn and after the engine stopped: not connected, no last turn, the
    figures of the last good poll, and no address of the engine."""
    engine = private_engine_factory()
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    engine.stop()
    coordinator = entry.runtime_data.coordinator
    await coordinator.async_refresh()
    assert coordinator.last_update_success is False

    diagnostics = await async_get_config_entry_diagnostics(hass, entry)
    text = json.dumps(diagnostics, default=str)

    assert f"127.0.0.1:{engine.port}" not in text
    assert diagnostics["engine"]["connected"] is False
    assert diagnostics["engine"]["server"]["kind"] == "hearth"
    assert diagnostics["engine"]["stats"]["model"] == "tiny-tools"
    assert diagnostics["last_turn"] is None
    (agent,) = diagnostics["prefixes"]["agents"].values()
    assert agent["tokens"] > 0  # pinned before the engine stopped
