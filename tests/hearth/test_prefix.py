"""Pinning and invalidation of the house prefix, against a real engine.

``PutSpy`` (common.py) wraps ``HearthClient.async_put_prefix`` to count the PUTs; every
call still reaches the engine (it is not a mock).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.hearth.const import CONF_REPIN_DEBOUNCE
from custom_components.hearth.pins.model import pin_name

from .common import (
    KITCHEN_LIGHT,
    KITCHEN_SWITCH,
    EngineProcess,
    PutSpy,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
    speech,
)

REPINS = "sensor.hearth_engine_prefix_re_pins"


def _agent(entry: MockConfigEntry) -> str:
    return next(iter(entry.subentries))


async def _advance(hass: HomeAssistant, seconds: float) -> None:
    """Let ``seconds`` pass for timers; wait for the re-pins they start."""
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=seconds))
    await hass.async_block_till_done(wait_background_tasks=True)


def _rename(hass: HomeAssistant) -> str:
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Pantry Lamp")
    return "- light: Pantry Lamp"


def _move(hass: HomeAssistant) -> str:
    living = ar.async_get(hass).async_get_area_by_name("Living Room")
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, area_id=living.id)
    return "Living Room:\n- light: Kitchen Light\n"


def _rename_area(hass: HomeAssistant) -> str:
    areas = ar.async_get(hass)
    areas.async_update(areas.async_get_area_by_name("Kitchen").id, name="Cookhouse")
    return "\nCookhouse:\n"


def _unexpose(hass: HomeAssistant) -> str:
    async_expose_entity(hass, "conversation", KITCHEN_LIGHT, False)
    return "expose entities to their voice assistant"


def _add_entity(hass: HomeAssistant) -> str:
    hass.states.async_set("switch.garden_pump", "off", {"friendly_name": "Garden Pump"})
    return "- switch: Garden Pump"


def _change_options(hass: HomeAssistant) -> str:
    entry = hass.config_entries.async_entries("hearth")[0]
    subentry = next(iter(entry.subentries.values()))
    hass.config_entries.async_update_subentry(
        entry, subentry, data={**subentry.data, "prompt": "You are Hearth. Be brief."}
    )
    return "You are Hearth. Be brief."


@pytest.mark.parametrize(
    "change",
    [_rename, _move, _rename_area, _unexpose, _add_entity, _change_options],
    ids=["rename", "move_area", "rename_area", "unexpose", "entity_appears", "agent_options"],
)
async def test_house_change_repins_once_after_debounce(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    engine: EngineProcess,
    puts: PutSpy,
    change: Callable[[HomeAssistant], str],
) -> None:
    """One real change: exactly one re-pin, only once the debounce (2 s) has passed."""
    name = pin_name(_agent(entry))
    before = engine.pins()[name]
    assert hass.states.get(REPINS).state == "0"

    expected_text = change(hass)
    await hass.async_block_till_done()
    await _advance(hass, 1.0)
    assert puts.names == []  # still within the debounce

    await _advance(hass, 2.5)
    assert puts.names == [name]
    assert entry.runtime_data.prefixes.repins == 1
    assert hass.states.get(REPINS).state == "1"
    after = engine.pins()[name]
    assert after["hash"] != before["hash"]
    prefix = await entry.runtime_data.prefixes.async_render(_agent(entry))
    assert expected_text in prefix.system

    await _advance(hass, 60)  # polls and quiet time: nothing more to do
    assert puts.names == [name]
    assert hass.states.get(REPINS).state == "1"


async def test_burst_of_changes_is_one_repin(
    hass: HomeAssistant, entry: MockConfigEntry, puts: PutSpy
) -> None:
    """Changes closer together than the debounce are merged into one re-pin."""
    registry = er.async_get(hass)
    for i in range(5):
        registry.async_update_entity(KITCHEN_LIGHT, aliases={f"Lamp {i}"})
        await _advance(hass, 1.0)
    assert puts.names == []
    await _advance(hass, 2.5)
    assert len(puts.names) == 1
    assert entry.runtime_data.prefixes.repins == 1


async def test_state_changes_never_repin(
    hass: HomeAssistant, entry: MockConfigEntry, puts: PutSpy
) -> None:
    """100 state changes (on/off, attributes): no re-render reaches the engine."""
    for i in range(50):
        await hass.services.async_call(
            "input_boolean", "toggle", {"entity_id": KITCHEN_SWITCH}, blocking=True
        )
        hass.states.async_set(
            KITCHEN_LIGHT,
            "on" if i % 2 else "off",
            {"friendly_name": "Kitchen Light", "brightness": i},
        )
    await hass.async_block_till_done()
    await _advance(hass, 30)
    assert puts.names == []
    assert entry.runtime_data.prefixes.repins == 0
    assert hass.states.get(REPINS).state == "0"


async def test_device_area_change_repins_once(
    hass: HomeAssistant, house: None, engine: EngineProcess, puts: PutSpy
) -> None:
    """An entity placed through its device (named after it): moving the device re-pins
    once."""
    areas = ar.async_get(hass)
    devices = dr.async_get(hass)
    owner = MockConfigEntry(domain="test")
    owner.add_to_hass(hass)
    device = devices.async_get_or_create(
        config_entry_id=owner.entry_id, identifiers={("test", "pump")}, name="Pump"
    )
    devices.async_update_device(device.id, area_id=areas.async_get_area_by_name("Kitchen").id)
    pump = er.async_get(hass).async_get_or_create(
        "switch", "test", "pump", device_id=device.id, original_name="Garden Pump"
    )
    hass.states.async_set(pump.entity_id, "off", {"friendly_name": "Garden Pump"})
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    prefixes = entry.runtime_data.prefixes
    kitchen = re.compile(r"\nKitchen:\n(- .*\n)*- switch: Pump Garden Pump\n")
    assert kitchen.search((await prefixes.async_render(_agent(entry))).system)
    puts.names.clear()

    devices.async_update_device(device.id, area_id=areas.async_get_area_by_name("Living Room").id)
    await _advance(hass, 3)
    assert len(puts.names) == 1
    assert prefixes.repins == 1
    living = "\nLiving Room:\n- switch: Pump Garden Pump\n"
    assert living in (await prefixes.async_render(_agent(entry))).system


async def test_unchanged_registry_update_does_not_repin(
    hass: HomeAssistant, entry: MockConfigEntry, puts: PutSpy
) -> None:
    """A registry event that leaves the rendered prefix as it was: no PUT."""
    registry = er.async_get(hass)
    registry.async_update_entity(KITCHEN_LIGHT, aliases={"Cooker Light"})
    await _advance(hass, 3)
    assert len(puts.names) == 1
    registry.async_update_entity(KITCHEN_LIGHT, aliases={"Cooker Light"})  # no-op
    ar.async_get(hass).async_create("Attic")  # an empty area is not in the prefix
    floor = fr.async_get(hass).async_create("Ground Floor")  # floors are not in it either
    areas = ar.async_get(hass)
    areas.async_update(areas.async_get_area_by_name("Kitchen").id, floor_id=floor.floor_id)
    await _advance(hass, 3)
    assert len(puts.names) == 1
    assert entry.runtime_data.prefixes.repins == 1


async def test_reload_reuses_the_pin(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, puts: PutSpy
) -> None:
    """After a reload (as after an HA restart) the same name and tokens are PUT again:
    the engine finds them cached and computes nothing."""
    name = pin_name(_agent(entry))
    before = engine.pins()[name]
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    assert puts.names == [name]
    after = engine.pins()[name]
    assert after["hash"] == before["hash"]
    assert after["tokens"] == before["tokens"]
    assert after["prefill_ms"] == 0
    assert entry.runtime_data.prefixes.repins == 0


async def test_missing_pin_is_pinned_again(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, puts: PutSpy
) -> None:
    """If the engine loses the pin (deleted here), the next poll pins it again."""
    name = pin_name(_agent(entry))
    engine.request("DELETE", f"/v1/prefixes/{name}")
    await _advance(hass, 11)  # next poll
    assert puts.names == [name]
    assert name in engine.pins()
    assert entry.runtime_data.prefixes.repins == 1


async def test_engine_restart(
    hass: HomeAssistant, house: None, private_engine_factory: Callable[..., EngineProcess]
) -> None:
    """Engine stops: sensors unavailable, connectivity off, a spoken error. Engine
    restarts (new instance_id): sensors back, the prefix pinned again (one re-pin)."""
    engine = private_engine_factory()
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    name = pin_name(_agent(entry))
    assert name in engine.pins()
    assert hass.states.get("binary_sensor.hearth_engine_connected").state == "on"
    assert hass.states.get("sensor.hearth_engine_kv_cache_used").state != "unavailable"

    engine.stop()
    await _advance(hass, 11)
    assert hass.states.get("binary_sensor.hearth_engine_connected").state == "off"
    for sensor in ("kv_cache_used", "cache_hit_rate", "prefix_re_pins", "last_ttft"):
        assert hass.states.get(f"sensor.hearth_engine_{sensor}").state == "unavailable"
    result = await converse(hass, "hello")
    assert speech(result) == "Sorry, I cannot reach the Hearth engine. Check that it is running."

    engine.start()  # same port, new process: new instance_id, no pins
    assert engine.pins() == {}
    await _advance(hass, 11)
    assert hass.states.get("binary_sensor.hearth_engine_connected").state == "on"
    assert hass.states.get("sensor.hearth_engine_kv_cache_used").state != "unavailable"
    assert name in engine.pins()
    assert hass.states.get(REPINS).state == "1"

    result = await converse(hass, "hello")
    assert speech(result) == "Hello from Hearth."
    assert hearth_traces()[-1]["requests"][0]["pin"] == name


async def test_pin_refused_for_good_is_retried_on_a_new_engine(
    hass: HomeAssistant, house: None, private_engine_factory: Callable[..., EngineProcess]
) -> None:
    """A prefix larger than the KV budget is refused (422) and not retried against the
    same engine; restarted with a bigger budget (new instance_id), it is pinned."""
    engine = private_engine_factory(kv_cache_mb=1)  # 512 tiny-tools tokens
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    name = pin_name(_agent(entry))
    assert name not in engine.pins()
    with PutSpy() as puts:
        await _advance(hass, 11)
        assert puts.names == []  # refused for good: no retry against this engine

        engine.stop()
        engine.kv_cache_mb = 256
        engine.start()
        await _advance(hass, 11)
        assert puts.names == [name]
    assert engine.pins()[name]["state"] == "ready"


async def test_requests_keep_the_pinned_prefix_while_a_re_pin_is_pending(
    hass: HomeAssistant, entry: MockConfigEntry, engine: EngineProcess, puts: PutSpy
) -> None:
    """Between a house change and its re-pin, turns reuse the pinned prefix (no cold
    prefill of the whole house per turn); the changed line rides in the context."""
    name = pin_name(_agent(entry))
    pinned = engine.pins()[name]
    await converse(hass, "hello")
    before = hearth_traces()[-1]

    _rename(hass)
    await hass.async_block_till_done()
    await converse(hass, "hello")
    during = hearth_traces()[-1]
    assert puts.names == []  # the re-pin is still in its debounce
    assert during["prefix_digest"] == before["prefix_digest"]
    assert during["requests"][0]["cached_tokens"] >= pinned["tokens"]
    assert during["context_lines"] > before["context_lines"]  # "Pantry Lamp" is sent

    await _advance(hass, 2.5)
    assert puts.names == [name]
    await converse(hass, "hello")
    after = hearth_traces()[-1]
    assert after["prefix_digest"] != before["prefix_digest"]
    assert after["context_lines"] == before["context_lines"]
    assert after["requests"][0]["cached_tokens"] >= engine.pins()[name]["tokens"]


async def test_house_render_is_kept_until_the_house_changes(
    hass: HomeAssistant, entry: MockConfigEntry, puts: PutSpy
) -> None:
    """A turn re-uses the house as rendered (a state change keeps it); a rename is in the
    very next turn's fresh prefix, before any re-pin: told after the pinned house's
    bytes (prefix/delta.py)."""
    prefixes = entry.runtime_data.prefixes
    first = await prefixes.async_prefix_for_request(_agent(entry))
    again = await prefixes.async_prefix_for_request(_agent(entry))
    assert again.fresh is first.fresh

    hass.states.async_set(KITCHEN_LIGHT, "on", {"friendly_name": "Kitchen Light"})
    await hass.async_block_till_done()
    assert (await prefixes.async_prefix_for_request(_agent(entry))).fresh is first.fresh

    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Pantry Lamp")
    await hass.async_block_till_done()  # no time passes: the re-pin is still pending
    renamed = await prefixes.async_prefix_for_request(_agent(entry))
    assert renamed.fresh.system == first.fresh.system
    assert "Kitchen Light was renamed to Pantry Lamp." in renamed.fresh.tail
    assert renamed.sent is first.fresh and renamed.stale  # the pin, told of the rename
    assert puts.names == []


async def test_render_time_of_a_turn_in_a_500_entity_house(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """What a turn spends rendering the house (printed: run with -s): the first render,
    then the turns that find it kept."""
    for i in range(500):
        entity_id = f"light.generated_{i:03d}"
        hass.states.async_set(entity_id, "off", {"friendly_name": f"Generated Lamp {i}"})
        async_expose_entity(hass, "conversation", entity_id, True)
    await hass.async_block_till_done()
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    prefixes = entry.runtime_data.prefixes
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, name="Kitchen Lamp")
    await hass.async_block_till_done()  # the house changed: the next turn renders it
    started = time.perf_counter()
    first = await prefixes.async_prefix_for_request(_agent(entry))
    render_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    for _ in range(10):
        kept = await prefixes.async_prefix_for_request(_agent(entry))
    kept_ms = (time.perf_counter() - started) * 100
    print(f"500-entity house: render {render_ms:.1f} ms, kept {kept_ms:.3f} ms per turn")
    assert "Generated Lamp 499" in first.fresh.system
    assert kept.fresh is first.fresh
