"""Never stale: while a re-pin is pending, requests say what changed in the house.

The entry's re-pin debounce is a minute and no time passes, so every turn below runs
inside the re-pin window with the pinned (older) prefix, as a real house does for
seconds to minutes after a change. Nothing is mocked; ``ChatSpy`` records the bodies.
"""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import CONF_REPIN_DEBOUNCE
from custom_components.hearth.house.diff import HouseEntity, HouseSnapshot, describe_changes

from .common import KITCHEN_LIGHT, ChatSpy, EngineProcess, async_setup_entry, converse, make_entry


@pytest.fixture
async def slow_entry(hass: HomeAssistant, house: None, engine: EngineProcess) -> MockConfigEntry:
    """An entry whose re-pins wait a minute after the last change."""
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 60.0})
    await async_setup_entry(hass, entry)
    return entry


async def _turn_during_repin(hass: HomeAssistant, entry: MockConfigEntry) -> dict[str, Any]:
    """One turn after a house change: its body, sent with the pinned prefix."""
    await hass.async_block_till_done()
    agent = entry.runtime_data.prefixes.agent(next(iter(entry.subentries)))
    assert agent is not None and agent.pending_since is not None  # a re-pin is pending
    with ChatSpy() as spy:
        await converse(hass, "hello")
    body = spy.bodies[0]
    assert agent.pinned is not None
    assert body["messages"][0] == agent.pinned.messages[0]  # the pinned prefix
    return body


def _context(body: dict[str, Any]) -> list[str]:
    """The lines of the turn's context message (none: no message)."""
    message = body["messages"][1]
    return str(message["content"]).splitlines() if message["role"] == "system" else []


async def test_area_move_is_told(hass: HomeAssistant, slow_entry: MockConfigEntry) -> None:
    living = ar.async_get(hass).async_get_area_by_name("Living Room")
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, area_id=living.id)
    body = await _turn_during_repin(hass, slow_entry)
    context = _context(body)
    assert "Kitchen Light is now in area Living Room." in context
    assert not [line for line in context if "areas:" in line or "names:" in line]


async def test_rename_is_told_and_the_new_name_can_be_called(
    hass: HomeAssistant, slow_entry: MockConfigEntry
) -> None:
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Cooker Light")
    body = await _turn_during_repin(hass, slow_entry)
    assert _context(body) == ["Kitchen Light was renamed to Cooker Light."]
    # The grammar takes the current names, not the pinned prefix's.
    assert body["hearth"]["argument_values"]["name"] == ["Cooker Light"]


async def test_new_script_is_offered_last(hass: HomeAssistant, slow_entry: MockConfigEntry) -> None:
    agent = slow_entry.runtime_data.prefixes.agent(next(iter(slow_entry.subentries)))
    assert agent is not None and agent.pinned is not None
    pinned_tools = list(agent.pinned.tools)
    assert await async_setup_component(
        hass,
        "script",
        {"script": {"wake_up": {"alias": "Wake up", "sequence": [{"delay": 0}]}}},
    )
    async_expose_entity(hass, "conversation", "script.wake_up", True)
    body = await _turn_during_repin(hass, slow_entry)
    assert body["tools"][: len(pinned_tools)] == pinned_tools  # the pin's tokens first
    assert [tool["function"]["name"] for tool in body["tools"][len(pinned_tools) :]] == [
        "wake_up"  # the bare name: it is unique (prefix.model_tool_names)
    ]
    assert _context(body) == []  # nothing to tell: the tool says it all


async def test_removal_is_told(hass: HomeAssistant, slow_entry: MockConfigEntry) -> None:
    """An entity no longer exposed no longer exists for the model."""
    async_expose_entity(hass, "conversation", KITCHEN_LIGHT, False)
    body = await _turn_during_repin(hass, slow_entry)
    context = _context(body)
    assert "Kitchen Light no longer exists." in context
    assert "Kitchen Light" not in body["hearth"]["argument_values"].get("name", [])


def _entity(name: str, area: str | None, names: str | None = None) -> HouseEntity:
    return HouseEntity(name=name, names=names or name, domain="light", area=area)


def test_describe_changes() -> None:
    old = HouseSnapshot(
        entities={
            "light.a": _entity("Lamp", "Kitchen"),
            "light.b": _entity("Fan Light", "Study"),
            "light.c": _entity("Porch", None),
        },
        listing="",
    )
    new = HouseSnapshot(
        entities={
            "light.a": _entity("Desk Lamp", "Study"),
            "light.c": _entity("Porch", None, "Porch, Front Light"),
            "light.d": _entity("Garden", "Garden"),
        },
        listing="",
    )
    assert describe_changes(old, new) == [
        "Lamp was renamed to Desk Lamp.",
        "Desk Lamp is now in area Study.",
        "Fan Light no longer exists.",
        "Garden (light) was added in area Garden.",
        "Porch is now also called: Porch, Front Light.",
    ]
    assert describe_changes(new, new) == []
