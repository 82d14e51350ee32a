"""The engine entry's options form: how long a reply may send nothing (the stall time),
and the model's context where the server does not report it.

Both take effect at once: the entry's chat client reads the stall time on each request
(``__init__._async_update_listener`` hands it over) and the coordinator reads the
context fresh (``coordinator.context_length``), so no reload drops the pins.
"""

from __future__ import annotations

from typing import Any

import probatio
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigEntryState,
    ConfigFlowResult,
    OptionsFlow,
)
from homeassistant.helpers.selector import (
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
)

from .const import CONF_CONTEXT_LENGTH, CONF_STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT

# Seconds. Below 5 a busy CPU's first token of a long suffix could count as a stall;
# above 120 a voice turn holds the user longer than any Assist satellite waits.
STALL_MIN_S = 5.0
STALL_MAX_S = 120.0
# Tokens. No chat model that can follow the house prompt has less; 16 Mi is beyond any.
CONTEXT_MIN = 512
CONTEXT_MAX = 16 * 1024 * 1024


def stall_timeout(options: dict[str, Any] | Any) -> float:
    """The entry's stall time in seconds (the default where none is set)."""
    return float(options.get(CONF_STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT))


def _server_reports_context(entry: ConfigEntry) -> bool:
    """Whether the loaded entry's server reported its model's context (then the option
    would not be used, and the form does not offer it)."""
    if entry.state is not ConfigEntryState.LOADED:
        return False
    return entry.runtime_data.backend.info.context_length is not None


class HearthOptionsFlow(OptionsFlow):
    """Options of an engine entry."""

    async def async_step_init(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """One form: the stall time, and the model's context where it is not reported
        (empty: unknown)."""
        options = self.config_entry.options
        if user_input is not None:
            data = {k: v for k, v in options.items() if k != CONF_CONTEXT_LENGTH}
            data[CONF_STALL_TIMEOUT] = float(user_input[CONF_STALL_TIMEOUT])
            if (tokens := user_input.get(CONF_CONTEXT_LENGTH)) is not None:
                data[CONF_CONTEXT_LENGTH] = int(tokens)
            elif _server_reports_context(self.config_entry) and CONF_CONTEXT_LENGTH in options:
                data[CONF_CONTEXT_LENGTH] = options[CONF_CONTEXT_LENGTH]  # not offered: kept
            return self.async_create_entry(data=data)
        fields: dict[Any, Any] = {
            probatio.Required(CONF_STALL_TIMEOUT, default=stall_timeout(options)): NumberSelector(
                NumberSelectorConfig(
                    min=STALL_MIN_S,
                    max=STALL_MAX_S,
                    step=1,
                    unit_of_measurement="s",
                    mode=NumberSelectorMode.BOX,
                )
            ),
        }
        if not _server_reports_context(self.config_entry):
            told = options.get(CONF_CONTEXT_LENGTH)
            key = probatio.Optional(CONF_CONTEXT_LENGTH, description={"suggested_value": told})
            fields[key] = NumberSelector(
                NumberSelectorConfig(
                    min=CONTEXT_MIN, max=CONTEXT_MAX, step=1, mode=NumberSelectorMode.BOX
                )
            )
        return self.async_show_form(step_id="init", data_schema=probatio.Schema(fields))
