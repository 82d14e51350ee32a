"""Actions: ``hearth.refresh_prefix``, ``hearth.clear_cache`` and ``hearth.dashboard``."""

from __future__ import annotations

import probatio
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers import service

from .const import (
    ATTR_CONFIG_ENTRY_ID,
    DOMAIN,
    SERVICE_CLEAR_CACHE,
    SERVICE_DASHBOARD,
    SERVICE_REFRESH_PREFIX,
)
from .dashboard import build_dashboard
from .data import HearthConfigEntry
from .errors import BACKEND_ERRORS, as_ha_error

SERVICE_SCHEMA = probatio.Schema({probatio.Optional(ATTR_CONFIG_ENTRY_ID): cv.string})


@callback
def _entry(call: ServiceCall) -> HearthConfigEntry:
    """The (loaded) engine entry an action targets; the only one if none is given."""
    entry: HearthConfigEntry = service.async_get_config_entry(
        call.hass, DOMAIN, call.data.get(ATTR_CONFIG_ENTRY_ID)
    )
    return entry


async def _async_refresh_prefix(call: ServiceCall) -> None:
    """Re-render every agent's house prefix and pin it again."""
    try:
        await _entry(call).runtime_data.prefixes.async_refresh_all()
    except BACKEND_ERRORS as err:
        raise as_ha_error(err) from err


async def _async_clear_cache(call: ServiceCall) -> ServiceResponse:
    """Drop every cached prefix that is neither pinned nor in use."""
    entry = _entry(call)
    data = entry.runtime_data
    backend = data.backend
    if not backend.clears_cache:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="cache_clear_unsupported",
            translation_placeholders={"title": entry.title},
        )
    try:
        freed = await backend.async_clear_cache()
    except BACKEND_ERRORS as err:
        raise as_ha_error(err) from err
    await data.coordinator.async_request_refresh()
    return {"freed_bytes": freed}


@callback
def _async_dashboard(call: ServiceCall) -> ServiceResponse:
    """A dashboard of every loaded engine and agent, with this install's entity ids."""
    return build_dashboard(call.hass)


@callback
def async_setup_services(hass: HomeAssistant) -> None:
    """Register the actions (once, for all entries)."""
    hass.services.async_register(
        DOMAIN, SERVICE_REFRESH_PREFIX, _async_refresh_prefix, schema=SERVICE_SCHEMA
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_CLEAR_CACHE,
        _async_clear_cache,
        schema=SERVICE_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )
    hass.services.async_register(
        DOMAIN, SERVICE_DASHBOARD, _async_dashboard, supports_response=SupportsResponse.ONLY
    )
