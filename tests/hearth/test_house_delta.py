"""A re-pin costs what changed: the pinned house keeps its bytes and tells the changes.

The first tests compose prefixes directly (``house_delta.compose``); the rest run real
Home Assistant against a real engine (tiny-tools), where ``PutSpy`` counts the PUTs
(every call still reaches the engine).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.hearth.const import FOLD_QUIET_S
from custom_components.hearth.house.diff import HouseEntity, HouseSnapshot
from custom_components.hearth.house.listing import render_listing
from custom_components.hearth.pins.history import base_from_dict, base_to_dict
from custom_components.hearth.pins.model import pin_name
from custom_components.hearth.prefix.delta import MAX_TOLD_CHANGES, TAIL_HEADER, compose
from custom_components.hearth.prefix.value import HousePrefix

from .common import KITCHEN_LIGHT, EngineProcess, PutSpy, converse, hearth_traces

REPINS = "sensor.hearth_engine_prefix_re_pins"
TOOLS = ({"type": "function", "function": {"name": "HassTurnOn", "parameters": {}}},)


def _house(**names: str) -> HouseSnapshot:
    """A snapshot of lights ``entity_id -> name`` in the Kitchen, and its listing."""
    entities = {
        f"light.{key}": HouseEntity(
            name=name, names=name, domain="light", area="Kitchen", areas="Kitchen"
        )
        for key, name in names.items()
    }
    return HouseSnapshot(entities=entities, listing=render_listing(entities.values()))


def _prefix(house: HouseSnapshot, instructions: str = "You are a voice assistant.") -> HousePrefix:
    system = f"{instructions}\nStatic Context:\n{house.listing}\nWhen controlling, call tools."
    example = {"role": "user", "content": "turn on the lights"}
    return HousePrefix(
        system=system,
        tools=TOOLS,
        examples=(example,),
        hearth={"names": sorted(e.name for e in house.entities.values())},
        house=house,
    )


BASE = _prefix(_house(a="Ceiling", b="Lamp", c="Strip"))


def test_a_rename_keeps_the_base_bytes_and_tells_the_change() -> None:
    full = _prefix(_house(a="Ceiling", b="Desk Lamp", c="Strip"))
    told = compose(BASE, full)
    assert told.base == BASE.digest
    assert told.messages[:-1] == BASE.messages  # every token of the base is reused
    assert told.messages[-1] == {
        "role": "system",
        "content": f"{TAIL_HEADER}\n- Lamp was renamed to Desk Lamp.",
    }
    assert told.tools == BASE.tools
    assert told.hearth == full.hearth  # the grammar allows the names of the house now
    assert told.house is full.house
    assert compose(BASE, full).digest == told.digest  # deterministic


def test_each_kind_of_change_is_told() -> None:
    moved = _house(a="Ceiling", b="Lamp", c="Strip")
    entities = dict(moved.entities)
    entities["light.a"] = dataclasses.replace(entities["light.a"], area="Hall", areas="Hall")
    entities["light.b"] = dataclasses.replace(entities["light.b"], names="Lamp, Reading Light")
    del entities["light.c"]
    entities["light.d"] = HouseEntity(name="Porch", names="Porch", domain="light", area=None)
    house = HouseSnapshot(entities=entities, listing=render_listing(entities.values()))
    told = compose(BASE, _prefix(house))
    assert told.tail.splitlines()[1:] == [
        "- Ceiling is now in area Hall.",
        "- Lamp is now also called: Lamp, Reading Light.",
        "- Porch (light) was added.",
        "- Strip no longer exists.",
    ]


def test_what_cannot_be_told_is_rendered_in_full() -> None:
    renamed = _house(a="Ceiling", b="Desk Lamp", c="Strip")
    new_instructions = _prefix(renamed, "You are Hearth.")
    assert compose(BASE, new_instructions) is new_instructions
    new_tools = dataclasses.replace(_prefix(renamed), tools=())
    assert compose(BASE, new_tools) is new_tools
    no_examples = dataclasses.replace(_prefix(renamed), examples=())
    assert compose(BASE, no_examples) is no_examples
    # An area that only gained an alias: every entity in it lists the area's names.
    kitchen = _house(a="Ceiling", b="Lamp", c="Strip")
    entities = {
        key: dataclasses.replace(e, areas="Kitchen, Cookhouse")
        for key, e in kitchen.entities.items()
    }
    alias = _prefix(HouseSnapshot(entities=entities, listing=render_listing(entities.values())))
    assert compose(BASE, alias) is alias
    many = _prefix(_house(**{f"x{i}": f"Lamp {i}" for i in range(MAX_TOLD_CHANGES + 1)}))
    assert compose(BASE, many) is many
    same = _prefix(_house(a="Ceiling", b="Lamp", c="Strip"))
    assert compose(BASE, same) is same and same.digest == BASE.digest


def test_a_told_prefix_is_not_a_base() -> None:
    told = compose(BASE, _prefix(_house(a="Ceiling", b="Desk Lamp", c="Strip")))
    with pytest.raises(ValueError, match="rendered in full"):
        compose(told, BASE)


def test_a_base_is_stored_and_read_back_with_its_bytes() -> None:
    """A stored base reads back as the same bytes and house (pins/history.py); a record
    that is damaged, or whose bytes no longer match its digest, is not a base."""
    stored = json.loads(json.dumps(base_to_dict(BASE)))  # as the store writes it
    again = base_from_dict(stored)
    assert again is not None and again.digest == BASE.digest
    assert again.house == BASE.house
    full = _prefix(_house(a="Ceiling", b="Desk Lamp", c="Strip"))
    assert compose(again, full).digest == compose(BASE, full).digest
    assert base_from_dict({**stored, "system": "other"}) is None
    assert base_from_dict({"digest": stored["digest"]}) is None
    assert base_from_dict({**stored, "house": {"listing": "", "entities": {"x": 1}}}) is None


# ------------------------------------------------------------------ in Home Assistant


async def _advance(hass: HomeAssistant, seconds: float) -> None:
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=seconds))
    await hass.async_block_till_done(wait_background_tasks=True)


async def test_a_rename_re_pins_only_the_told_change(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, puts: PutSpy
) -> None:
    """The re-pin after a rename sends the pinned messages unchanged plus one message
    with the change: the engine prefills that message, not the house after the name.
    Requests then re-send no line of the house; once the house has been quiet for
    ``FOLD_QUIET_S`` it is rendered in full again, which is not counted as a re-pin."""
    subentry_id = next(iter(entry.subentries))
    name = pin_name(subentry_id)
    prefixes = entry.runtime_data.prefixes
    first = prefixes.agent(subentry_id).pinned  # type: ignore[union-attr]
    assert first is not None and first.base is None
    before = engine.pins()[name]
    await converse(hass, "hello")
    context_before = hearth_traces()[-1]["context_lines"]

    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Pantry Lamp")
    await hass.async_block_till_done()
    await _advance(hass, 2.5)
    assert puts.names == [name]
    messages = puts.bodies[0]["messages"]
    assert messages[:-1] == first.messages
    assert messages[-1]["content"].endswith("- Kitchen Light was renamed to Pantry Lamp.")
    after = engine.pins()[name]
    assert after["hash"] != before["hash"]
    added = after["tokens"] - before["tokens"]
    assert 0 < added <= 0.15 * before["tokens"]
    assert hass.states.get(REPINS).state == "1"  # a real change: one re-pin

    await converse(hass, "hello")
    trace = hearth_traces()[-1]
    assert trace["context_lines"] == context_before  # the house's lines are not re-sent
    assert trace["requests"][0]["cached_tokens"] >= after["tokens"]

    await _advance(hass, FOLD_QUIET_S + 1)
    assert puts.names == [name, name]
    folded = puts.bodies[1]["messages"]
    listed = folded[0]["content"].splitlines()
    assert any(line.startswith("- light: ") and "Pantry Lamp" in line for line in listed)
    assert TAIL_HEADER not in str(folded)
    assert hass.states.get(REPINS).state == "1"  # upkeep, not a change
    assert prefixes.agent(subentry_id).base is prefixes.agent(subentry_id).pinned  # type: ignore[union-attr]

    await _advance(hass, FOLD_QUIET_S + 1)
    assert len(puts.bodies) == 2  # nothing left to fold


async def test_changes_build_on_the_same_base(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, puts: PutSpy
) -> None:
    """A second change keeps the first pin's base: the told message grows, the house's
    tokens stay; a change that cannot be told (a new area alias) renders in full."""
    subentry_id = next(iter(entry.subentries))
    first = entry.runtime_data.prefixes.agent(subentry_id).pinned  # type: ignore[union-attr]
    registry = er.async_get(hass)
    registry.async_update_entity(KITCHEN_LIGHT, name="Pantry Lamp")
    await _advance(hass, 2.5)
    registry.async_update_entity(KITCHEN_LIGHT, aliases={"Larder Light"})
    await _advance(hass, 2.5)
    assert len(puts.bodies) == 2
    second = puts.bodies[1]["messages"]
    assert second[:-1] == first.messages  # type: ignore[union-attr]
    assert "Pantry Lamp is now also called" in second[-1]["content"]

    areas = ar.async_get(hass)
    kitchen = areas.async_get_area_by_name("Kitchen")
    areas.async_update(kitchen.id, aliases={"Cookhouse"})  # type: ignore[union-attr]
    await _advance(hass, 2.5)
    assert len(puts.bodies) == 3
    third = puts.bodies[2]["messages"]
    assert TAIL_HEADER not in str(third)
    assert "Cookhouse" in third[0]["content"]


async def test_a_restart_pins_the_told_prefix_again(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, puts: PutSpy
) -> None:
    """The base is kept across a restart of Home Assistant (here: the entry reloaded):
    after a told rename, the first pin of the next run sends the same bytes, base and
    told change, so the engine keeps its pin and counts no rebuild."""
    subentry_id = next(iter(entry.subentries))
    name = pin_name(subentry_id)
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Pantry Lamp")
    await _advance(hass, 2.5)
    told = puts.bodies[-1]["messages"]
    assert TAIL_HEADER in told[-1]["content"]
    pinned = engine.pins()[name]

    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert puts.bodies[-1]["messages"] == told
    after = engine.pins()[name]
    assert after["hash"] == pinned["hash"]
    assert after["prefilled_tokens"] == 0  # found cached
    prefixes = entry.runtime_data.prefixes
    assert prefixes.repin_causes["ha_restart"] == 0
    assert prefixes.agent(subentry_id).base.base is None  # type: ignore[union-attr]
