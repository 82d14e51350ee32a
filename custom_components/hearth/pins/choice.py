"""The prefix each request starts with: the pinned one, or what the house renders now.

A request gets the pin of its device class (``house/device_class.py``). While a re-pin
is pending it keeps the pinned prefix, and ``turn/plan.py`` tells the model what changed
since. A class seen for the first time gets its pin; a class pin no request used since
it was pinned is re-pinned by its next request, not at every change (``events.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from homeassistant.config_entries import ConfigSubentry
from homeassistant.core import HomeAssistant

from ..const import STALE_PREFIX_MAX_S, SUBENTRY_CONVERSATION
from ..house.device_class import DeviceClass, device_class, representative
from ..prefix.value import HousePrefix
from .agents import AgentPins
from .events import RepinSchedule
from .model import AgentPin, PinReason, PrefixChoice
from .pinning import Pinner
from .renders import PrefixRenders


@dataclass(eq=False)  # identity: one per entry
class PrefixChooser:
    """Chooses the prefix of each request among an entry's pins and renders."""

    _pins: AgentPins
    _renders: PrefixRenders
    _pinner: Pinner
    _schedule: RepinSchedule  # the re-pins a choice needs

    async def async_prefix_for_request(
        self, subentry_id: str, device_id: str | None = None
    ) -> PrefixChoice:
        """The prefix to send now for a request from ``device_id`` (None: no device).

        Normally the freshly rendered prefix of the device's class, which is the pinned
        one. When the house changed and its re-pin is still pending (debounce) or
        warming, the pinned prefix is sent instead, for at most ``STALE_PREFIX_MAX_S``:
        a cold prefill of the whole house per request would stall every turn (tens of
        seconds on a CPU), and the changes are not lost: ``turn/plan.py`` states them
        in the context message and offers the new tools. A difference no event
        announced (e.g. the location name) schedules a re-pin as a safety net. A class
        seen for the first time gets its pin (this request goes without it).
        """
        hass = self._pins.hass
        cls = request_class(hass, self._pins.entry.subentries[subentry_id], device_id)
        # Rendered with the class's device, whichever device speaks (house/device_class.py).
        rendered_with = representative(hass, cls, device_id)
        prefix = await self._renders.async_render(subentry_id, cls, rendered_with)
        agent = self._agent(subentry_id, cls, device_id)
        if agent is None or (pinned := agent.pinned) is None:
            return PrefixChoice(prefix, prefix, None)
        agent.used = True
        return self._choose(agent, pinned, self._renders.told(agent, prefix))

    def _agent(self, subentry_id: str, cls: DeviceClass, device_id: str | None) -> AgentPin | None:
        """The pin of a request of ``cls`` (None: not an agent of the entry), added and
        pinned where the class is new; a class pin renders with the latest device."""
        agent = self._pins.get((subentry_id, cls))
        if agent is None and self._pins.get((subentry_id, DeviceClass.NONE)) is not None:
            agent = self._pins.add(subentry_id, cls, device_id)
            if self._pins.started:
                self._pinner.async_pin_in_background(agent, PinReason.INITIAL)
        if agent is not None and cls is not DeviceClass.NONE:
            agent.device_id = device_id
        return agent

    def _choose(self, agent: AgentPin, pinned: HousePrefix, prefix: HousePrefix) -> PrefixChoice:
        """``agent``'s ``pinned`` prefix or ``prefix``, what it pins for the house now:
        the pinned one while the house changed no longer than ``STALE_PREFIX_MAX_S`` ago
        (its re-pin scheduled) and the new one was not refused."""
        if prefix.digest == pinned.digest:
            agent.stale_since = None
            return PrefixChoice(prefix, prefix, agent.name)
        now = time.monotonic()
        if agent.stale_since is None:
            agent.stale_since = now
        if agent.pending_since is None and not agent.lock.locked():
            self._schedule.async_schedule(agent)
        usable = prefix.digest != agent.blocked_digest
        if usable and now - agent.stale_since <= STALE_PREFIX_MAX_S:
            return PrefixChoice(pinned, prefix, agent.name)
        return PrefixChoice(prefix, prefix, None)


def request_class(
    hass: HomeAssistant, subentry: ConfigSubentry, device_id: str | None
) -> DeviceClass:
    """The device class whose pin a request of ``subentry`` from ``device_id`` gets (an
    AI Task has its one pin)."""
    if subentry.subentry_type != SUBENTRY_CONVERSATION:
        return DeviceClass.NONE
    return device_class(hass, device_id)
