"""What Hearth keeps of each pin: its name, state, bookkeeping and why it was (re)pinned.

Types only (plus the pin's UI state), shared by the parts of ``pins/``, the sensors and
the tests; the lifecycle itself is ``pins/manager.py``'s.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from homeassistant.core import CALLBACK_TYPE

from ..const import DOMAIN
from ..house.device_class import DeviceClass
from ..prefix.value import HousePrefix


@dataclass(frozen=True, slots=True)
class PrefixChoice:
    """The prefix a request starts with, the one rendered now, and the pin it is."""

    sent: HousePrefix  # the pinned prefix while its re-pin is pending, else ``fresh``
    fresh: HousePrefix  # what HA's house and options render now
    pin: str | None  # the engine pin ``sent`` is (None: not pinned, a cold prefill)

    @property
    def stale(self) -> bool:
        """Whether the house or options changed since ``sent`` was rendered."""
        return self.sent.digest != self.fresh.digest


# A pin among the entry's: its agent (subentry id) and device class.
type PinKey = tuple[str, DeviceClass]


def pin_name(subentry_id: str, cls: DeviceClass = DeviceClass.NONE) -> str:
    """Engine pin name of an agent's class: stable across HA restarts (from the subentry id)."""
    return f"{DOMAIN}.{pin_key(subentry_id, cls)}"


def pin_key(subentry_id: str, cls: DeviceClass = DeviceClass.NONE) -> str:
    """Key of a pin in the history and in Repairs issue ids (the subentry id for no device)."""
    return subentry_id if cls is DeviceClass.NONE else f"{subentry_id}.{cls}"


class PinReason(StrEnum):
    """Why a prefix is (re)pinned."""

    INITIAL = "initial"  # first pin of the agent since the entry loaded
    CHANGED = "changed"  # the rendered prefix changed (registry, exposure, options)
    RESTARTED = "restarted"  # the engine restarted (new instance_id)
    MISSING = "missing"  # the engine no longer has the pin
    MANUAL = "manual"  # the refresh_prefix action
    FOLD = "fold"  # the house has been quiet: its told changes are rendered in full
    FITTED = "fitted"  # the house fitted again to the model's context (prefix/budget.py)


class PinState(StrEnum):
    """What the UI shows of an agent's pin."""

    READY = "ready"  # the engine holds the agent's prefix
    WARMING = "warming"  # not pinned yet, or a PUT is in flight (the old pin still serves)
    FAILED = "failed"  # the last PUT failed (engine down, busy...); retried
    REFUSED = "refused"  # the engine refused it for good (e.g. larger than the KV budget)


class RebuildCause(StrEnum):
    """Why a pin replaced an earlier pin of the same agent (counted as a rebuild)."""

    CHANGED = "changed"  # the house or the agent's options changed
    ENGINE_RESTARTED = "engine_restarted"  # the engine restarted and lost it
    MISSING = "missing"  # the engine no longer had it
    HA_RESTART = "ha_restart"  # the first pin after an HA restart differs from the last run's
    HA_UPGRADE = "ha_upgrade"  # ... after Home Assistant was upgraded


@dataclass
class AgentPin:
    """Pin bookkeeping of one agent (subentry) and device class."""

    subentry_id: str
    debounce: float
    device_class: DeviceClass = DeviceClass.NONE
    device_id: str | None = None  # the device of the class it is rendered with
    digest: str | None = None  # digest pinned in the engine (None: not pinned yet)
    tokens: int | None = None
    error: str | None = None
    refused: bool = False  # the last PUT was refused for good
    putting: bool = False  # a PUT is in flight
    rebuilds: int = 0
    rebuilt_at: deque[datetime] = field(default_factory=deque)  # within the issue window
    blocked_digest: str | None = None  # refused by the engine for good (e.g. too large)
    blocked_instance: str | None = None  # ... by this engine instance (a restart retries)
    pinned: HousePrefix | None = None  # the prefix the engine holds for this agent
    # The prefix last rendered in full: ``pinned`` keeps its bytes and tells the changes
    # since (prefix/delta.py) until it is folded.
    base: HousePrefix | None = None
    used: bool = False  # a request used this pin since it was last pinned
    stale_since: float | None = None  # time.monotonic() a request first saw a newer house
    pinned_at: float | None = None  # time.monotonic() of the last successful PUT
    pending_since: float | None = None
    fold_timer: CALLBACK_TYPE | None = None  # folds the told changes once the house is quiet
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def name(self) -> str:
        """Engine pin name."""
        return pin_name(self.subentry_id, self.device_class)

    @property
    def key(self) -> str:
        """History and Repairs key."""
        return pin_key(self.subentry_id, self.device_class)

    @property
    def slot(self) -> PinKey:
        """The pin among the entry's pins (``AgentPins``)."""
        return (self.subentry_id, self.device_class)


def pin_state(agent: AgentPin) -> PinState:
    """What the UI shows of a pin."""
    if agent.putting:
        return PinState.WARMING
    if agent.refused:
        return PinState.REFUSED
    if agent.error is not None:
        return PinState.FAILED
    return PinState.WARMING if agent.digest is None else PinState.READY
