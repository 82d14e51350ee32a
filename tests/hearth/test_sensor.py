"""Sensors of the engine's service device and of each agent's (real engine)."""

from __future__ import annotations

from typing import Any

from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from pytest_homeassistant_custom_component.common import MockConfigEntry
from syrupy.assertion import SnapshotAssertion

from custom_components.hearth.const import DOMAIN

from .common import converse, hearth_traces

SENSORS = (
    "cache_hit_rate",
    "last_ttft",
    "ttft_median",
    "ttft_p95",
    "reused_tokens",
    "prompt_tokens",
    "prefill_throughput",
    "decode_throughput",
    "kv_cache_used",
    "kv_cache_usage",
    "evictions",
    "pinned_prefix_tokens",
    "prefix_re_pins",
)
AGENT_SENSORS = ("prefix_pin", "ttft", "requests", "errors")
# Change on every request: disabled by default (the recorder would store each value).
DISABLED_BY_DEFAULT = {
    "sensor.hearth_engine_prompt_tokens",
    "sensor.hearth_engine_reused_tokens",
    "sensor.hearth_requests",
}


def _describe(hass: HomeAssistant, entry: er.RegistryEntry) -> dict[str, Any]:
    """What defines a sensor, without its (engine-dependent) value."""
    state = hass.states.get(entry.entity_id)
    assert state is not None
    return {
        "entity_id": entry.entity_id,
        "unique_id": entry.unique_id.removeprefix(f"{entry.config_entry_id}_").removeprefix(
            f"{entry.config_subentry_id}_"
        ),
        "translation_key": entry.translation_key,
        "device_class": entry.original_device_class,
        "unit": entry.unit_of_measurement,
        "entity_category": entry.entity_category,
        "capabilities": entry.capabilities,
        "attributes": {
            key: value
            for key, value in state.attributes.items()
            if key
            not in ("prompt_tokens", "cached_tokens", "completion_tokens", "requests", "tokens")
        },
    }


async def test_entities(
    hass: HomeAssistant,
    entity_registry_enabled_by_default: None,
    entry: MockConfigEntry,
    snapshot: SnapshotAssertion,
) -> None:
    """The entity set: names, units, state classes, categories (snapshot); the engine's
    on its device, the agent's on the agent's."""
    registry = er.async_get(hass)
    entities = sorted(
        (
            e
            for e in er.async_entries_for_config_entry(registry, entry.entry_id)
            if e.domain in ("sensor", "binary_sensor")
        ),
        key=lambda e: e.entity_id,
    )
    assert [e.entity_id for e in entities] == sorted(
        [
            "binary_sensor.hearth_engine_connected",
            *(f"sensor.hearth_engine_{key}" for key in SENSORS),
            *(f"sensor.hearth_{key}" for key in AGENT_SENSORS),
        ]
    )
    assert [_describe(hass, e) for e in entities] == snapshot

    device = dr.async_get(hass).async_get_device_by_identifier(
        (DOMAIN, entry.entry_id), entry.entry_id
    )
    assert device is not None
    assert device.name == "Hearth engine"
    assert device.entry_type is dr.DeviceEntryType.SERVICE
    assert device.model == "tiny-tools"
    agent_device = dr.async_get(hass).async_get_device_by_identifier(
        (DOMAIN, next(iter(entry.subentries))), entry.entry_id
    )
    assert agent_device is not None
    for e in entities:
        is_agent = e.entity_id in {f"sensor.hearth_{key}" for key in AGENT_SENSORS}
        assert e.device_id == (agent_device.id if is_agent else device.id)
        assert e.config_subentry_id == (next(iter(entry.subentries)) if is_agent else None)


async def test_counters_of_every_request_are_disabled_by_default(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Counters that change on every request would fill the recorder: disabled."""
    registry = er.async_get(hass)
    entities = er.async_entries_for_config_entry(registry, entry.entry_id)
    disabled = {e.entity_id for e in entities if e.disabled_by is not None}
    assert disabled == DISABLED_BY_DEFAULT
    assert all(
        e.disabled_by is er.RegistryEntryDisabler.INTEGRATION
        for e in entities
        if e.entity_id in disabled
    )


async def test_sensors_update_after_a_turn(
    hass: HomeAssistant, entity_registry_enabled_by_default: None, entry: MockConfigEntry
) -> None:
    """A turn pushes its TTFT at once; the engine counters follow with a refresh."""
    prompt_before = float(hass.states.get("sensor.hearth_engine_prompt_tokens").state)
    reused_before = float(hass.states.get("sensor.hearth_engine_reused_tokens").state)

    await converse(hass, "hello")
    turn = hearth_traces()[-1]
    last = hass.states.get("sensor.hearth_engine_last_ttft")
    assert float(last.state) == round(turn["ttft_ms"], 3)
    assert last.attributes["prompt_tokens"] == turn["prompt_tokens"]
    assert last.attributes["cached_tokens"] == turn["cached_tokens"]
    assert last.attributes["agent_id"] == "conversation.hearth"

    await hass.async_block_till_done(wait_background_tasks=True)  # refresh after the turn
    prompt_after = float(hass.states.get("sensor.hearth_engine_prompt_tokens").state)
    reused_after = float(hass.states.get("sensor.hearth_engine_reused_tokens").state)
    assert prompt_after - prompt_before >= turn["prompt_tokens"]
    assert reused_after - reused_before >= turn["cached_tokens"]
    hit_rate = float(hass.states.get("sensor.hearth_engine_cache_hit_rate").state)
    assert 0 < hit_rate <= 100
    assert float(hass.states.get("sensor.hearth_engine_ttft_median").state) > 0
    assert float(hass.states.get("sensor.hearth_engine_ttft_p95").state) >= float(
        hass.states.get("sensor.hearth_engine_ttft_median").state
    )
    pinned = entry.runtime_data.prefixes.agent(next(iter(entry.subentries))).tokens
    assert float(hass.states.get("sensor.hearth_engine_pinned_prefix_tokens").state) >= pinned
    assert float(hass.states.get("sensor.hearth_engine_kv_cache_used").state) > 0
    assert 0 < float(hass.states.get("sensor.hearth_engine_kv_cache_usage").state) <= 100
    assert float(hass.states.get("sensor.hearth_engine_decode_throughput").state) > 0
    assert hass.states.get("sensor.hearth_engine_prefix_re_pins").state == "0"
