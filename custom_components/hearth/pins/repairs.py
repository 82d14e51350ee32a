"""Repairs issues about the pins: one the engine refuses, one rebuilt too often, and a
house too big for the model's context.

All three are per agent and not persistent: the pins raise them when they see the cause
(``pinning.py``, ``rebuilds.py``) and delete them as soon as the cause is gone (a
successful pin, a quiet hour), when the agent is removed and when the entry unloads (a
reload sees the cause again).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir

from ..const import DOMAIN

if TYPE_CHECKING:
    from ..house.diff import HouseSnapshot

_LOGGER = logging.getLogger(__name__)

PIN_REFUSED = "pin_refused"
PIN_REBUILT_OFTEN = "pin_rebuilt_often"
HOUSE_TOO_BIG = "house_too_big"


def issue_id(kind: str, subentry_id: str) -> str:
    """The id of an agent's issue of ``kind`` (``PIN_REFUSED``, ``PIN_REBUILT_OFTEN``)."""
    return f"{kind}_{subentry_id}"


@callback
def async_pin_refused(hass: HomeAssistant, subentry_id: str, agent: str, error: str) -> None:
    """The engine refused the agent's pin for good: every request prefills everything."""
    ir.async_create_issue(
        hass,
        DOMAIN,
        issue_id(PIN_REFUSED, subentry_id),
        is_fixable=False,
        is_persistent=False,
        severity=ir.IssueSeverity.ERROR,
        translation_key=PIN_REFUSED,
        translation_placeholders={"agent": agent, "error": error},
    )


@callback
def async_pin_rebuilt_often(
    hass: HomeAssistant, subentry_id: str, agent: str, count: int, window: timedelta
) -> None:
    """The agent's pin was rebuilt ``count`` times within ``window``."""
    ir.async_create_issue(
        hass,
        DOMAIN,
        issue_id(PIN_REBUILT_OFTEN, subentry_id),
        is_fixable=False,
        is_persistent=False,
        severity=ir.IssueSeverity.WARNING,
        translation_key=PIN_REBUILT_OFTEN,
        translation_placeholders={
            "agent": agent,
            "count": str(count),
            "minutes": str(round(window.total_seconds() / 60)),
        },
    )


@callback
def async_house_too_big(
    hass: HomeAssistant, subentry_id: str, agent: str, *, listed: int, left_out: int, context: int
) -> None:
    """The agent's house does not fit the model's context whole: its prompt lists
    ``listed`` exposed entities and leaves ``left_out`` out."""
    # Once a pin (a house change), also in the log: a non-persistent issue keeps no counts.
    _LOGGER.info(
        "%s: the house prompt lists %d of %d exposed entities (the model's context is %d"
        " tokens); see Repairs",
        agent,
        listed,
        listed + left_out,
        context,
    )
    ir.async_create_issue(
        hass,
        DOMAIN,
        issue_id(HOUSE_TOO_BIG, subentry_id),
        is_fixable=False,
        is_persistent=False,
        severity=ir.IssueSeverity.WARNING,
        translation_key=HOUSE_TOO_BIG,
        translation_placeholders={
            "agent": agent,
            "listed": str(listed),
            "left_out": str(left_out),
            "exposed": str(listed + left_out),
            "context": str(context),
        },
    )


@callback
def async_house_listed(
    hass: HomeAssistant, subentry_id: str, agent: str, house: HouseSnapshot | None, context: int
) -> None:
    """The agent's prefix lists ``house``: the "house too big" issue where the listing
    left entities out, none where it lists them all."""
    if house is None or not house.left_out:
        async_delete(hass, HOUSE_TOO_BIG, subentry_id)
        return
    async_house_too_big(
        hass,
        subentry_id,
        agent,
        listed=len(house.entities) - len(house.left_out),
        left_out=len(house.left_out),
        context=context,
    )


@callback
def async_delete(hass: HomeAssistant, kind: str, subentry_id: str) -> None:
    """The cause of the agent's issue of ``kind`` is gone (no-op if there is none)."""
    ir.async_delete_issue(hass, DOMAIN, issue_id(kind, subentry_id))


@callback
def async_delete_all(hass: HomeAssistant, subentry_id: str) -> None:
    """Every issue of the agent (removed, or its entry unloaded)."""
    for kind in (PIN_REFUSED, PIN_REBUILT_OFTEN, HOUSE_TOO_BIG):
        async_delete(hass, kind, subentry_id)
