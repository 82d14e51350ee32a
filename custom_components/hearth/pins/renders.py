"""What each pin renders: its prefix, kept until the house changes, and told changes.

``PrefixRenders`` renders an agent's prefix for a device class (``prefix/render.py``)
once per house: the render is kept until an event that schedules a re-pin (a registry,
exposure, options or configuration change) drops them all. A pin with a *base* (the
prefix last rendered in full) pins the base's bytes and the changes since
(``prefix/delta.py``) until it is folded; that composition is kept too.

It also keeps what the house is fitted to: the room for it in the model's context
(``prefix/budget.py``), and the pins that render without their worked examples because
the house prompt does not fit the context with them (``prefix/examples.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant, callback

from ..backend.coordinator import HearthCoordinator
from ..const import CONF_EXAMPLES
from ..house.device_class import DeviceClass, representative
from ..prefix.budget import HouseBudget
from ..prefix.delta import compose
from ..prefix.render import async_render_prefix, render_options
from ..prefix.value import HousePrefix
from .model import AgentPin, PinKey, pin_key


class PrefixRenders:
    """The rendered prefixes of an entry's pins, and what the house is fitted to."""

    def __init__(
        self, hass: HomeAssistant, entry: ConfigEntry, coordinator: HearthCoordinator
    ) -> None:
        """Nothing rendered yet."""
        self.hass = hass
        self.entry = entry
        self.coordinator = coordinator
        # The room for the house in the model's context (prefix/budget.py), one model.
        self.budget = HouseBudget()
        # Pins (keys) whose house prompt does not fit the model's context with the
        # worked examples (prefix/examples.py): they render without them from then on.
        self._without_examples: set[str] = set()
        # Rendered prefixes by agent and device class, dropped by every event that
        # schedules a re-pin (a state change drops nothing); ``_generation`` counts the
        # drops, so a render that an event overtook is not kept.
        self._renders: dict[PinKey, tuple[Mapping[str, Any], HousePrefix]] = {}
        # The prefix each pin tells for its base and the kept render (see ``told``).
        self._composed: dict[PinKey, tuple[HousePrefix, HousePrefix, HousePrefix]] = {}
        self._generation = 0

    async def async_render(
        self,
        subentry_id: str,
        cls: DeviceClass = DeviceClass.NONE,
        device_id: str | None = None,
    ) -> HousePrefix:
        """An agent's prefix for a device class from its current options.

        Rendered once per house: kept until an event that schedules a re-pin (a
        registry, exposure, options or configuration change) drops it. Any device of
        the class renders the same prefix (``house/device_class.py``).
        """
        key = (subentry_id, cls)
        options = self.entry.subentries[subentry_id].data
        cached = self._renders.get(key)
        if cached is not None and cached[0] == options:  # options read before the event
            return cached[1]
        generation = self._generation
        prefix = await self._async_render_now(subentry_id, cls, device_id)
        if generation == self._generation and subentry_id in self.entry.subentries:
            self._renders[key] = (dict(options), prefix)
        return prefix

    async def async_render_pin(self, agent: AgentPin, fold: bool = False) -> HousePrefix | None:
        """Render what ``agent`` pins (None: no device of its class is left): its base
        and the changes since, or (``fold``) the house in full."""
        device_id = None
        if agent.device_class is not DeviceClass.NONE:
            device_id = representative(self.hass, agent.device_class, agent.device_id)
            if device_id is None:
                return None
            agent.device_id = device_id
        full = await self.async_render(agent.subentry_id, agent.device_class, device_id)
        return full if fold else self.told(agent, full)

    def told(self, agent: AgentPin, full: HousePrefix) -> HousePrefix:
        """What ``agent`` pins for the house rendered as ``full``: its base and the
        changes since (``prefix/delta.py``), or ``full`` where they cannot be told.
        Kept while its base and the render are the same (a turn composes nothing)."""
        if agent.base is None:
            return full
        kept = self._composed.get(agent.slot)
        if kept is not None and kept[0] is agent.base and kept[1] is full:
            return kept[2]
        told = compose(agent.base, full)
        self._composed[agent.slot] = (agent.base, full, told)
        return told

    @callback
    def async_drop(self) -> None:
        """The house or an agent's options changed: render every pin again."""
        self._renders.clear()
        self._composed.clear()
        self._generation += 1

    @callback
    def async_forget(self, key: PinKey) -> None:
        """The pin ``key`` is removed: drop what was rendered for it."""
        self._renders.pop(key, None)
        self._composed.pop(key, None)

    @callback
    def async_leave_out_examples(self, key: str) -> bool:
        """Render the pin ``key`` (``pin_key``) without its worked examples from now on
        (every render is dropped); returns whether it rendered them until now."""
        had_examples = key not in self._without_examples
        self._without_examples.add(key)
        self.async_drop()
        return had_examples

    def refit_due(self, tokens: int | None, pinned: HousePrefix) -> bool:
        """After a PUT of ``pinned``, ``tokens`` long: learn its tokens per character;
        returns whether the house was fitted (or is over its budget) with another rate."""
        house = pinned.house
        limit = self.budget.house_tokens
        over = limit is not None and tokens is not None and tokens > limit
        moved = self.budget.learn(tokens, len(pinned.data))
        return moved and bool(over or (house and house.left_out))

    async def _async_render_now(
        self, subentry_id: str, cls: DeviceClass, device_id: str | None
    ) -> HousePrefix:
        subentry = self.entry.subentries[subentry_id]
        options = render_options(subentry.subentry_type, subentry.data)
        if pin_key(subentry_id, cls) in self._without_examples:
            options = {**options, CONF_EXAMPLES: False}
        self.budget.context = self.coordinator.context_length
        return await async_render_prefix(
            self.hass, options, cls, device_id, max_chars=self.budget.max_chars
        )
