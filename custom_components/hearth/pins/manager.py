"""The pin lifecycle of each agent's house prefix in the engine.

``PrefixManager`` pins each agent's prefix (rendered by ``prefix/render.py``) in the engine when
the entry loads and re-pins it, after a debounce, when the house changes: the entity,
device, area and floor registries, the exposed-entity settings, entities appearing,
disappearing or being renamed, and the agent's options. It re-pins only when the
rendered prefix really changed (a SHA-256 of its bytes), never on a plain state change.
When the engine restarts (its ``instance_id`` changes) or the pin is missing, it pins
again. A server without the pin API (llama.cpp, vLLM, SGLang) gets a priming request
instead of each pin (``backend/priming.py``), at the same moments.

Each conversation agent has one pin per device class in use (``house/device_class.py``): no
device, a satellite without timers, one with timers, each rendered with the lines and
tools HA gives that class. An AI Task has one pin (its fixed instructions). A request
gets the pin of its class; while a re-pin is pending it keeps the pinned prefix, and
``turn/plan.py`` tells the model what changed since. A class pin no request used
since it was pinned is re-pinned by its next request, not at every change.

A re-pin costs what changed: each pin keeps its *base* (the prefix last rendered in
full) and re-pins the base's bytes plus a closing message that tells the changes since
(``prefix/delta.py``), so the engine prefills that message only. Once the house has been
quiet for ``FOLD_QUIET_S`` (and on the refresh action) the house is rendered in full
again; a change that cannot be told is rendered in full at once.

It also keeps what the UI shows of each pin: its state (``PinState``), its tokens and
last error, the rebuilds by cause (``PinHistory`` makes the first pin after a Home
Assistant restart or upgrade count when it replaced an earlier run's pin), and the
Repairs issues of a refused pin or one rebuilt too often (``repairs.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant import exposed_entities
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import EVENT_CORE_CONFIG_UPDATE, EVENT_STATE_CHANGED
from homeassistant.core import CALLBACK_TYPE, Event, HomeAssistant, callback
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers.debounce import Debouncer
from homeassistant.helpers.event import async_call_later
from homeassistant.helpers.start import async_at_started
from homeassistant.util import dt as dt_util

from ..backend.api import HearthClient, HearthError
from ..backend.coordinator import EngineStatus, HearthCoordinator
from ..const import (
    CONF_EXAMPLES,
    CONF_REPIN_DEBOUNCE,
    DEFAULT_REPIN_DEBOUNCE,
    DOMAIN,
    FOLD_QUIET_S,
    LOGGER,
    REBUILD_ISSUE_COUNT,
    REBUILD_ISSUE_WINDOW,
    REPIN_MAX_DELAY_FACTOR,
    SCAN_INTERVAL,
    STALE_PREFIX_MAX_S,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
)
from ..errors import BACKEND_ERRORS, describe, http_status, is_context_exceeded
from ..house.device_class import DeviceClass, classes_in_use, device_class, representative
from ..prefix.budget import HouseBudget
from ..prefix.delta import compose
from ..prefix.render import async_render_prefix, render_options
from ..prefix.value import HousePrefix
from . import repairs
from .events import device_registry_filter, entity_registry_filter, state_changed_filter
from .history import PinHistory
from .model import (
    AgentPin,
    PinReason,
    PinState,
    PrefixChoice,
    RebuildCause,
    pin_key,
    pin_name,
    pin_state,
)

__all__ = ["PinState", "PrefixManager", "pin_key", "pin_name"]  # re-exported from pin_model

# Engine answers to a PUT that the same prefix would get again (invalid, too large).
_REFUSED_FOR_GOOD = frozenset({400, 413, 422})
# A failed pin is retried at a later poll: 1, 2, 4... polls after the failure, at most
# this far apart.
RETRY_MAX_S = 300.0
# Fits of a house the server found too long for its context, before the worked
# examples are left out (prefix/budget.py).
MAX_REFITS = 2

type _PinKey = tuple[str, DeviceClass]


@dataclass
class _Retry:
    """The failed attempts of a pin in a row, and the polls to let pass before the next."""

    failures: int = 0
    wait_polls: int = 0


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
        self.repins = 0
        self.repin_causes: dict[str, int] = {cause.value: 0 for cause in RebuildCause}
        self.history = PinHistory(hass, entry.entry_id)
        self._pins: dict[tuple[str, DeviceClass], AgentPin] = {}
        # Agents (pin keys) whose house prompt does not fit the model's context with the
        # worked examples (prefix/examples.py): they render without them from then on.
        self._without_examples: set[str] = set()
        # The room for the house in the model's context (prefix/budget.py), one model.
        self.budget = HouseBudget()
        self._instance_id: str | None = None
        self._checked: EngineStatus | None = None
        self._started = False
        self._unsubs: list[CALLBACK_TYPE] = []
        self._debouncers: dict[_PinKey, Debouncer[None]] = {}
        self._retries: dict[_PinKey, _Retry] = {}
        # Rendered prefixes by agent and device class, dropped by every event that
        # schedules a re-pin (a state change drops nothing); ``_generation`` counts the
        # drops, so a render that an event overtook is not kept.
        self._renders: dict[_PinKey, tuple[Mapping[str, Any], HousePrefix]] = {}
        # The prefix each pin tells for its base and the kept render (see ``_told``).
        self._composed: dict[_PinKey, tuple[HousePrefix, HousePrefix, HousePrefix]] = {}
        self._generation = 0

    # ------------------------------------------------------------ lifecycle

    async def async_load(self) -> None:
        """Read what the agents pinned in the previous run (before ``async_start``)."""
        await self.history.async_load()

    @callback
    def async_start(self) -> None:
        """Listen for house changes; pin every agent once Home Assistant has started."""
        for subentry in self.entry.subentries.values():
            if subentry.subentry_type in (SUBENTRY_CONVERSATION, SUBENTRY_AI_TASK):
                self._pins[(subentry.subentry_id, DeviceClass.NONE)] = AgentPin(
                    subentry.subentry_id,
                    _debounce(subentry.data),
                    base=self.history.base(subentry.subentry_id),
                )
        if self.coordinator.data is not None:
            self._instance_id = self.coordinator.data.instance_id
        bus = self.hass.bus
        self._unsubs += [
            bus.async_listen(
                er.EVENT_ENTITY_REGISTRY_UPDATED,
                self._async_house_changed,
                event_filter=entity_registry_filter,
            ),
            bus.async_listen(
                dr.EVENT_DEVICE_REGISTRY_UPDATED,
                self._async_house_changed,
                event_filter=device_registry_filter,
            ),
            bus.async_listen(ar.EVENT_AREA_REGISTRY_UPDATED, self._async_house_changed),
            bus.async_listen(fr.EVENT_FLOOR_REGISTRY_UPDATED, self._async_house_changed),
            bus.async_listen(EVENT_CORE_CONFIG_UPDATE, self._async_house_changed),
            bus.async_listen(
                EVENT_STATE_CHANGED,
                self._async_house_changed,
                event_filter=state_changed_filter,
            ),
            exposed_entities.async_listen_entity_updates(
                self.hass, conversation.DOMAIN, self._async_house_changed
            ),
            self.coordinator.async_add_listener(self._async_engine_updated),
            async_at_started(self.hass, self._async_hass_started),
        ]

    @callback
    def async_stop(self) -> None:
        """Stop listening and cancel pending re-pins."""
        while self._unsubs:
            self._unsubs.pop()()
        for agent in self._pins.values():
            repairs.async_delete_all(self.hass, agent.key)
            _cancel_fold(agent)
        while self._debouncers:
            self._debouncers.popitem()[1].async_shutdown()

    async def async_remove_agents(self, subentry_ids: Iterable[str]) -> None:
        """Forget the agents of removed subentries and delete their pins in the engine.

        Their pending re-pins and retries end first. A pin in flight is waited for:
        the engine finishes a PUT it received even if the client goes away, so a DELETE
        sent before it answers would leave the pin re-created.
        """
        removed = set(subentry_ids)
        agents = [agent for key, agent in self._pins.items() if key[0] in removed]
        for agent in agents:
            key = (agent.subentry_id, agent.device_class)
            del self._pins[key]
            self._retries.pop(key, None)
            self._renders.pop(key, None)
            self._composed.pop(key, None)
            _cancel_fold(agent)
            if (debouncer := self._debouncers.pop(key, None)) is not None:
                debouncer.async_shutdown()
        for agent in agents:
            async with agent.lock:
                pass  # its PUT, if one is in flight, has been answered
        for subentry_id in removed:
            for cls in DeviceClass:
                try:
                    await self.coordinator.backend.async_unpin(pin_name(subentry_id, cls))
                except BACKEND_ERRORS as err:
                    LOGGER.debug("Could not delete the pin of %s (%s): %s", subentry_id, cls, err)

    @callback
    def _async_hass_started(self, hass: HomeAssistant) -> None:
        self._started = True
        self._async_add_class_pins()
        for agent in self._pins.values():
            self._async_pin_in_background(agent, PinReason.INITIAL)

    @callback
    def _async_add_class_pins(self) -> list[AgentPin]:
        """Add a pin for each device class the house's satellites have (new ones only)."""
        added = []
        in_use = classes_in_use(self.hass) - {DeviceClass.NONE}
        for subentry_id, subentry in self.entry.subentries.items():
            if subentry.subentry_type != SUBENTRY_CONVERSATION:
                continue
            for cls in sorted(in_use):
                if (subentry_id, cls) not in self._pins:
                    added.append(self._add_pin(subentry_id, cls, None))
        return added

    def _add_pin(self, subentry_id: str, cls: DeviceClass, device_id: str | None) -> AgentPin:
        agent = AgentPin(
            subentry_id,
            _debounce(self.entry.subentries[subentry_id].data),
            device_class=cls,
            device_id=device_id,
            base=self.history.base(pin_key(subentry_id, cls)),
        )
        self._pins[(subentry_id, cls)] = agent
        return agent

    # -------------------------------------------------------------- public

    def agent(self, subentry_id: str, cls: DeviceClass = DeviceClass.NONE) -> AgentPin | None:
        """Pin bookkeeping of an agent (its pin for requests without a device by default)."""
        return self._pins.get((subentry_id, cls))

    def state(self, subentry_id: str) -> PinState | None:
        """What the UI shows of the agent's pin (None: not an agent of this entry)."""
        if (agent := self._pins.get((subentry_id, DeviceClass.NONE))) is None:
            return None
        return pin_state(agent)

    async def _async_render_pin(self, agent: AgentPin, fold: bool = False) -> HousePrefix | None:
        """Render what ``agent`` pins (None: no device of its class is left): its base
        and the changes since, or (``fold``) the house in full."""
        device_id = None
        if agent.device_class is not DeviceClass.NONE:
            device_id = representative(self.hass, agent.device_class, agent.device_id)
            if device_id is None:
                return None
            agent.device_id = device_id
        full = await self.async_render(agent.subentry_id, agent.device_class, device_id)
        return full if fold else self._told(agent, full)

    def _told(self, agent: AgentPin, full: HousePrefix) -> HousePrefix:
        """What ``agent`` pins for the house rendered as ``full``: its base and the
        changes since (``prefix/delta.py``), or ``full`` where they cannot be told.
        Kept while its base and the render are the same (a turn composes nothing)."""
        if agent.base is None:
            return full
        key = (agent.subentry_id, agent.device_class)
        kept = self._composed.get(key)
        if kept is not None and kept[0] is agent.base and kept[1] is full:
            return kept[2]
        told = compose(agent.base, full)
        self._composed[key] = (agent.base, full, told)
        return told

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

    @callback
    def _async_drop_renders(self) -> None:
        self._renders.clear()
        self._composed.clear()
        self._generation += 1

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
        subentry = self.entry.subentries[subentry_id]
        cls = DeviceClass.NONE
        if subentry.subentry_type == SUBENTRY_CONVERSATION:
            cls = device_class(self.hass, device_id)
        # Rendered with the class's device, whichever device speaks (house/device_class.py).
        rendered_with = representative(self.hass, cls, device_id)
        prefix = await self.async_render(subentry_id, cls, rendered_with)
        agent = self._pins.get((subentry_id, cls))
        if agent is None and (subentry_id, DeviceClass.NONE) in self._pins:
            agent = self._add_pin(subentry_id, cls, device_id)
            if self._started:
                self._async_pin_in_background(agent, PinReason.INITIAL)
        if agent is not None and cls is not DeviceClass.NONE:
            agent.device_id = device_id
        if agent is None or agent.pinned is None:
            return PrefixChoice(prefix, prefix, None)
        agent.used = True
        prefix = self._told(agent, prefix)
        if prefix.digest == agent.pinned.digest:
            agent.stale_since = None
            return PrefixChoice(prefix, prefix, agent.name)
        now = time.monotonic()
        if agent.stale_since is None:
            agent.stale_since = now
        if agent.pending_since is None and not agent.lock.locked():
            self._async_schedule(agent)
        usable = prefix.digest != agent.blocked_digest
        if usable and now - agent.stale_since <= STALE_PREFIX_MAX_S:
            return PrefixChoice(agent.pinned, prefix, agent.name)
        return PrefixChoice(prefix, prefix, None)

    @callback
    def async_options_changed(self, subentry_id: str) -> None:
        """An agent's options changed: re-pin after its (possibly new) debounce."""
        self._async_drop_renders()
        for (pinned_id, _cls), agent in self._pins.items():
            if pinned_id == subentry_id:
                agent.debounce = _debounce(self.entry.subentries[subentry_id].data)
                if _repin_now(agent):
                    self._async_schedule(agent)

    async def async_refresh_all(self) -> None:
        """Re-render and re-PUT every agent's prefix now (the refresh_prefix action).

        Raises ``HearthError`` if the engine refuses or cannot be reached (the first
        error, once every PUT has been answered).
        """
        self._async_drop_renders()
        results = await asyncio.gather(
            *(self._async_pin(agent, PinReason.MANUAL) for agent in list(self._pins.values())),
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
        ``_async_put_fitting`` does for a pin the engine refuses."""
        subentry = self.entry.subentries[subentry_id]
        cls = DeviceClass.NONE
        if subentry.subentry_type == SUBENTRY_CONVERSATION:
            cls = device_class(self.hass, device_id)
        if pin_key(subentry_id, cls) not in self._without_examples:
            LOGGER.warning(
                "A request of %s does not fit the model's context with the worked "
                "examples: they are left out",
                pin_name(subentry_id, cls),
            )
        self._without_examples.add(pin_key(subentry_id, cls))
        self._async_drop_renders()
        if (agent := self._pins.get((subentry_id, cls))) is not None:
            await self._async_pin(agent, PinReason.CHANGED)

    def as_diagnostics(self) -> dict[str, Any]:
        """Pin state for diagnostics (no prompt text)."""
        return {
            "repins": self.repins,
            "repin_causes": self.repin_causes,
            "upgraded": self.history.upgraded,
            "instance_id": self._instance_id,
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
                for agent in self._pins.values()
                if agent.device_class is DeviceClass.NONE
            },
            "class_pins": {
                agent.key: {"pin": agent.name, "state": pin_state(agent), "tokens": agent.tokens}
                for agent in self._pins.values()
                if agent.device_class is not DeviceClass.NONE
            },
        }

    # --------------------------------------------------------- invalidation

    @callback
    def _async_house_changed(self, event: Event[Any] | None = None) -> None:
        self._async_drop_renders()
        if self._started:
            self._async_add_class_pins()  # e.g. a new satellite (scheduled below)
        for agent in self._pins.values():
            if _repin_now(agent):
                self._async_schedule(agent)

    @callback
    def _async_schedule(self, agent: AgentPin) -> None:
        """Trailing debounce (HA's ``Debouncer``): re-render once the house has been
        quiet for ``agent.debounce`` seconds.

        A steady stream of changes cannot postpone it forever: a change restarts the
        quiet period only while the re-pin would still run within
        ``REPIN_MAX_DELAY_FACTOR`` debounce periods of the first change.
        """
        if not self._started:
            return  # the first pin, at start, renders the latest house
        key = (agent.subentry_id, agent.device_class)
        if (debouncer := self._debouncers.get(key)) is None:
            debouncer = self._debouncers[key] = Debouncer(
                self.hass,
                LOGGER,
                cooldown=agent.debounce,
                immediate=False,
                function=partial(self._async_debounced, key),
            )
        debouncer.cooldown = agent.debounce
        now = self.hass.loop.time()
        if agent.pending_since is None:
            agent.pending_since = now
        elif now + agent.debounce <= agent.pending_since + agent.debounce * REPIN_MAX_DELAY_FACTOR:
            debouncer.async_cancel()  # restart the quiet period
        debouncer.async_schedule_call()

    @callback
    def _async_debounced(self, key: _PinKey) -> None:
        if (agent := self._pins.get(key)) is None:
            return
        agent.pending_since = None
        self._async_pin_in_background(agent, PinReason.CHANGED)

    @callback
    def _async_engine_updated(self) -> None:
        """After each poll: pin again what a restarted engine lost or no longer has.

        Runs once per poll result (listeners are also called for pushed values), and
        ignores agents pinned after the poll started: the poll cannot show them.
        """
        status = self.coordinator.data
        if (
            not self._started
            or not self.coordinator.last_update_success
            or status is None
            or status is self._checked
        ):
            return
        self._checked = status
        for agent in self._pins.values():
            self._async_check_rebuilds(agent)
        restarted = self._instance_id is not None and status.instance_id != self._instance_id
        for agent in self._pins.values():
            if agent.lock.locked():
                continue  # a pin is in flight; the next poll looks again
            if agent.pinned_at is not None and agent.pinned_at >= status.fetched_at:
                continue
            pin = status.pins.get(agent.name)
            if restarted:
                self._async_pin_in_background(agent, PinReason.RESTARTED)
            elif not self.coordinator.backend.lists_pins:
                continue  # a primed prefix cannot be looked up
            elif (pin is None or pin.get("state") == "failed") and self._retry_due(agent):
                self._async_pin_in_background(agent, PinReason.MISSING)

    @callback
    def _retry_due(self, agent: AgentPin) -> bool:
        """Whether a failed pin is retried at this poll (exponential backoff in polls)."""
        retry = self._retries.get((agent.subentry_id, agent.device_class))
        if retry is None or retry.wait_polls <= 0:
            return True
        retry.wait_polls -= 1
        return retry.wait_polls <= 0

    # ------------------------------------------------------------- pinning

    @callback
    def _async_pin_in_background(self, agent: AgentPin, reason: PinReason) -> None:
        self.entry.async_create_background_task(
            self.hass, self._async_pin(agent, reason), f"{DOMAIN} pin {agent.name} ({reason})"
        )

    async def _async_pin(self, agent: AgentPin, reason: PinReason) -> bool:
        """Render the prefix and PUT it if needed; returns True if it was PUT.

        A change is PUT only if the digest differs from the pinned one. A restarted
        engine, a missing pin and the refresh action PUT it regardless. ``repins``
        counts the PUTs that replace an earlier pin of this agent (see ``_cause``).
        """
        async with agent.lock:
            if self._pins.get((agent.subentry_id, agent.device_class)) is not agent:
                return False  # its subentry was removed meanwhile
            fold = reason in (PinReason.FOLD, PinReason.MANUAL)
            prefix = await self._async_render_pin(agent, fold=fold)
            if prefix is None:
                return False  # no device of its class is left to render it with
            changed = prefix.digest != agent.digest
            if reason in (PinReason.CHANGED, PinReason.FOLD, PinReason.FITTED) and not changed:
                return False
            instance_id = self.coordinator.data.instance_id if self.coordinator.data else None
            # Refused for good by this engine: retried only by the refresh action, or by a
            # restarted engine (perhaps given a bigger KV budget).
            blocked = (
                prefix.digest == agent.blocked_digest and instance_id == agent.blocked_instance
            )
            if reason is not PinReason.MANUAL and blocked:
                return False
            agent.putting = True
            self.coordinator.async_update_listeners()
            try:
                info, prefix = await self._async_put_fitting(agent, prefix)
            except BACKEND_ERRORS as err:
                self._async_pin_failed(agent, prefix, instance_id, err)
                if reason is PinReason.MANUAL:
                    raise
                return False
            finally:
                agent.putting = False
                self.coordinator.async_update_listeners()
            cause = self._cause(agent, prefix, reason, changed)
            agent.digest = prefix.digest
            agent.pinned = prefix
            agent.used = False
            self._async_keep_base(agent, prefix)
            agent.stale_since = None
            agent.pinned_at = time.monotonic()
            agent.tokens = _int_or_none(info.get("tokens"))
            self._async_fitted(agent, prefix, reason)
            agent.error = None
            agent.refused = False
            agent.blocked_digest = None
            if self._retries.pop((agent.subentry_id, agent.device_class), None) is not None:
                LOGGER.info("The prefix %s is pinned again", agent.name)
            if instance_id:
                self._instance_id = instance_id
            repairs.async_delete(self.hass, repairs.PIN_REFUSED, agent.key)
            if cause is not None:
                self._async_count_rebuild(agent, cause)
            LOGGER.debug(
                "Pinned %s (%s): %s tokens, digest %s",
                agent.name,
                reason,
                agent.tokens,
                prefix.digest[:12],
            )
            await self.history.async_record(agent.key, prefix.digest, agent.base)
        self.coordinator.async_update_listeners()
        return True

    async def _async_put_fitting(
        self, agent: AgentPin, prefix: HousePrefix
    ) -> tuple[Mapping[str, Any], HousePrefix]:
        """``_async_put``, and where the house prompt is longer than the model's
        context: fitted again counting more carefully (``MAX_REFITS`` times, where the
        context is known), then once more without the worked examples (what was pinned
        is returned)."""
        refits = 0
        while True:
            try:
                return await self._async_put(agent, prefix), prefix
            except BACKEND_ERRORS as err:
                if not is_context_exceeded(err):
                    raise
                if self.budget.context is None or refits == MAX_REFITS:
                    if not prefix.examples:
                        raise
                    break
            refits += 1
            self.budget.overflowed()  # the house was counted short
            self._async_drop_renders()
            if (refitted := await self._async_render_pin(agent)) is None:
                raise HearthError("no device of the pin's class is left")
            prefix = refitted
        self._without_examples.add(agent.key)
        self._async_drop_renders()
        LOGGER.warning(
            "The house prompt of %s does not fit the model's context with its worked "
            "examples: they are left out",
            agent.name,
        )
        fitting = await self._async_render_pin(agent)
        if fitting is None:
            raise HearthError("no device of the pin's class is left")
        return await self._async_put(agent, fitting), fitting

    async def _async_put(self, agent: AgentPin, prefix: HousePrefix) -> Mapping[str, Any]:
        """Pin ``prefix`` in the engine, or prime a server's cache with it."""
        return await self.coordinator.backend.async_pin(agent.name, prefix)

    @callback
    def _async_keep_base(self, agent: AgentPin, pinned: HousePrefix) -> None:
        """After a PUT: a prefix rendered in full is the new base; one that tells
        changes is folded once the house has been quiet for ``FOLD_QUIET_S``."""
        _cancel_fold(agent)
        if pinned.base is None:
            agent.base = pinned
            return
        key = (agent.subentry_id, agent.device_class)
        agent.fold_timer = async_call_later(self.hass, FOLD_QUIET_S, partial(self._async_fold, key))

    @callback
    def _async_fold(self, key: _PinKey, _now: Any = None) -> None:
        if (agent := self._pins.get(key)) is None:
            return
        agent.fold_timer = None
        if agent.lock.locked() or agent.pending_since is not None:
            return  # a re-pin is coming; it re-arms the fold
        self._async_pin_in_background(agent, PinReason.FOLD)

    def _cause(
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
        previous = self.history.previous(agent.key)
        if reason is not PinReason.INITIAL or previous in (None, prefix.digest):
            return None
        return RebuildCause.HA_UPGRADE if self.history.upgraded else RebuildCause.HA_RESTART

    @callback
    def _async_fitted(self, agent: AgentPin, prefix: HousePrefix, reason: PinReason) -> None:
        """After a PUT: learn the prefix's tokens per character; where the house was
        fitted (or is over its budget) with another rate, fit it again once (a fitted
        re-pin does not start another); say in Repairs what the listing left out."""
        house = prefix.house
        limit = self.budget.house_tokens
        over = limit is not None and agent.tokens is not None and agent.tokens > limit
        moved = self.budget.learn(agent.tokens, len(prefix.data))
        if moved and reason is not PinReason.FITTED and (over or (house and house.left_out)):
            self._async_drop_renders()
            self._async_pin_in_background(agent, PinReason.FITTED)
        if agent.device_class is not DeviceClass.NONE:
            return  # the agent's own pin speaks for it
        if house is None or not house.left_out:
            repairs.async_delete(self.hass, repairs.HOUSE_TOO_BIG, agent.key)
            return
        repairs.async_house_too_big(
            self.hass,
            agent.key,
            self._title(agent),
            listed=len(house.entities) - len(house.left_out),
            left_out=len(house.left_out),
            context=self.budget.context or 0,
        )

    @callback
    def _async_pin_failed(
        self, agent: AgentPin, prefix: HousePrefix, instance_id: str | None, err: Exception
    ) -> None:
        agent.error = describe(err)
        agent.refused = http_status(err) in _REFUSED_FOR_GOOD
        if agent.refused:
            agent.blocked_digest = prefix.digest  # e.g. larger than the KV budget
            agent.blocked_instance = instance_id
            if instance_id:
                self._instance_id = instance_id  # not a restart at every poll
            repairs.async_pin_refused(self.hass, agent.key, self._title(agent), str(err))
        retry = self._retries.setdefault((agent.subentry_id, agent.device_class), _Retry())
        retry.failures += 1
        most = max(1, round(RETRY_MAX_S / SCAN_INTERVAL.total_seconds()))
        retry.wait_polls = min(2 ** (retry.failures - 1), most)
        if retry.failures == 1:  # logged when it becomes unavailable, and when it is back
            LOGGER.warning("Could not pin the prefix %s (retried): %s", agent.name, err)
        else:
            LOGGER.debug("Could not pin the prefix %s again: %s", agent.name, err)

    @callback
    def _async_count_rebuild(self, agent: AgentPin, cause: RebuildCause) -> None:
        self.repins += 1
        self.repin_causes[cause.value] += 1
        agent.rebuilds += 1
        agent.rebuilt_at.append(dt_util.utcnow())
        self._async_check_rebuilds(agent)

    @callback
    def _async_check_rebuilds(self, agent: AgentPin) -> None:
        """Raise or clear the "rebuilt too often" issue from the rebuilds in the window."""
        horizon = dt_util.utcnow() - REBUILD_ISSUE_WINDOW
        while agent.rebuilt_at and agent.rebuilt_at[0] < horizon:
            agent.rebuilt_at.popleft()
        if len(agent.rebuilt_at) >= REBUILD_ISSUE_COUNT:
            repairs.async_pin_rebuilt_often(
                self.hass,
                agent.key,
                self._title(agent),
                len(agent.rebuilt_at),
                REBUILD_ISSUE_WINDOW,
            )
        else:
            repairs.async_delete(self.hass, repairs.PIN_REBUILT_OFTEN, agent.key)

    def _title(self, agent: AgentPin) -> str:
        subentry = self.entry.subentries.get(agent.subentry_id)
        title = subentry.title if subentry is not None else agent.subentry_id
        if agent.device_class is not DeviceClass.NONE:
            title = f"{title} ({agent.device_class})"
        return title


def _repin_now(agent: AgentPin) -> bool:
    """Whether a house change re-pins ``agent`` at once: an agent's pin for requests
    without a device, a pin a request used since it was pinned, or one never pinned.
    The pin of a device class nobody used since is re-pinned by its next request
    (which meanwhile gets the pinned prefix and the changes as sentences)."""
    return agent.device_class is DeviceClass.NONE or agent.used or agent.pinned is None


def _cancel_fold(agent: AgentPin) -> None:
    if agent.fold_timer is not None:
        agent.fold_timer()
        agent.fold_timer = None


def _debounce(options: Mapping[str, Any]) -> float:
    return float(options.get(CONF_REPIN_DEBOUNCE, DEFAULT_REPIN_DEBOUNCE))


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None
