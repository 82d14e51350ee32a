"""A house bigger than the model's context: the pin lists what fits, a Repairs issue
names the counts, and a command on a listed thing still works (real Home Assistant,
real engine: ``tiny-tools`` served with ``--max-context`` below what the house needs,
and the default model with its own 8,192 tokens under a house of 1,000 entities)."""

from __future__ import annotations

from collections.abc import Callable

from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir

from custom_components.hearth.const import CONF_EXAMPLES, CONF_READ_FIRST, DOMAIN
from custom_components.hearth.pins.repairs import HOUSE_TOO_BIG, issue_id
from custom_components.hearth.prefix.budget import RESERVE_SHARE

from .common import (
    KITCHEN_LIGHT,
    EngineProcess,
    async_setup_entry,
    converse,
    make_entry,
    speech,
)

CONTEXT = 4000
SUITES = 40  # each: two lights and two temperature sensors


async def _add_suites(hass: HomeAssistant, suites: int = SUITES) -> int:
    """Guest suites after the test house's Kitchen (by name): lights and sensors, all
    exposed to Assist by default. Returns how many entities were added."""
    areas = ar.async_get(hass)
    registry = er.async_get(hass)
    added = 0
    for n in range(1, suites + 1):
        area = areas.async_create(f"Suite {n:02}")
        for kind, domain, extra in (
            ("Ceiling Light", "light", {}),
            ("Reading Lamp", "light", {}),
            ("Temperature", "sensor", {"device_class": "temperature", "unit_of_measurement": "°C"}),
            ("Humidity", "sensor", {"device_class": "humidity", "unit_of_measurement": "%"}),
        ):
            name = f"Suite {n:02} {kind}"
            entity = registry.async_get_or_create(
                domain,
                "test",
                name.lower().replace(" ", "_"),
                original_name=name,
                original_device_class=extra.get("device_class"),
            )
            registry.async_update_entity(entity.entity_id, area_id=area.id)
            state = "21" if domain == "sensor" else "off"
            hass.states.async_set(entity.entity_id, state, {"friendly_name": name, **extra})
            added += 1
    await hass.async_block_till_done()
    return added


async def test_a_house_too_big_is_fitted_and_said(
    hass: HomeAssistant,
    house: None,
    private_engine_factory: Callable[..., EngineProcess],
) -> None:
    added = await _add_suites(hass)
    short = private_engine_factory(args=("--max-context", str(CONTEXT)))
    entry = make_entry(short.url)
    await async_setup_entry(hass, entry)
    # The first pin counts its tokens; a house counted short is fitted again at once.
    await hass.async_block_till_done(wait_background_tasks=True)
    subentry_id = next(iter(entry.subentries))
    agent = entry.runtime_data.prefixes.agent(subentry_id)
    assert agent is not None and agent.pinned is not None and agent.error is None
    house = agent.pinned.house
    assert house is not None

    # What is listed fits the context less its reserve, and something had to go.
    assert agent.tokens is not None
    assert agent.tokens <= CONTEXT * (1 - RESERVE_SHARE)
    left_out = house.left_out
    assert left_out
    assert len(house.entities) == added + 1
    listed = set(house.entities) - left_out
    # Read-only sensors go before any light, and the Kitchen (first by name) stays.
    assert KITCHEN_LIGHT in listed
    if any(entity_id.startswith("light.") for entity_id in left_out):
        assert all(not entity_id.startswith("sensor.") for entity_id in listed)
    system = agent.pinned.system
    for entity_id in left_out:
        assert f" {house.entities[entity_id].name}" not in system

    issue = ir.async_get(hass).async_get_issue(DOMAIN, issue_id(HOUSE_TOO_BIG, subentry_id))
    assert issue is not None
    assert issue.translation_placeholders == {
        "agent": issue.translation_placeholders["agent"],
        "listed": str(len(listed)),
        "left_out": str(len(left_out)),
        "exposed": str(added + 1),
        "context": str(CONTEXT),
    }

    # A command on a listed thing still works, and is not "too long".
    await converse(hass, "turn on the kitchen light")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"


async def test_the_issue_clears_once_the_house_fits(
    hass: HomeAssistant,
    house: None,
    private_engine_factory: Callable[..., EngineProcess],
) -> None:
    await _add_suites(hass)
    short = private_engine_factory(args=("--max-context", str(CONTEXT)))
    entry = make_entry(short.url)
    await async_setup_entry(hass, entry)
    await hass.async_block_till_done(wait_background_tasks=True)
    subentry_id = next(iter(entry.subentries))
    issues = ir.async_get(hass)
    assert issues.async_get_issue(DOMAIN, issue_id(HOUSE_TOO_BIG, subentry_id)) is not None

    await entry.runtime_data.prefixes.async_refresh_all()  # the same house: still too big
    assert issues.async_get_issue(DOMAIN, issue_id(HOUSE_TOO_BIG, subentry_id)) is not None
    registry = er.async_get(hass)
    for entity in list(registry.entities.values()):
        if entity.platform == "test":
            registry.async_remove(entity.entity_id)
            hass.states.async_remove(entity.entity_id)
    await hass.async_block_till_done()
    await entry.runtime_data.prefixes.async_refresh_all()
    assert issues.async_get_issue(DOMAIN, issue_id(HOUSE_TOO_BIG, subentry_id)) is None
    agent = entry.runtime_data.prefixes.agent(subentry_id)
    assert agent is not None and agent.pinned is not None
    assert agent.pinned.house is not None and not agent.pinned.house.left_out


async def test_a_thousand_entities_on_the_default_model(
    hass: HomeAssistant,
    house: None,
    private_engine_factory: Callable[..., EngineProcess],
) -> None:
    """Issue 49's 1,000-entity house, on the model users get: its own context (8,192
    tokens, no ``--max-context``), the Repairs counts, and one-line commands on listed
    lights answered by the model through Home Assistant, never "too long". The agent's
    options are a user's: worked examples and reading the house first on."""
    added = await _add_suites(hass, 250)
    assert added == 1000
    engine = private_engine_factory(model="default", kv_cache_mb=1024)
    entry = make_entry(engine.url, **{CONF_EXAMPLES: True, CONF_READ_FIRST: True})
    await async_setup_entry(hass, entry)
    await hass.async_block_till_done(wait_background_tasks=True)
    subentry_id = next(iter(entry.subentries))
    agent = entry.runtime_data.prefixes.agent(subentry_id)
    assert agent is not None and agent.pinned is not None and agent.error is None
    assert agent.pinned.house is not None
    assert agent.pinned.examples  # the house is fitted around them
    left_out = agent.pinned.house.left_out
    listed = set(agent.pinned.house.entities) - left_out
    lamp = next(
        entity.entity_id
        for entity in er.async_get(hass).entities.values()
        if entity.original_name == "Suite 01 Reading Lamp"
    )
    assert left_out and lamp in listed

    issue = ir.async_get(hass).async_get_issue(DOMAIN, issue_id(HOUSE_TOO_BIG, subentry_id))
    assert issue is not None
    placeholders = issue.translation_placeholders or {}
    assert placeholders["listed"] == str(len(listed))
    assert placeholders["left_out"] == str(len(left_out))
    assert placeholders["exposed"] == str(added + 1)
    assert placeholders["context"] == "8192"

    result = await converse(hass, "turn on the kitchen light")
    assert "too long" not in speech(result), speech(result)
    assert hass.states.get(KITCHEN_LIGHT).state == "on", speech(result)
    # The suites are states without entity objects behind them: a service call on one
    # changes nothing, so what Home Assistant reports having acted on is checked.
    result = await converse(hass, "turn on the suite 01 reading lamp")
    assert "too long" not in speech(result), speech(result)
    assert [target.id for target in result.response.success_results] == [lamp], speech(result)
