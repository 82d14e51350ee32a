"""Distinct, translated names: two entries (two real engines, or an engine and another
OpenAI-compatible server) give no two devices, agents or entities one name, and the
server kind and what it offers are said in the install's language.

The OpenAI-compatible server is ``FakeServer`` (test_other_servers.py: vLLM and SGLang
need a GPU); the engines and Home Assistant are real.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from homeassistant.config_entries import SOURCE_USER, ConfigEntry
from homeassistant.const import CONF_API_KEY, CONF_NAME, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er

from custom_components.hearth.const import DOMAIN, SUBENTRY_AI_TASK, SUBENTRY_CONVERSATION
from custom_components.hearth.names import address, distinct

from .common import ENGINE_KEY, EngineProcess
from .test_other_servers import FakeServer


@pytest.fixture
async def other(socket_enabled: None) -> AsyncIterator[FakeServer]:
    """An OpenAI-compatible server of no known kind (no owner, no metric names)."""
    server = FakeServer("someone", "")
    await server.start()
    yield server
    await server.stop()


async def _add(hass: HomeAssistant, url: str, api_key: str | None = None) -> dict[str, Any]:
    """Add an engine entry through the config flow, as a user does."""
    result = await hass.config_entries.flow.async_init(DOMAIN, context={"source": SOURCE_USER})
    user_input = {CONF_URL: url} | ({CONF_API_KEY: api_key} if api_key else {})
    result = await hass.config_entries.flow.async_configure(result["flow_id"], user_input)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    return dict(result)


def _shown_names(hass: HomeAssistant) -> tuple[list[str], list[str], list[str]]:
    """(device names, conversation agent names, entity friendly names) of Hearth."""
    devices = [
        d.name_by_user or d.name or ""
        for entry in hass.config_entries.async_entries(DOMAIN)
        for d in dr.async_entries_for_config_entry(dr.async_get(hass), entry.entry_id)
    ]
    entities = [
        e.entity_id
        for entry in hass.config_entries.async_entries(DOMAIN)
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
    ]
    friendly = [str(hass.states.get(eid).attributes.get("friendly_name")) for eid in entities]
    agents = [
        n for eid, n in zip(entities, friendly, strict=True) if eid.startswith("conversation.")
    ]
    return devices, agents, friendly


def _repeated(names: list[str]) -> list[str]:
    return [name for name, count in Counter(names).items() if count > 1]


async def test_two_engines_have_distinct_device_agent_and_entity_names(
    hass: HomeAssistant,
    house: None,
    engine: EngineProcess,
    keyed: EngineProcess,
    entity_registry_enabled_by_default: None,
) -> None:
    first = await _add(hass, engine.url)
    second = await _add(hass, keyed.url, ENGINE_KEY)

    devices, agents, friendly = _shown_names(hass)
    assert len(devices) == 4 and len(agents) == 2  # an engine and an agent per entry
    assert _repeated(devices) == []
    assert _repeated(agents) == []
    assert _repeated(friendly) == []
    # The first keeps the short names; the second says where its server is.
    assert first["title"] == "Hearth engine"
    assert second["title"] == f"Hearth engine ({address(keyed.url)})"
    assert hass.states.get("conversation.hearth") is not None
    second_agent = next(iter(second["result"].subentries.values())).title
    assert second_agent == f"Hearth ({address(keyed.url)})"
    assert "Hearth engine Connected" in friendly


async def test_an_engine_and_another_server_in_german(
    hass: HomeAssistant,
    house: None,
    engine: EngineProcess,
    other: FakeServer,
    entity_registry_enabled_by_default: None,
) -> None:
    """The server kind, what it offers and the device names in the install's language."""
    hass.config.language = "de"
    other_result = await _add(hass, other.url)
    hearth_result = await _add(hass, engine.url)

    assert other_result["title"] == "OpenAI-kompatibler Server"
    assert other_result["description_placeholders"] == {
        "server": "OpenAI-kompatibler Server",
        "model": "qwen2.5-3b",
        "features": "Vorwärmen des Hauspräfixes nach jeder Änderung",
    }
    assert hearth_result["title"] == "Hearth-Engine"
    assert hearth_result["description_placeholders"]["features"] == (
        "angeheftete Hauspräfixe, Cache- und Latenzzähler"
    )
    devices, agents, friendly = _shown_names(hass)
    assert _repeated(devices) == [] and _repeated(agents) == [] and _repeated(friendly) == []
    assert "Hearth-Engine Verbunden" in friendly
    # Who makes an unknown server's software is not made up.
    other_entry: ConfigEntry = other_result["result"]
    device = dr.async_get(hass).async_get_device_by_identifier(
        (DOMAIN, other_entry.entry_id), other_entry.entry_id
    )
    assert device is not None and device.manufacturer is None


async def test_a_new_agent_or_task_is_offered_a_free_translated_name(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    hass.config.language = "fr"
    entry: ConfigEntry = (await _add(hass, engine.url))["result"]
    for subentry_type, default in (
        (SUBENTRY_CONVERSATION, f"Hearth ({address(engine.url)})"),  # "Hearth" is taken
        (SUBENTRY_AI_TASK, "Tâche IA Hearth"),
    ):
        result = await hass.config_entries.subentries.async_init(
            (entry.entry_id, subentry_type), context={"source": SOURCE_USER}
        )
        assert result["type"] is FlowResultType.FORM
        name_key = next(k for k in result["data_schema"].schema if k == CONF_NAME)
        assert name_key.default() == default


def test_distinct_numbers_what_even_the_address_does_not_tell_apart() -> None:
    taken = ["Hearth", "hearth (h:1)", "Hearth (h:1) 2"]
    assert distinct("Hearth", "h:1", taken) == "Hearth (h:1) 3"
    assert distinct("Hearth", "h:2", taken) == "Hearth (h:2)"
    assert distinct("Other", "h:1", taken) == "Other"
    assert address("http://user:pw@[::1]:8765/v1/") == "[::1]:8765/v1"
