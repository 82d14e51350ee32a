"""The house changes that re-pin, and the debounce before each re-pin.

The filters keep a change that cannot change the static context or the tools (a light
merely turning on, a new device without entities yet) from scheduling a re-pin;
``async_listen_house_changes`` subscribes to the rest: the entity, device, area and
floor registries, the core configuration, entities appearing, disappearing or being
renamed, and the exposed-entity settings.

``RepinSchedule`` re-pins a pin once the house has been quiet for the agent's debounce
(HA's ``Debouncer``, one per pin), and never later than ``REPIN_MAX_DELAY_FACTOR``
debounce periods after the first change.

The engine's polls are events too: ``EnginePolls`` pins again what a restarted engine
(a new ``instance_id``) lost or what it no longer has, a failed pin after its backoff
(``pinning.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from homeassistant.components import conversation
from homeassistant.components.homeassistant import exposed_entities
from homeassistant.const import EVENT_CORE_CONFIG_UPDATE, EVENT_STATE_CHANGED
from homeassistant.core import CALLBACK_TYPE, Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers.debounce import Debouncer

from ..backend.coordinator import EngineStatus, HearthCoordinator
from ..const import LOGGER, REPIN_MAX_DELAY_FACTOR
from ..house.device_class import DeviceClass
from .agents import AgentPins
from .model import AgentPin, PinKey, PinReason
from .pinning import Pinner
from .rebuilds import Rebuilds

# Registry changes that can change the static context or the tools.
ENTITY_CHANGES = frozenset(
    {
        "aliases",
        "area_id",
        "device_id",
        "disabled_by",
        "entity_id",
        "hidden_by",
        "name",
        "original_name",
    }
)
DEVICE_CHANGES = frozenset({"area_id", "disabled_by", "name", "name_by_user"})


@callback
def entity_registry_filter(event_data: er.EventEntityRegistryUpdatedData) -> bool:
    """An entity was created or removed, or changed what the static context shows."""
    if event_data["action"] != "update":
        return True  # created or removed
    return not ENTITY_CHANGES.isdisjoint(event_data["changes"])


@callback
def device_registry_filter(event_data: dr.EventDeviceRegistryUpdatedData) -> bool:
    """A device was removed, or changed what its entities show (area, name)."""
    if event_data["action"] == "remove":
        return True
    if event_data["action"] != "update":
        return False  # a new device has no entities yet
    return not DEVICE_CHANGES.isdisjoint(event_data["changes"])


@callback
def state_changed_filter(event_data: EventStateChangedData) -> bool:
    """An entity appeared, disappeared or was renamed; never a plain state change."""
    old, new = event_data["old_state"], event_data["new_state"]
    return old is None or new is None or old.name != new.name


class HouseChanged(Protocol):
    """Called with the bus event of a change, or nothing (the exposed-entity settings)."""

    def __call__(self, event: Event[Any] | None = None, /) -> None: ...


@callback
def async_listen_house_changes(hass: HomeAssistant, changed: HouseChanged) -> list[CALLBACK_TYPE]:
    """Call ``changed`` at each house change that can change a prefix; returns the
    unsubscribers."""
    bus = hass.bus
    return [
        bus.async_listen(
            er.EVENT_ENTITY_REGISTRY_UPDATED, changed, event_filter=entity_registry_filter
        ),
        bus.async_listen(
            dr.EVENT_DEVICE_REGISTRY_UPDATED, changed, event_filter=device_registry_filter
        ),
        bus.async_listen(ar.EVENT_AREA_REGISTRY_UPDATED, changed),
        bus.async_listen(fr.EVENT_FLOOR_REGISTRY_UPDATED, changed),
        bus.async_listen(EVENT_CORE_CONFIG_UPDATE, changed),
        bus.async_listen(EVENT_STATE_CHANGED, changed, event_filter=state_changed_filter),
        exposed_entities.async_listen_entity_updates(hass, conversation.DOMAIN, changed),
    ]


def repin_now(agent: AgentPin) -> bool:
    """Whether a house change re-pins ``agent`` at once: an agent's pin for requests
    without a device, a pin a request used since it was pinned, or one never pinned.
    The pin of a device class nobody used since is re-pinned by its next request
    (which meanwhile gets the pinned prefix and the changes as sentences)."""
    return agent.device_class is DeviceClass.NONE or agent.used or agent.pinned is None


class RepinSchedule:
    """The pending re-pin of each pin: a trailing debounce per pin."""

    def __init__(self, pins: AgentPins, repin: Callable[[AgentPin, PinReason], None]) -> None:
        """Re-pin with ``repin`` once a pin's house has been quiet."""
        self._pins = pins
        self._repin = repin
        self._debouncers: dict[PinKey, Debouncer[None]] = {}

    @callback
    def async_schedule(self, agent: AgentPin) -> None:
        """Trailing debounce (HA's ``Debouncer``): re-render once the house has been
        quiet for ``agent.debounce`` seconds.

        A steady stream of changes cannot postpone it forever: a change restarts the
        quiet period only while the re-pin would still run within
        ``REPIN_MAX_DELAY_FACTOR`` debounce periods of the first change.
        """
        if not self._pins.started:
            return  # the first pin, at start, renders the latest house
        hass = self._pins.hass
        if (debouncer := self._debouncers.get(agent.slot)) is None:
            debouncer = self._debouncers[agent.slot] = Debouncer(
                hass,
                LOGGER,
                cooldown=agent.debounce,
                immediate=False,
                function=partial(self._async_debounced, agent.slot),
            )
        debouncer.cooldown = agent.debounce
        now = hass.loop.time()
        if agent.pending_since is None:
            agent.pending_since = now
        elif now + agent.debounce <= agent.pending_since + agent.debounce * REPIN_MAX_DELAY_FACTOR:
            debouncer.async_cancel()  # restart the quiet period
        debouncer.async_schedule_call()

    @callback
    def async_cancel(self, key: PinKey) -> None:
        """The pin ``key`` is removed: its pending re-pin ends."""
        if (debouncer := self._debouncers.pop(key, None)) is not None:
            debouncer.async_shutdown()

    @callback
    def async_shutdown(self) -> None:
        """Every pending re-pin ends (the entry unloads)."""
        while self._debouncers:
            self._debouncers.popitem()[1].async_shutdown()

    @callback
    def _async_debounced(self, key: PinKey) -> None:
        if (agent := self._pins.get(key)) is None:
            return
        agent.pending_since = None
        self._repin(agent, PinReason.CHANGED)


@dataclass(eq=False)  # identity: one per entry
class EnginePolls:
    """What each poll of the engine shows of the pins: the ones to pin again."""

    _pins: AgentPins
    _coordinator: HearthCoordinator  # whose polls are looked at
    _pinner: Pinner
    _rebuilds: Rebuilds
    _checked: EngineStatus | None = field(default=None, init=False)

    @callback
    def async_polled(self) -> None:
        """After each poll: pin again what a restarted engine lost or no longer has.

        Runs once per poll result (listeners are also called for pushed values), and
        ignores agents pinned after the poll started: the poll cannot show them.
        """
        status = self._coordinator.data
        if (
            not self._pins.started
            or not self._coordinator.last_update_success
            or status is None
            or status is self._checked
        ):
            return
        self._checked = status
        for agent in self._pins:
            self._rebuilds.async_check(agent)
        restarted = (
            self._pinner.instance_id is not None and status.instance_id != self._pinner.instance_id
        )
        for agent in self._pins:
            if (reason := self._repin_reason(agent, status, restarted)) is not None:
                self._pinner.async_pin_in_background(agent, reason)

    @callback
    def _repin_reason(
        self, agent: AgentPin, status: EngineStatus, restarted: bool
    ) -> PinReason | None:
        """Why this poll pins ``agent`` again (None: it does not)."""
        if agent.lock.locked():
            return None  # a pin is in flight; the next poll looks again
        if agent.pinned_at is not None and agent.pinned_at >= status.fetched_at:
            return None
        if restarted:
            return PinReason.RESTARTED
        if not self._coordinator.backend.lists_pins:
            return None  # a primed prefix cannot be looked up
        pin = status.pins.get(agent.name)
        if (pin is None or pin.get("state") == "failed") and self._pinner.retry_due(agent):
            return PinReason.MISSING
        return None
