"""The Hearth demo house: a furnished, exposed, logged-in Home Assistant with no clicking.

On every start, from house.yaml:
1. floors, areas and entity registry entries (area, aliases, Assist exposure) are made to
   match the file (house.py);
2. the demo entities are added on their platforms (in-memory state, obey services);
3. the `demo` user, onboarding and a token file for scripts are ensured (access.py);
4. once Home Assistant has started, Hearth is wired in when installed (wiring.py).
A dataset home (`fixtures:`, a `_fixtures.yaml`) is built the same way (fixtures.py);
`hearth_demo.set_states` resets its states between benchmark requests (states.py).
With HEARTH_HOUSE_SCALE=N in the environment, N guest suites are added (scale.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import probatio
from homeassistant.core import HomeAssistant
from homeassistant.helpers import discovery
from homeassistant.helpers.start import async_at_started
from homeassistant.helpers.typing import ConfigType

from .access import async_ensure_access
from .const import DATA_HOUSE, DOMAIN, PLATFORMS
from .helpers import async_setup_helpers
from .house import async_build_house
from .prompt import async_register_services
from .scale import ENV_HOUSE_SCALE, rooms_from_env, scale_house
from .schema import CONFIG_SCHEMA, HOUSE_SCHEMA, house_from_config
from .states import async_register_set_states
from .timers import async_register_timer_devices
from .wiring import async_wire_hearth

__all__ = ["CONFIG_SCHEMA", "DOMAIN"]

_LOGGER = logging.getLogger(__name__)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Build the demo house."""
    try:
        conf = _scaled(config[DOMAIN])
        # In the executor: a dataset home's `_fixtures.yaml` is read from disk.
        house = await hass.async_add_executor_job(
            house_from_config, conf, Path(hass.config.config_dir)
        )
    except (probatio.Invalid, ValueError) as err:
        _LOGGER.error("Invalid demo house in house.yaml: %s", err)
        return False
    hass.data[DATA_HOUSE] = house

    async_build_house(hass, house)
    left_out = [*house.left_out, *await async_setup_helpers(hass, list(house.helpers))]
    for reason in left_out:
        _LOGGER.warning("Fixture entity left out: %s", reason)
    for platform in PLATFORMS:
        hass.async_create_task(
            discovery.async_load_platform(hass, platform, DOMAIN, {}, config),
            f"{DOMAIN} {platform} platform",
            eager_start=True,
        )
    await async_ensure_access(hass, house.access)
    async_register_services(hass)
    async_register_set_states(hass)
    async_register_timer_devices(hass, house.timer_devices)

    if house.hearth.enabled:

        async def _wire(hass: HomeAssistant) -> None:
            await async_wire_hearth(hass, house.hearth)

        async_at_started(hass, _wire)
    return True


def _scaled(conf: dict[str, Any]) -> dict[str, Any]:
    """The house with the guest suites HEARTH_HOUSE_SCALE asks for, validated again."""
    rooms = rooms_from_env(os.environ)
    if not rooms:
        return conf
    _LOGGER.info("Demo house scaled: %d guest suites added (%s)", rooms, ENV_HOUSE_SCALE)
    return dict(HOUSE_SCHEMA(scale_house(conf, rooms)))
