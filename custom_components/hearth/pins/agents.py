"""The entry's pins: one per agent and device class, and what the UI calls each.

``AgentPins`` holds the ``AgentPin`` bookkeeping of every conversation agent and AI
Task of the entry: its pin for requests without a device, added when the entry starts,
and one per device class of the house's satellites (``house/device_class.py``), added
once Home Assistant has started or when a request of a new class comes. The other parts
of ``pins/`` share it; ``started`` says whether Home Assistant has started.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant, callback

from ..const import (
    CONF_REPIN_DEBOUNCE,
    DEFAULT_REPIN_DEBOUNCE,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from ..house.device_class import DeviceClass, classes_in_use
from .history import PinHistory
from .model import AgentPin, PinKey, pin_key


class AgentPins:
    """The pins of an entry's agents, by agent and device class."""

    def __init__(self, hass: HomeAssistant, entry: ConfigEntry, history: PinHistory) -> None:
        """No pins until ``async_add_agents``."""
        self.hass = hass
        self.entry = entry
        self.history = history
        self.started = False  # Home Assistant has started: pins are PUT and re-pinned
        self._pins: dict[PinKey, AgentPin] = {}

    def __iter__(self) -> Iterator[AgentPin]:
        return iter(self._pins.values())

    def get(self, key: PinKey) -> AgentPin | None:
        """The pin ``key`` (None: no such pin)."""
        return self._pins.get(key)

    def holds(self, agent: AgentPin) -> bool:
        """Whether ``agent`` is still one of the entry's pins (not removed meanwhile)."""
        return self._pins.get(agent.slot) is agent

    @callback
    def async_add_agents(self) -> None:
        """Add the pin for requests without a device of each agent and AI Task."""
        for subentry_id, subentry in self.entry.subentries.items():
            if subentry.subentry_type in (SUBENTRY_CONVERSATION, SUBENTRY_AI_TASK):
                self.add(subentry_id, DeviceClass.NONE, None)

    @callback
    def async_add_class_pins(self) -> list[AgentPin]:
        """Add a pin for each device class the house's satellites have (new ones only)."""
        added = []
        in_use = classes_in_use(self.hass) - {DeviceClass.NONE}
        for subentry_id, subentry in self.entry.subentries.items():
            if subentry.subentry_type != SUBENTRY_CONVERSATION:
                continue
            for cls in sorted(in_use):
                if (subentry_id, cls) not in self._pins:
                    added.append(self.add(subentry_id, cls, None))
        return added

    def add(self, subentry_id: str, cls: DeviceClass, device_id: str | None) -> AgentPin:
        """A new pin of the agent ``subentry_id`` for ``cls``, on the base it last kept."""
        agent = AgentPin(
            subentry_id,
            debounce(self.entry.subentries[subentry_id].data),
            device_class=cls,
            device_id=device_id,
            base=self.history.base(pin_key(subentry_id, cls)),
        )
        self._pins[agent.slot] = agent
        return agent

    def remove(self, subentry_ids: set[str]) -> list[AgentPin]:
        """Forget every pin of the agents ``subentry_ids``; returns them."""
        removed = [agent for key, agent in self._pins.items() if key[0] in subentry_ids]
        for agent in removed:
            del self._pins[agent.slot]
        return removed

    def title(self, agent: AgentPin) -> str:
        """The pin as Repairs names it: its agent's title, and its device class."""
        subentry = self.entry.subentries.get(agent.subentry_id)
        title = subentry.title if subentry is not None else agent.subentry_id
        if agent.device_class is not DeviceClass.NONE:
            title = f"{title} ({agent.device_class})"
        return title


def debounce(options: Mapping[str, Any]) -> float:
    """The quiet time, in seconds, an agent's options ask before a re-pin."""
    return float(options.get(CONF_REPIN_DEBOUNCE, DEFAULT_REPIN_DEBOUNCE))
