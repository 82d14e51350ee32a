"""The pin lifecycle of each agent's house prefix in the engine.

``PrefixManager`` pins each agent's prefix (rendered by ``prefix/render.py``) in the engine
once Home Assistant has started, and re-pins it, after a debounce, when the house
changes: the entity, device, area and floor registries, the exposed-entity settings,
entities appearing, disappearing or being renamed, and the agent's options. It re-pins
only when the rendered prefix really changed, never on a plain state change; when the
engine restarts or the pin is missing, it pins again.

Each conversation agent has one pin per device class in use (``house/device_class.py``),
an AI Task one pin (its fixed instructions). A re-pin costs what changed: each pin keeps
its *base* (the prefix last rendered in full) and tells the changes since
(``prefix/delta.py``) until the house has been quiet for ``FOLD_QUIET_S``.

The manager composes the parts of ``pins/``, one job each, and is what the rest of the
integration calls:

- ``agents.py``: the entry's pins (``AgentPin``, ``model.py``), by agent and class;
- ``events.py``: the house changes that matter, the debounce before a re-pin, and the
  engine's polls;
- ``renders.py``: each pin's rendered prefix, kept until the house changes;
- ``choice.py``: the prefix each request starts with;
- ``pinning.py``: the PUT in the engine, its retries and the folds;
- ``rebuilds.py``: the pins that replace an earlier one, counted by cause; with
  ``repairs.py``, the Repairs issues; ``history.py``, what the previous run pinned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import CALLBACK_TYPE, Event, HomeAssistant, callback
from homeassistant.helpers.start import async_at_started

from ..backend.api import HearthClient
from ..backend.coordinator import HearthCoordinator
from ..const import LOGGER
from ..house.device_class import DeviceClass
from . import repairs
from .agents import AgentPins, debounce
from .choice import PrefixChooser, request_class
from .events import EnginePolls, RepinSchedule, async_listen_house_changes, repin_now
from .history import PinHistory
from .model import AgentPin, PinReason, PinState, PrefixChoice, pin_key, pin_name, pin_state
from .pinning import Pinner, cancel_fold
from .rebuilds import Rebuilds
from .renders import PrefixRenders


class PrefixManager:
    """Pins each agent's house prefix and keeps it current."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: ConfigEntry,
        client: HearthClient,
        coordinator: HearthCoordinator,
    ) -> None:
        """Manage the pins of ``entry``'s conversation agents."""
        self.hass = hass
        self.entry = entry
        self.client = client
        self.coordinator = coordinator
        self.history = PinHistory(hass, entry.entry_id)
        self._pins = AgentPins(hass, entry, self.history)
        self._renders = PrefixRenders(hass, entry, coordinator)
        self._rebuilds = Rebuilds(self._pins)
        self._pinner = Pinner(self._pins, coordinator, self._renders, self._rebuilds)
        self._schedule = RepinSchedule(self._pins, self._pinner.async_pin_in_background)
        self._chooser = PrefixChooser(self._pins, self._renders, self._pinner, self._schedule)
        self._polls = EnginePolls(self._pins, coordinator, self._pinner, self._rebuilds)
        self._unsubs: list[CALLBACK_TYPE] = []
        # An agent's prefix for a device class from its current options, as requests get it.
        self.async_render = self._renders.async_render

    @property
    def repins(self) -> int:
        """The pins that replaced an earlier pin of their agent (``rebuilds.py``)."""
        return self._rebuilds.repins

    @property
    def repin_causes(self) -> dict[str, int]:
        """``repins`` by cause (``RebuildCause``)."""
        return self._rebuilds.repin_causes

    # ------------------------------------------------------------ lifecycle

    async def async_load(self) -> None:
        """Read what the agents pinned in the previous run (before ``async_start``)."""
        await self.history.async_load()

    @callback
    def async_start(self) -> None:
        """Listen for house changes; pin every agent once Home Assistant has started."""
        self._pins.async_add_agents()
        if self.coordinator.data is not None:
            self._pinner.instance_id = self.coordinator.data.instance_id
        self._unsubs += [
            *async_listen_house_changes(self.hass, self._async_house_changed),
            self.coordinator.async_add_listener(self._polls.async_polled),
            async_at_started(self.hass, self._async_hass_started),
        ]

    @callback
    def async_stop(self) -> None:
        """Stop listening and cancel pending re-pins."""
        while self._unsubs:
            self._unsubs.pop()()
        for agent in self._pins:
            repairs.async_delete_all(self.hass, agent.key)
            cancel_fold(agent)
        self._schedule.async_shutdown()

    async def async_remove_agents(self, subentry_ids: Iterable[str]) -> None:
        """Forget the agents of removed subentries and delete their pins in the engine.

        Their pending re-pins and retries end first. A pin in flight is waited for:
        the engine finishes a PUT it received even if the client goes away, so a DELETE
        sent before it answers would leave the pin re-created.
        """
        removed = set(subentry_ids)
        agents = self._pins.remove(removed)
        for agent in agents:
            self._pinner.async_forget(agent.slot)
            self._renders.async_forget(agent.slot)
            cancel_fold(agent)
            self._schedule.async_cancel(agent.slot)
        for agent in agents:
            async with agent.lock:
                pass  # its PUT, if one is in flight, has been answered
        await self._pinner.async_unpin(removed)

    @callback
    def _async_hass_started(self, hass: HomeAssistant) -> None:
        self._pins.started = True
        self._pins.async_add_class_pins()
        for agent in self._pins:
            self._pinner.async_pin_in_background(agent, PinReason.INITIAL)

    @callback
    def _async_house_changed(self, event: Event[Any] | None = None) -> None:
        self._renders.async_drop()
        if self._pins.started:
            self._pins.async_add_class_pins()  # e.g. a new satellite (scheduled below)
        for agent in self._pins:
            if repin_now(agent):
                self._schedule.async_schedule(agent)

    # -------------------------------------------------------------- public

    def agent(self, subentry_id: str, cls: DeviceClass = DeviceClass.NONE) -> AgentPin | None:
        """Pin bookkeeping of an agent (its pin for requests without a device by default)."""
        return self._pins.get((subentry_id, cls))

    def state(self, subentry_id: str) -> PinState | None:
        """What the UI shows of the agent's pin (None: not an agent of this entry)."""
        if (agent := self.agent(subentry_id)) is None:
            return None
        return pin_state(agent)

    async def async_prefix_for_request(
        self, subentry_id: str, device_id: str | None = None
    ) -> PrefixChoice:
        """The prefix to send now for a request from ``device_id`` (``choice.py``)."""
        return await self._chooser.async_prefix_for_request(subentry_id, device_id)

    @callback
    def async_options_changed(self, subentry_id: str) -> None:
        """An agent's options changed: re-pin after its (possibly new) debounce."""
        self._renders.async_drop()
        for agent in self._pins:
            if agent.subentry_id == subentry_id:
                agent.debounce = debounce(self.entry.subentries[subentry_id].data)
                if repin_now(agent):
                    self._schedule.async_schedule(agent)

    async def async_refresh_all(self) -> None:
        """Re-render and re-PUT every agent's prefix now (the refresh_prefix action).

        Raises ``HearthError`` if the engine refuses or cannot be reached (the first
        error, once every PUT has been answered).
        """
        self._renders.async_drop()
        results = await asyncio.gather(
            *(self._pinner.async_pin(agent, PinReason.MANUAL) for agent in list(self._pins)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def async_leave_out_examples(
        self, subentry_id: str, device_id: str | None = None
    ) -> None:
        """Render the agent's prefix for ``device_id``'s class without its worked examples
        from now on, and pin it so; returns once the pin is answered. For a turn that
        does not fit the model's context with them (``turn/context_fit.py``), as
        ``pinning.py`` does for a pin the engine refuses."""
        cls = request_class(self.hass, self.entry.subentries[subentry_id], device_id)
        if self._renders.async_leave_out_examples(pin_key(subentry_id, cls)):
            LOGGER.warning(
                "A request of %s does not fit the model's context with the worked "
                "examples: they are left out",
                pin_name(subentry_id, cls),
            )
        if (agent := self.agent(subentry_id, cls)) is not None:
            await self._pinner.async_pin(agent, PinReason.CHANGED)

    def as_diagnostics(self) -> dict[str, Any]:
        """Pin state for diagnostics (no prompt text)."""
        return {
            "repins": self.repins,
            "repin_causes": self.repin_causes,
            "upgraded": self.history.upgraded,
            "instance_id": self._pinner.instance_id,
            "agents": {
                agent.subentry_id: {
                    "pin": agent.name,
                    "state": self.state(agent.subentry_id),
                    "rebuilds": agent.rebuilds,
                    "digest": agent.digest,
                    "tokens": agent.tokens,
                    "error": agent.error,
                    "debounce": agent.debounce,
                }
                for agent in self._pins
                if agent.device_class is DeviceClass.NONE
            },
            "class_pins": {
                agent.key: {"pin": agent.name, "state": pin_state(agent), "tokens": agent.tokens}
                for agent in self._pins
                if agent.device_class is not DeviceClass.NONE
            },
        }
