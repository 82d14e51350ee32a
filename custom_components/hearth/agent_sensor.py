"""Sensors of each conversation agent (its own service device): pin state and turns.

Set up by the sensor platform (``sensor.py``), one set per ``conversation`` subentry:
the pin's state (ready, warming, failed, refused, with its tokens, rebuilds and last
error), the TTFT of the agent's last turn, and its requests and errors. The request
counter changes on every turn, so it is disabled by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from homeassistant.components.sensor import (
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import UnitOfTime
from homeassistant.helpers.typing import StateType
from homeassistant.helpers.update_coordinator import CoordinatorEntity

from .backend.coordinator import HearthCoordinator
from .data import AgentStats, HearthConfigEntry, HearthData
from .engine_device import agent_device_info
from .pins.model import PinState


@dataclass(frozen=True, slots=True)
class AgentView:
    """What an agent sensor reads: the entry's runtime data and the agent's id."""

    data: HearthData
    subentry_id: str

    @property
    def stats(self) -> AgentStats:
        """The agent's turn figures (zero until its first turn)."""
        return self.data.agents.get(self.subentry_id) or AgentStats()


def _pin_state(view: AgentView) -> StateType:
    state = view.data.prefixes.state(view.subentry_id)
    return state.value if state is not None else None


def _pin_attributes(view: AgentView) -> dict[str, Any]:
    agent = view.data.prefixes.agent(view.subentry_id)
    if agent is None:
        return {}
    return {"tokens": agent.tokens, "rebuilds": agent.rebuilds, "last_error": agent.error}


def _ttft(view: AgentView) -> StateType:
    turn = view.stats.last_turn
    return round(turn.ttft_ms, 3) if turn is not None and turn.ttft_ms is not None else None


@dataclass(frozen=True, kw_only=True)
class HearthAgentSensorEntityDescription(SensorEntityDescription):
    """An agent sensor: where its value comes from."""

    value_fn: Callable[[AgentView], StateType]
    attributes_fn: Callable[[AgentView], dict[str, Any]] | None = None


AGENT_SENSORS: tuple[HearthAgentSensorEntityDescription, ...] = (
    HearthAgentSensorEntityDescription(
        key="pin_state",
        translation_key="pin_state",
        device_class=SensorDeviceClass.ENUM,
        options=[state.value for state in PinState],
        value_fn=_pin_state,
        attributes_fn=_pin_attributes,
    ),
    HearthAgentSensorEntityDescription(
        key="ttft",
        translation_key="agent_ttft",
        device_class=SensorDeviceClass.DURATION,
        native_unit_of_measurement=UnitOfTime.MILLISECONDS,
        state_class=SensorStateClass.MEASUREMENT,
        suggested_display_precision=0,
        value_fn=_ttft,
    ),
    HearthAgentSensorEntityDescription(
        key="requests",
        translation_key="agent_requests",
        state_class=SensorStateClass.TOTAL_INCREASING,
        entity_registry_enabled_default=False,  # changes on every turn
        value_fn=lambda view: view.stats.requests,
    ),
    HearthAgentSensorEntityDescription(
        key="errors",
        translation_key="agent_errors",
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda view: view.stats.errors,
        attributes_fn=lambda view: {
            "last_error": view.stats.last_error,
            "stalls": view.stats.stalls,
        },
    ),
)


class HearthAgentSensor(CoordinatorEntity[HearthCoordinator], SensorEntity):
    """A figure of one conversation agent."""

    entity_description: HearthAgentSensorEntityDescription
    _attr_has_entity_name = True

    def __init__(
        self,
        entry: HearthConfigEntry,
        subentry: ConfigSubentry,
        description: HearthAgentSensorEntityDescription,
    ) -> None:
        """Describe the sensor ``description`` of the agent ``subentry``."""
        super().__init__(entry.runtime_data.coordinator)
        self.entry = entry
        self.entity_description = description
        self._view = AgentView(entry.runtime_data, subentry.subentry_id)
        self._attr_unique_id = f"{subentry.subentry_id}_{description.key}"
        self._attr_device_info = agent_device_info(entry, subentry)

    @property
    def native_value(self) -> StateType:
        """The current value."""
        return self.entity_description.value_fn(self._view)

    @property
    def extra_state_attributes(self) -> dict[str, Any] | None:
        """Tokens, rebuilds and the last error, where the sensor has them."""
        if self.entity_description.attributes_fn is None:
            return None
        return self.entity_description.attributes_fn(self._view)
