"""Rebuilds: the pins that replace an earlier pin of their agent, counted by cause.

A rebuild makes the engine prefill an agent's house again, so the sensors and
diagnostics count them (``repins``, ``repin_causes``) and a pin rebuilt
``REBUILD_ISSUE_COUNT`` times within ``REBUILD_ISSUE_WINDOW`` raises a Repairs issue
(``repairs.py``), cleared once the window holds fewer. ``PinHistory`` makes the first
pin after a Home Assistant restart or upgrade count when it replaced an earlier run's
pin.
"""

from __future__ import annotations

from homeassistant.core import callback
from homeassistant.util import dt as dt_util

from ..const import REBUILD_ISSUE_COUNT, REBUILD_ISSUE_WINDOW
from ..prefix.value import HousePrefix
from . import repairs
from .agents import AgentPins
from .model import AgentPin, PinReason, RebuildCause


class Rebuilds:
    """The rebuilds of an entry's pins, and the "rebuilt too often" issues."""

    def __init__(self, pins: AgentPins) -> None:
        """None counted yet."""
        self._pins = pins
        self.repins = 0
        self.repin_causes: dict[str, int] = {cause.value: 0 for cause in RebuildCause}

    def cause(
        self, agent: AgentPin, prefix: HousePrefix, reason: PinReason, changed: bool
    ) -> RebuildCause | None:
        """Why this PUT replaces an earlier pin of the agent (None: it does not).

        In this run: the prefix changed, or the engine lost the pin. The first pin of
        this run counts only if it differs from what the previous run pinned: Home
        Assistant was upgraded, or the house or options changed while it was down. The
        same prefix PUT again after a restart is found cached by the engine: no rebuild.
        """
        if agent.digest is not None:
            if reason in (PinReason.FOLD, PinReason.FITTED):
                return None  # the same house, rendered anew: upkeep, not a change
            if reason is PinReason.RESTARTED:
                return RebuildCause.ENGINE_RESTARTED
            if reason is PinReason.MISSING:
                return RebuildCause.MISSING
            return RebuildCause.CHANGED if changed else None
        history = self._pins.history
        previous = history.previous(agent.key)
        if reason is not PinReason.INITIAL or previous in (None, prefix.digest):
            return None
        return RebuildCause.HA_UPGRADE if history.upgraded else RebuildCause.HA_RESTART

    @callback
    def async_count(self, agent: AgentPin, cause: RebuildCause) -> None:
        """``agent`` was rebuilt for ``cause``."""
        self.repins += 1
        self.repin_causes[cause.value] += 1
        agent.rebuilds += 1
        agent.rebuilt_at.append(dt_util.utcnow())
        self.async_check(agent)

    @callback
    def async_check(self, agent: AgentPin) -> None:
        """Raise or clear the "rebuilt too often" issue from the rebuilds in the window."""
        horizon = dt_util.utcnow() - REBUILD_ISSUE_WINDOW
        while agent.rebuilt_at and agent.rebuilt_at[0] < horizon:
            agent.rebuilt_at.popleft()
        if len(agent.rebuilt_at) >= REBUILD_ISSUE_COUNT:
            repairs.async_pin_rebuilt_often(
                self._pins.hass,
                agent.key,
                self._pins.title(agent),
                len(agent.rebuilt_at),
                REBUILD_ISSUE_WINDOW,
            )
        else:
            repairs.async_delete(self._pins.hass, repairs.PIN_REBUILT_OFTEN, agent.key)
