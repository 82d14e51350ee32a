"""What the UI shows of each agent: pin state, TTFT, requests, errors, Repairs issues and
rebuild counts (real engine, real Home Assistant)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from unittest.mock import patch

import pytest
from freezegun.api import FrozenDateTimeFactory
from homeassistant.config_entries import ConfigSubentryData
from homeassistant.const import CONF_URL
from homeassistant.const import __version__ as HA_VERSION
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import issue_registry as ir
from homeassistant.util import dt as dt_util
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
)

from custom_components.hearth.backend.api import HearthClient, HearthResponseError
from custom_components.hearth.const import (
    CONF_REPIN_DEBOUNCE,
    DOMAIN,
    REBUILD_ISSUE_COUNT,
    SERVICE_REFRESH_PREFIX,
    SUBENTRY_CONVERSATION,
)
from custom_components.hearth.pins.history import storage_key
from custom_components.hearth.pins.model import pin_name

from .common import (
    KITCHEN_LIGHT,
    EngineProcess,
    agent_options,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
)

PIN = "sensor.hearth_prefix_pin"
TTFT = "sensor.hearth_ttft"
REQUESTS = "sensor.hearth_requests"
ERRORS = "sensor.hearth_errors"
REPINS = "sensor.hearth_engine_prefix_re_pins"


def _agent(entry: MockConfigEntry) -> str:
    return next(iter(entry.subentries))


async def _advance(hass: HomeAssistant, seconds: float) -> None:
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=seconds))
    await hass.async_block_till_done(wait_background_tasks=True)


def _issue(hass: HomeAssistant, kind: str, entry: MockConfigEntry) -> ir.IssueEntry | None:
    return ir.async_get(hass).async_get_issue(DOMAIN, f"{kind}_{_agent(entry)}")


def _state(hass: HomeAssistant, entity_id: str) -> Any:
    state = hass.states.get(entity_id)
    assert state is not None, entity_id
    return state


async def test_ready_pin_and_the_agents_turn_figures(
    hass: HomeAssistant,
    entity_registry_enabled_by_default: None,
    entry: MockConfigEntry,
    engine: EngineProcess,
) -> None:
    """A pinned agent shows "ready" with the engine's token count; each turn updates
    the agent's TTFT and request count."""
    pin = _state(hass, PIN)
    assert pin.state == "ready"
    assert pin.attributes["tokens"] == engine.pins()[pin_name(_agent(entry))]["tokens"]
    assert pin.attributes["last_error"] is None
    assert _state(hass, REQUESTS).state == "0"
    assert _state(hass, TTFT).state == "unknown"

    await converse(hass, "hello")
    await converse(hass, "hello")
    assert float(_state(hass, TTFT).state) == round(hearth_traces()[-1]["ttft_ms"], 3)
    assert _state(hass, REQUESTS).state == "2"
    assert _state(hass, ERRORS).state == "0"


async def test_warming_while_a_pin_is_computed(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    """While the engine computes a pin, the agent shows "warming"; then "ready"."""
    seen: list[str] = []
    original = HearthClient.async_put_prefix

    async def spy(client: HearthClient, name: str, body: Any) -> dict[str, Any]:
        seen.append(_state(hass, PIN).state)
        return await original(client, name, body)

    with patch.object(HearthClient, "async_put_prefix", spy):
        await hass.services.async_call(DOMAIN, SERVICE_REFRESH_PREFIX, blocking=True)
    assert seen == ["warming"]
    assert _state(hass, PIN).state == "ready"


async def test_failed_pin_and_errors_then_recovery(
    hass: HomeAssistant,
    entity_registry_enabled_by_default: None,
    house: None,
    private_engine_factory: Callable[..., EngineProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Engine gone: a turn counts an error (one warning for two), a pin attempt shows
    "failed" with its error; the engine back (restarted): "ready" again, and a turn
    that works says so once."""
    engine = private_engine_factory()
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    assert _state(hass, PIN).state == "ready"

    engine.stop()
    await converse(hass, "hello")  # before the next poll: the sensors are still available
    await converse(hass, "hello")
    errors = _state(hass, ERRORS)
    assert errors.state == "2"
    failed = [r for r in caplog.records if "request failed" in r.getMessage()]
    assert [r.levelname for r in failed if r.levelno >= logging.INFO] == ["WARNING"]  # once
    assert errors.attributes["last_error"]
    with pytest.raises(HomeAssistantError):
        await hass.services.async_call(DOMAIN, SERVICE_REFRESH_PREFIX, blocking=True)
    pin = _state(hass, PIN)
    assert pin.state == "failed"
    assert pin.attributes["last_error"]
    assert _issue(hass, "pin_refused", entry) is None  # a failure is not a refusal

    engine.start()
    await _advance(hass, 11)
    pin = _state(hass, PIN)
    assert pin.state == "ready"
    assert pin.attributes["last_error"] is None
    assert _state(hass, REQUESTS).state == "2"
    await converse(hass, "hello")
    assert [r.levelname for r in caplog.records if "work again" in r.getMessage()] == ["INFO"]


async def test_refused_pin_raises_a_repair_that_clears_itself(
    hass: HomeAssistant, house: None, private_engine_factory: Callable[..., EngineProcess]
) -> None:
    """An engine whose KV budget cannot hold the prefix refuses it: "refused" and a
    Repairs issue naming the agent; the engine restarted with room: "ready", no issue."""
    engine = private_engine_factory(kv_cache_mb=1)
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    pin = _state(hass, PIN)
    assert pin.state == "refused"
    assert "too large" in pin.attributes["last_error"]
    issue = _issue(hass, "pin_refused", entry)
    assert issue is not None
    assert issue.translation_key == "pin_refused"
    assert issue.severity is ir.IssueSeverity.ERROR
    assert issue.translation_placeholders is not None
    assert issue.translation_placeholders["agent"] == "Hearth"
    assert "too large" in issue.translation_placeholders["error"]

    engine.stop()
    engine.kv_cache_mb = 256
    engine.start()
    await _advance(hass, 11)
    assert _state(hass, PIN).state == "ready"
    assert _issue(hass, "pin_refused", entry) is None


async def test_repair_of_a_refused_pin_goes_with_the_entry(
    hass: HomeAssistant, house: None, private_engine_factory: Callable[..., EngineProcess]
) -> None:
    """Unloading the entry drops its issues: nothing stays that no one can clear."""
    engine = private_engine_factory(kv_cache_mb=1)
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    await async_setup_entry(hass, entry)
    assert _issue(hass, "pin_refused", entry) is not None
    assert await hass.config_entries.async_unload(entry.entry_id)
    assert _issue(hass, "pin_refused", entry) is None


async def test_pin_rebuilt_too_often_raises_a_repair_that_clears_itself(
    hass: HomeAssistant, entry: MockConfigEntry, freezer: FrozenDateTimeFactory
) -> None:
    """A house that keeps changing rebuilds the pin again and again: an issue at the
    threshold; an hour later, with no more rebuilds, it is gone."""
    registry = er.async_get(hass)
    for i in range(REBUILD_ISSUE_COUNT):
        assert _issue(hass, "pin_rebuilt_often", entry) is None
        registry.async_update_entity(KITCHEN_LIGHT, aliases={f"Lamp {i}"})
        await hass.async_block_till_done()
        freezer.tick(timedelta(seconds=3))
        await _advance(hass, 0)
    assert entry.runtime_data.prefixes.repins == REBUILD_ISSUE_COUNT
    issue = _issue(hass, "pin_rebuilt_often", entry)
    assert issue is not None
    assert issue.translation_placeholders == {
        "agent": "Hearth",
        "count": str(REBUILD_ISSUE_COUNT),
        "minutes": "60",
    }
    assert _state(hass, PIN).attributes["rebuilds"] == REBUILD_ISSUE_COUNT
    assert _state(hass, REPINS).attributes["changed"] == REBUILD_ISSUE_COUNT

    freezer.tick(timedelta(minutes=61))
    await _advance(hass, 0)  # the next poll looks again
    assert _issue(hass, "pin_rebuilt_often", entry) is None


async def test_rebuild_after_a_restart_is_counted(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """The house changed while Home Assistant was down (here: the entry unloaded): the
    first pin replaces the last run's pin, so it counts, as "ha_restart"."""
    assert await hass.config_entries.async_unload(entry.entry_id)
    er.async_get(hass).async_update_entity(KITCHEN_LIGHT, aliases={"Cooker Light"})
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done(wait_background_tasks=True)
    prefixes = entry.runtime_data.prefixes
    assert prefixes.repins == 1
    assert prefixes.repin_causes["ha_restart"] == 1
    assert _state(hass, REPINS).state == "1"
    assert _state(hass, REPINS).attributes["ha_restart"] == 1


async def test_rebuild_after_an_upgrade_is_counted(
    hass: HomeAssistant, hass_storage: dict[str, Any], house: None, engine: EngineProcess
) -> None:
    """The last run was another Home Assistant version and pinned another prefix (its
    prompt text changed): the first pin counts, as "ha_upgrade"; the history is updated."""
    entry = make_entry(engine.url, **{CONF_REPIN_DEBOUNCE: 2.0})
    key = storage_key(entry.entry_id)
    hass_storage[key] = {
        "version": 1,
        "minor_version": 1,
        "key": key,
        "data": {"ha_version": "2026.9.0", "digests": {_agent(entry): "0" * 64}},
    }
    await async_setup_entry(hass, entry)
    prefixes = entry.runtime_data.prefixes
    assert prefixes.repins == 1
    assert prefixes.repin_causes == {
        "changed": 0,
        "engine_restarted": 0,
        "missing": 0,
        "ha_restart": 0,
        "ha_upgrade": 1,
    }
    agent = prefixes.agent(_agent(entry))
    data = hass_storage[key]["data"]
    assert data["ha_version"] == HA_VERSION
    assert data["digests"] == {_agent(entry): agent.digest}
    assert data["bases"][_agent(entry)]["digest"] == agent.base.digest  # type: ignore[union-attr]


async def test_failed_pin_backs_off_and_logs_once(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    engine: EngineProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pin the engine keeps failing (busy) while polls succeed is retried 1, 2, 4...
    polls apart, not at every poll; one warning when it fails, one line when it is
    pinned again."""
    name = pin_name(_agent(entry))
    attempts: list[str] = []

    async def busy(client: HearthClient, pin: str, body: Any) -> dict[str, Any]:
        attempts.append(pin)
        raise HearthResponseError(503, "overloaded", "the engine is busy")

    engine.request("DELETE", f"/v1/prefixes/{name}")
    with patch.object(HearthClient, "async_put_prefix", busy):
        for _ in range(16):  # 16 polls
            await _advance(hass, 10)
    # Polls 1, 2, 4, 8, 16 (each failure doubles the wait): 5 tries, not 16.
    assert len(attempts) == 5
    assert _state(hass, PIN).state == "failed"
    failed = [r for r in caplog.records if "Could not pin" in r.getMessage()]
    assert [r.levelname for r in failed if r.levelno >= logging.INFO] == ["WARNING"]

    for _ in range(17):
        await _advance(hass, 10)
    assert _state(hass, PIN).state == "ready"
    assert name in engine.pins()
    back = [r for r in caplog.records if "pinned again" in r.getMessage()]
    assert [r.levelname for r in back] == ["INFO"]


async def test_refresh_answers_once_every_pin_is_answered(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """The refresh action with two agents, one failing at once: it raises only after the
    other agent's PUT was answered (none is left running unobserved)."""
    agents = [
        ConfigSubentryData(
            data=agent_options(), subentry_type=SUBENTRY_CONVERSATION, title=title, unique_id=None
        )
        for title in ("Hearth", "Second")
    ]
    entry = MockConfigEntry(
        domain=DOMAIN, title="Hearth", data={CONF_URL: engine.url}, subentries_data=agents
    )
    await async_setup_entry(hass, entry)
    first_name, second_name = (pin_name(sid) for sid in entry.subentries)
    original = HearthClient.async_put_prefix
    answered: list[str] = []

    async def one_fails(client: HearthClient, pin: str, body: Any) -> dict[str, Any]:
        if pin == first_name:
            raise HearthResponseError(503, "overloaded", "the engine is busy")
        await asyncio.sleep(0.3)
        result = await original(client, pin, body)
        answered.append(pin)
        return result

    with (
        patch.object(HearthClient, "async_put_prefix", one_fails),
        pytest.raises(HomeAssistantError),
    ):
        await hass.services.async_call(DOMAIN, SERVICE_REFRESH_PREFIX, blocking=True)
    assert answered == [second_name]
