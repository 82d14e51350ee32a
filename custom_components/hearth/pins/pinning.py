"""Pinning: each pin's prefix PUT in the engine, kept there, and retried.

``Pinner`` renders a pin (``renders.py``) and PUTs it only when the rendered prefix
really changed (a SHA-256 of its bytes); a restarted engine, a missing pin and the
refresh action PUT it regardless. A server without the pin API (llama.cpp, vLLM,
SGLang) gets a priming request instead (``backend/priming.py``), at the same moments.

A house prompt the server finds longer than the model's context is fitted again
(``prefix/budget.py``), then pinned without its worked examples. A failed pin is retried
at a later poll, further apart after each failure; one the engine refuses for good
(too large, say) only by the refresh action or a restarted engine (the polls of
``events.py`` pin again).

A pin that tells changes since its base (``prefix/delta.py``) is *folded*, rendered in
full again, once the house has been quiet for ``FOLD_QUIET_S``; one rendered in full
becomes its new base. Each PUT that replaces an earlier pin counts as a rebuild
(``rebuilds.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from homeassistant.core import callback
from homeassistant.helpers.event import async_call_later

from ..backend.api import HearthError
from ..backend.coordinator import HearthCoordinator
from ..const import DOMAIN, FOLD_QUIET_S, LOGGER, SCAN_INTERVAL
from ..errors import BACKEND_ERRORS, describe, http_status, is_context_exceeded
from ..house.device_class import DeviceClass
from ..prefix.value import HousePrefix
from . import repairs
from .agents import AgentPins
from .model import AgentPin, PinKey, PinReason, pin_name
from .rebuilds import Rebuilds
from .renders import PrefixRenders

# Engine answers to a PUT that the same prefix would get again (invalid, too large).
_REFUSED_FOR_GOOD = frozenset({400, 413, 422})
# A failed pin is retried at a later poll: 1, 2, 4... polls after the failure, at most
# this far apart.
RETRY_MAX_S = 300.0
# Fits of a house the server found too long for its context, before the worked
# examples are left out (prefix/budget.py).
MAX_REFITS = 2
# Reasons that PUT a prefix only where it changed.
_ON_CHANGE = (PinReason.CHANGED, PinReason.FOLD, PinReason.FITTED)


@dataclass
class _Retry:
    """The failed attempts of a pin in a row, and the polls to let pass before the next."""

    failures: int = 0
    wait_polls: int = 0


@dataclass(eq=False)  # identity: one per entry
class Pinner:
    """PUTs the entry's pins in the engine and keeps them there."""

    _pins: AgentPins
    _coordinator: HearthCoordinator  # the engine the pins are PUT in
    _renders: PrefixRenders
    _rebuilds: Rebuilds
    instance_id: str | None = field(default=None, init=False)  # the engine holding the pins
    _retries: dict[PinKey, _Retry] = field(default_factory=dict, init=False)

    @callback
    def async_pin_in_background(self, agent: AgentPin, reason: PinReason) -> None:
        """``async_pin`` in a background task of the entry."""
        self._pins.entry.async_create_background_task(
            self._pins.hass,
            self.async_pin(agent, reason),
            f"{DOMAIN} pin {agent.name} ({reason})",
        )

    async def async_pin(self, agent: AgentPin, reason: PinReason) -> bool:
        """Render the prefix and PUT it if needed; returns True if it was PUT.

        A change is PUT only if the digest differs from the pinned one. A restarted
        engine, a missing pin and the refresh action PUT it regardless. ``repins``
        counts the PUTs that replace an earlier pin of this agent (``rebuilds.py``).
        """
        async with agent.lock:
            if not self._pins.holds(agent):
                return False  # its subentry was removed meanwhile
            fold = reason in (PinReason.FOLD, PinReason.MANUAL)
            prefix = await self._renders.async_render_pin(agent, fold=fold)
            if prefix is None:
                return False  # no device of its class is left to render it with
            changed = prefix.digest != agent.digest
            status = self._coordinator.data
            instance_id = status.instance_id if status else None
            if _skipped(agent, prefix, reason, changed, instance_id):
                return False
            agent.putting = True
            self._coordinator.async_update_listeners()
            try:
                info, prefix = await self._async_put_fitting(agent, prefix)
            except BACKEND_ERRORS as err:
                self._async_failed(agent, prefix, instance_id, err)
                if reason is PinReason.MANUAL:
                    raise
                return False
            finally:
                agent.putting = False
                self._coordinator.async_update_listeners()
            self._async_pinned(
                agent, prefix, info, reason=reason, changed=changed, instance_id=instance_id
            )
            await self._pins.history.async_record(agent.key, prefix.digest, agent.base)
        self._coordinator.async_update_listeners()
        return True

    async def async_unpin(self, subentry_ids: Iterable[str]) -> None:
        """Delete every pin of the agents ``subentry_ids`` in the engine (best effort)."""
        for subentry_id in subentry_ids:
            for cls in DeviceClass:
                try:
                    await self._coordinator.backend.async_unpin(pin_name(subentry_id, cls))
                except BACKEND_ERRORS as err:
                    LOGGER.debug("Could not delete the pin of %s (%s): %s", subentry_id, cls, err)

    @callback
    def async_forget(self, key: PinKey) -> None:
        """The pin ``key`` is removed: its retries end."""
        self._retries.pop(key, None)

    @callback
    def _async_pinned(
        self,
        agent: AgentPin,
        prefix: HousePrefix,
        info: Mapping[str, Any],
        *,
        reason: PinReason,
        changed: bool,
        instance_id: str | None,
    ) -> None:
        """After a PUT: what ``agent`` now holds, and the issues it clears or raises."""
        cause = self._rebuilds.cause(agent, prefix, reason, changed)
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
        if self._retries.pop(agent.slot, None) is not None:
            LOGGER.info("The prefix %s is pinned again", agent.name)
        if instance_id:
            self.instance_id = instance_id
        repairs.async_delete(self._pins.hass, repairs.PIN_REFUSED, agent.key)
        if cause is not None:
            self._rebuilds.async_count(agent, cause)
        LOGGER.debug(
            "Pinned %s (%s): %s tokens, digest %s",
            agent.name,
            reason,
            agent.tokens,
            prefix.digest[:12],
        )

    async def _async_put_fitting(
        self, agent: AgentPin, prefix: HousePrefix
    ) -> tuple[Mapping[str, Any], HousePrefix]:
        """``_async_put``, and where the house prompt is longer than the model's
        context: fitted again counting more carefully (``MAX_REFITS`` times, where the
        context is known), then once more without the worked examples (what was pinned
        is returned)."""
        budget = self._renders.budget
        refits = 0
        while True:
            try:
                return await self._async_put(agent, prefix), prefix
            except BACKEND_ERRORS as err:
                if not is_context_exceeded(err):
                    raise
                if budget.context is None or refits == MAX_REFITS:
                    if not prefix.examples:
                        raise
                    break
            refits += 1
            budget.overflowed()  # the house was counted short
            self._renders.async_drop()
            prefix = await self._async_render_again(agent)
        self._renders.async_leave_out_examples(agent.key)
        LOGGER.warning(
            "The house prompt of %s does not fit the model's context with its worked "
            "examples: they are left out",
            agent.name,
        )
        fitting = await self._async_render_again(agent)
        return await self._async_put(agent, fitting), fitting

    async def _async_render_again(self, agent: AgentPin) -> HousePrefix:
        if (prefix := await self._renders.async_render_pin(agent)) is None:
            raise HearthError("no device of the pin's class is left")
        return prefix

    async def _async_put(self, agent: AgentPin, prefix: HousePrefix) -> Mapping[str, Any]:
        """Pin ``prefix`` in the engine, or prime a server's cache with it."""
        return await self._coordinator.backend.async_pin(agent.name, prefix)

    @callback
    def _async_keep_base(self, agent: AgentPin, pinned: HousePrefix) -> None:
        """After a PUT: a prefix rendered in full is the new base; one that tells
        changes is folded once the house has been quiet for ``FOLD_QUIET_S``."""
        cancel_fold(agent)
        if pinned.base is None:
            agent.base = pinned
            return
        agent.fold_timer = async_call_later(
            self._pins.hass, FOLD_QUIET_S, partial(self._async_fold, agent.slot)
        )

    @callback
    def _async_fold(self, key: PinKey, _now: Any = None) -> None:
        if (agent := self._pins.get(key)) is None:
            return
        agent.fold_timer = None
        if agent.lock.locked() or agent.pending_since is not None:
            return  # a re-pin is coming; it re-arms the fold
        self.async_pin_in_background(agent, PinReason.FOLD)

    @callback
    def _async_fitted(self, agent: AgentPin, prefix: HousePrefix, reason: PinReason) -> None:
        """After a PUT: where the house was fitted with another rate of tokens per
        character than the PUT shows, fit it again once (a fitted re-pin does not start
        another); say in Repairs what the listing left out."""
        refit = self._renders.refit_due(agent.tokens, prefix)
        if refit and reason is not PinReason.FITTED:
            self._renders.async_drop()
            self.async_pin_in_background(agent, PinReason.FITTED)
        if agent.device_class is not DeviceClass.NONE:
            return  # the agent's own pin speaks for it
        context = self._renders.budget.context or 0
        title = self._pins.title(agent)
        repairs.async_house_listed(self._pins.hass, agent.key, title, prefix.house, context)

    @callback
    def _async_failed(
        self, agent: AgentPin, prefix: HousePrefix, instance_id: str | None, err: Exception
    ) -> None:
        agent.error = describe(err)
        agent.refused = http_status(err) in _REFUSED_FOR_GOOD
        if agent.refused:
            agent.blocked_digest = prefix.digest  # e.g. larger than the KV budget
            agent.blocked_instance = instance_id
            if instance_id:
                self.instance_id = instance_id  # not a restart at every poll
            title = self._pins.title(agent)
            repairs.async_pin_refused(self._pins.hass, agent.key, title, str(err))
        retry = self._retries.setdefault(agent.slot, _Retry())
        retry.failures += 1
        most = max(1, round(RETRY_MAX_S / SCAN_INTERVAL.total_seconds()))
        retry.wait_polls = min(2 ** (retry.failures - 1), most)
        if retry.failures == 1:  # logged when it becomes unavailable, and when it is back
            LOGGER.warning("Could not pin the prefix %s (retried): %s", agent.name, err)
        else:
            LOGGER.debug("Could not pin the prefix %s again: %s", agent.name, err)

    @callback
    def retry_due(self, agent: AgentPin) -> bool:
        """Whether a failed pin is retried at this poll (exponential backoff in polls);
        counts the poll."""
        retry = self._retries.get(agent.slot)
        if retry is None or retry.wait_polls <= 0:
            return True
        retry.wait_polls -= 1
        return retry.wait_polls <= 0


def _skipped(
    agent: AgentPin,
    prefix: HousePrefix,
    reason: PinReason,
    changed: bool,
    instance_id: str | None,
) -> bool:
    """Whether ``prefix`` is not PUT: unchanged for a reason that PUTs a change only, or
    refused for good by this engine (retried only by the refresh action, or by a
    restarted engine, perhaps given a bigger KV budget)."""
    if reason in _ON_CHANGE and not changed:
        return True
    blocked = prefix.digest == agent.blocked_digest and instance_id == agent.blocked_instance
    return reason is not PinReason.MANUAL and blocked


def cancel_fold(agent: AgentPin) -> None:
    """The pending fold of ``agent``, if any, ends."""
    if agent.fold_timer is not None:
        agent.fold_timer()
        agent.fold_timer = None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None
