"""Diagnostics: engine counters and pin state; the API key and prompt text redacted."""

from __future__ import annotations

from typing import Any

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.const import CONF_API_KEY, CONF_PROMPT
from homeassistant.core import HomeAssistant

from .data import HearthConfigEntry

TO_REDACT = {CONF_API_KEY, CONF_PROMPT}


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: HearthConfigEntry
) -> dict[str, Any]:
    """Entry (redacted), engine status, pins and the last turn's usage."""
    data = entry.runtime_data
    status = data.coordinator.data
    return {
        "entry": async_redact_data(entry.as_dict(), TO_REDACT),
        "engine": {
            "connected": data.coordinator.last_update_success,
            "server": server.as_dict() if (server := data.coordinator.server) else None,
            "stats": status.stats if status is not None else None,
            "pins": {
                name: {key: pin.get(key) for key in ("tokens", "state", "hits", "restored")}
                for name, pin in (status.pins.items() if status is not None else ())
            },
        },
        "prefixes": data.prefixes.as_diagnostics(),
        "last_turn": data.last_turn.as_dict() if data.last_turn is not None else None,
    }
