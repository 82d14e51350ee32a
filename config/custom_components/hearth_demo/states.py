"""The ``hearth_demo.set_states`` action: put entities in a fixture's state at once.

The accuracy benchmark resets a dataset home before each request (the fixture's states
plus the test's ``setup``) without restarting Home Assistant. Registries are untouched,
so the house prompt, and Hearth's pinned prefix, stay the same.
"""

from __future__ import annotations

from typing import Any

import probatio
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant, ServiceCall
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import config_validation as cv

from .const import DATA_ENTITIES, DOMAIN, SERVICE_SET_STATES
from .fixture_states import options_from_fixture
from .helpers import HELPER_DOMAINS, async_set_helper_state
from .schema import validate_options

STATE_SCHEMA = probatio.Schema(
    {
        probatio.Optional("state"): probatio.Any(None, str, bool, int, float),
        probatio.Optional("attributes", default={}): dict,
    }
)
SET_STATES_SCHEMA = probatio.Schema({probatio.Required("states"): {cv.entity_id: STATE_SCHEMA}})


def _is_helper(hass: HomeAssistant, entity_id: str) -> bool:
    return entity_id.split(".", 1)[0] in HELPER_DOMAINS and hass.states.get(entity_id) is not None


async def async_set_states(hass: HomeAssistant, states: dict[str, dict[str, Any]]) -> None:
    """Apply fixture states (``{entity_id: {state, attributes}}``) to demo entities and
    to a fixture's helpers (through their own actions)."""
    helpers = {k: v for k, v in states.items() if _is_helper(hass, k)}
    set_states(hass, {k: v for k, v in states.items() if k not in helpers})
    for entity_id, data in helpers.items():
        await async_set_helper_state(hass, entity_id, data.get("state"))


def set_states(hass: HomeAssistant, states: dict[str, dict[str, Any]]) -> None:
    """Apply fixture states (``{entity_id: {state, attributes}}``) to demo entities."""
    entities = hass.data.get(DATA_ENTITIES, {})
    if missing := sorted(set(states) - set(entities)):
        raise ServiceValidationError(f"not demo entities: {', '.join(missing)}")
    options = {}
    for entity_id, data in states.items():
        platform = Platform(entity_id.split(".", 1)[0])
        raw = options_from_fixture(platform, data.get("state"), data.get("attributes"))
        try:
            options[entity_id] = validate_options(platform, raw)
        except probatio.Invalid as err:
            raise ServiceValidationError(f"{entity_id}: {err}") from err
    for entity_id, entity_options in options.items():
        entities[entity_id].apply_options(entity_options)
        entities[entity_id].async_write_ha_state()


def async_register_set_states(hass: HomeAssistant) -> None:
    """Register the action (admin-free: the demo house is a test bench)."""

    async def _handle(call: ServiceCall) -> None:
        await async_set_states(hass, call.data["states"])

    hass.services.async_register(DOMAIN, SERVICE_SET_STATES, _handle, schema=SET_STATES_SCHEMA)
