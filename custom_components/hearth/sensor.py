"""Cache and latency sensors of a Hearth engine (its service device, "Hearth"), and
each agent's sensors (``agent_sensor.py``).

The prompt and reused-token counters change on every request: they are disabled by
default (enable them for the dashboard's counters).

On a server without Hearth's counters (llama.cpp, vLLM, SGLang: ``backend/server_stats.py``), a
sensor whose figure the server does not report is unavailable, never a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import (
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import PERCENTAGE, EntityCategory, UnitOfInformation, UnitOfTime
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.helpers.typing import StateType

from .agent_sensor import AGENT_SENSORS, HearthAgentSensor
from .const import MIB, SUBENTRY_CONVERSATION
from .data import HearthConfigEntry, HearthData
from .engine_device import HearthCoordinatorEntity

PARALLEL_UPDATES = 0  # the coordinator does all the I/O

UNIT_TOKENS = "tokens"
UNIT_TOKENS_PER_SECOND = "tokens/s"


def _stat(data: HearthData, key: str) -> Any:
    status = data.coordinator.data
    return status.stats.get(key) if status is not None else None


def _number(data: HearthData, key: str, scale: float = 1.0) -> float | None:
    value = _stat(data, key)
    return round(float(value) * scale, 3) if isinstance(value, int | float) else None


def _windowed(data: HearthData, key: str, scale: float = 1.0) -> float | None:
    """A figure over the engine's window of recent requests (unknown while empty)."""
    if not _stat(data, "window_requests"):
        return None
    return _number(data, key, scale)


def _last_ttft(data: HearthData) -> float | None:
    """TTFT of the last turn of an agent; else of the engine's last request."""
    if data.last_turn is not None and data.last_turn.ttft_ms is not None:
        return round(data.last_turn.ttft_ms, 3)
    last = _stat(data, "last_request")
    if isinstance(last, Mapping) and isinstance(value := last.get("ttft_ms"), int | float):
        return round(float(value), 3)
    return None


def _last_turn_attributes(data: HearthData) -> dict[str, Any] | None:
    if (turn := data.last_turn) is None:
        return None
    return {
        "prompt_tokens": turn.prompt_tokens,
        "cached_tokens": turn.cached_tokens,
        "completion_tokens": turn.completion_tokens,
        "requests": len(turn.requests),
        "agent_id": turn.agent_id,
    }


@dataclass(frozen=True, kw_only=True)
class HearthSensorEntityDescription(SensorEntityDescription):
    """A Hearth sensor: where its value comes from."""

    value_fn: Callable[[HearthData], StateType]
    stat: str | None = None  # the stat key it shows (other servers may not report it)
    attributes_fn: Callable[[HearthData], dict[str, Any] | None] | None = None


SENSORS: tuple[HearthSensorEntityDescription, ...] = (
    HearthSensorEntityDescription(
        key="cache_hit_rate",
        translation_key="cache_hit_rate",
        native_unit_of_measurement=PERCENTAGE,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        stat="window_hit_rate",
        value_fn=lambda data: _windowed(data, "window_hit_rate", 100.0),
    ),
    HearthSensorEntityDescription(
        key="last_ttft",
        translation_key="last_ttft",
        device_class=SensorDeviceClass.DURATION,
        native_unit_of_measurement=UnitOfTime.MILLISECONDS,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        value_fn=_last_ttft,
        attributes_fn=_last_turn_attributes,
    ),
    HearthSensorEntityDescription(
        key="ttft_median",
        translation_key="ttft_median",
        device_class=SensorDeviceClass.DURATION,
        native_unit_of_measurement=UnitOfTime.MILLISECONDS,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        stat="ttft_ms_median",
        value_fn=lambda data: _windowed(data, "ttft_ms_median"),
    ),
    HearthSensorEntityDescription(
        key="ttft_p95",
        translation_key="ttft_p95",
        device_class=SensorDeviceClass.DURATION,
        native_unit_of_measurement=UnitOfTime.MILLISECONDS,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        stat="ttft_ms_p95",
        value_fn=lambda data: _windowed(data, "ttft_ms_p95"),
    ),
    HearthSensorEntityDescription(
        key="reused_tokens",
        translation_key="reused_tokens",
        native_unit_of_measurement=UNIT_TOKENS,
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_registry_enabled_default=False,  # changes on every request
        stat="prefix_cache_hits_tokens",
        value_fn=lambda data: _stat(data, "prefix_cache_hits_tokens"),
    ),
    HearthSensorEntityDescription(
        key="prompt_tokens",
        translation_key="prompt_tokens",
        native_unit_of_measurement=UNIT_TOKENS,
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_registry_enabled_default=False,  # changes on every request
        stat="prompt_tokens_total",
        value_fn=lambda data: _stat(data, "prompt_tokens_total"),
    ),
    HearthSensorEntityDescription(
        key="prefill_throughput",
        translation_key="prefill_throughput",
        native_unit_of_measurement=UNIT_TOKENS_PER_SECOND,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        stat="prefill_tokens_per_s",
        value_fn=lambda data: _number(data, "prefill_tokens_per_s"),
    ),
    HearthSensorEntityDescription(
        key="decode_throughput",
        translation_key="decode_throughput",
        native_unit_of_measurement=UNIT_TOKENS_PER_SECOND,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        stat="decode_tokens_per_s",
        value_fn=lambda data: _number(data, "decode_tokens_per_s"),
    ),
    HearthSensorEntityDescription(
        key="kv_cache_used",
        translation_key="kv_cache_used",
        device_class=SensorDeviceClass.DATA_SIZE,
        native_unit_of_measurement=UnitOfInformation.MEBIBYTES,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        entity_category=EntityCategory.DIAGNOSTIC,
        stat="kv_cache_used_bytes",
        value_fn=lambda data: _number(data, "kv_cache_used_bytes", 1 / MIB),
    ),
    HearthSensorEntityDescription(
        key="kv_cache_usage",
        translation_key="kv_cache_usage",
        native_unit_of_measurement=PERCENTAGE,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=1,
        entity_category=EntityCategory.DIAGNOSTIC,
        stat="kv_cache_usage",
        value_fn=lambda data: _number(data, "kv_cache_usage", 100.0),
    ),
    HearthSensorEntityDescription(
        key="evictions",
        translation_key="evictions",
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_category=EntityCategory.DIAGNOSTIC,
        stat="kv_cache_evictions_total",
        value_fn=lambda data: _stat(data, "kv_cache_evictions_total"),
    ),
    HearthSensorEntityDescription(
        key="pinned_prefix_tokens",
        translation_key="pinned_prefix_tokens",
        native_unit_of_measurement=UNIT_TOKENS,
        state_class=SensorStateClass.MEASUREMENT,
        entity_category=EntityCategory.DIAGNOSTIC,
        stat="pinned_prefix_tokens",
        value_fn=lambda data: _stat(data, "pinned_prefix_tokens"),
    ),
    HearthSensorEntityDescription(
        key="prefix_re_pins",
        translation_key="prefix_re_pins",
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_category=EntityCategory.DIAGNOSTIC,
        value_fn=lambda data: data.prefixes.repins,
        attributes_fn=lambda data: dict(data.prefixes.repin_causes),
    ),
)


async def async_setup_entry(
    hass: HomeAssistant,
    entry: HearthConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the engine's sensors, then each agent's."""
    async_add_entities(HearthSensor(entry, description) for description in SENSORS)
    for subentry in entry.subentries.values():
        if subentry.subentry_type != SUBENTRY_CONVERSATION:
            continue
        async_add_entities(
            (HearthAgentSensor(entry, subentry, description) for description in AGENT_SENSORS),
            config_subentry_id=subentry.subentry_id,
        )


class HearthSensor(HearthCoordinatorEntity, SensorEntity):
    """A figure of the engine or of the agents' last turn."""

    entity_description: HearthSensorEntityDescription
    _unrecorded_attributes = frozenset(
        {"prompt_tokens", "cached_tokens", "completion_tokens", "requests", "agent_id"}
    )

    def __init__(
        self, entry: HearthConfigEntry, description: HearthSensorEntityDescription
    ) -> None:
        """Describe the sensor ``description`` of ``entry``'s engine."""
        super().__init__(entry, description.key)
        self.entity_description = description

    @property
    def available(self) -> bool:
        """Connected, and the server reports this figure."""
        stat = self.entity_description.stat
        status = self.coordinator.data
        if stat is None or status is None:
            return super().available
        return super().available and self.entry.runtime_data.backend.reports(stat, status)

    @property
    def native_value(self) -> StateType:
        """The current value."""
        return self.entity_description.value_fn(self.entry.runtime_data)

    @property
    def extra_state_attributes(self) -> dict[str, Any] | None:
        """Per-turn figures (last TTFT), re-pins by cause."""
        if self.entity_description.attributes_fn is None:
            return None
        return self.entity_description.attributes_fn(self.entry.runtime_data)
