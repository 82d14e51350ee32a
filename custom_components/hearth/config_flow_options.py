"""The engine entry's options form: how long a reply may send nothing (the stall time).

The time takes effect at once: the entry's chat client reads it on each request
(``__init__._async_update_listener`` hands it over), so no reload drops the pins.
"""

from __future__ import annotations

from typing import Any

import probatio
from homeassistant.config_entries import ConfigFlowResult, OptionsFlow
from homeassistant.helpers.selector import (
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
)

from .const import CONF_STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT

# Seconds. Below 5 a busy CPU's first token of a long suffix could count as a stall;
# above 120 a voice turn holds the user longer than any Assist satellite waits.
STALL_MIN_S = 5.0
STALL_MAX_S = 120.0


def stall_timeout(options: dict[str, Any] | Any) -> float:
    """The entry's stall time in seconds (the default where none is set)."""
    return float(options.get(CONF_STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT))


class HearthOptionsFlow(OptionsFlow):
    """Options of an engine entry."""

    async def async_step_init(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        """One form: the stall time."""
        if user_input is not None:
            seconds = float(user_input[CONF_STALL_TIMEOUT])
            return self.async_create_entry(
                data={**self.config_entry.options, CONF_STALL_TIMEOUT: seconds}
            )
        schema = probatio.Schema(
            {
                probatio.Required(
                    CONF_STALL_TIMEOUT, default=stall_timeout(self.config_entry.options)
                ): NumberSelector(
                    NumberSelectorConfig(
                        min=STALL_MIN_S,
                        max=STALL_MAX_S,
                        step=1,
                        unit_of_measurement="s",
                        mode=NumberSelectorMode.BOX,
                    )
                ),
            }
        )
        return self.async_show_form(step_id="init", data_schema=schema)
