"""Supervisor discovery: the engine add-on announces itself, the user confirms.

The add-on sends the discovery service ``hearth`` with ``{"host", "port", "api_key"}``;
Home Assistant's hassio integration then starts this flow with ``source=hassio``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import probatio
from homeassistant.config_entries import SOURCE_IGNORE, ConfigEntry, ConfigFlow, ConfigFlowResult
from homeassistant.const import CONF_API_KEY, CONF_HOST, CONF_NAME, CONF_PORT
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from yarl import URL

from .const import LOGGER
from .engine_entry import (
    async_create_engine_entry,
    async_entry_for_url,
    async_validate,
    engine_data,
)

# The Supervisor adds the add-on's name under ``addon``: extra keys are allowed.
ADDON_DISCOVERY_SCHEMA = probatio.Schema(
    {
        probatio.Required(CONF_HOST): probatio.All(cv.string, probatio.Length(min=1)),
        probatio.Required(CONF_PORT): cv.port,
        probatio.Optional(CONF_API_KEY): probatio.Any(None, cv.string),
    },
    extra=probatio.ALLOW_EXTRA,
)


def addon_engine(config: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """(URL, API key) of the engine an add-on announced; None for an announcement
    without a usable address (no host, a bad port...)."""
    try:
        valid = ADDON_DISCOVERY_SCHEMA(dict(config))
        url = URL.build(scheme="http", host=valid[CONF_HOST].strip(), port=valid[CONF_PORT])
    except probatio.Invalid, ValueError:
        return None
    return str(url), (valid.get(CONF_API_KEY) or "").strip() or None


class HassioDiscoveryFlow(ConfigFlow):
    """The add-on steps of the engine's config flow (a mixin: it registers no domain)."""

    _addon: HassioServiceInfo | None = None  # the add-on whose engine is being added

    async def async_step_hassio(self, discovery_info: HassioServiceInfo) -> ConfigFlowResult:
        """The engine add-on announced itself through the Supervisor.

        The unique id is the add-on's full slug (``local_hearth``, ``a0d7b954_hearth``),
        whatever prefix the store gives it. The slug stays the same across restarts,
        updates and reinstalls, so the entry follows the add-on's new key after a
        reinstall (the Supervisor's discovery uuid is made anew then). Two installs of
        the add-on (a local one beside a repository's) are two engines with their own
        keys: without the prefix they would overwrite one entry in turn.
        """
        engine = addon_engine(discovery_info.config)
        if engine is None:
            LOGGER.warning(
                "The add-on %s announced no usable engine address: %s",
                discovery_info.slug,
                {key: value for key, value in discovery_info.config.items() if key != CONF_API_KEY},
            )
            return self.async_abort(reason="invalid_discovery_info")
        url, api_key = engine
        entry = await self.async_set_unique_id(discovery_info.slug)
        if entry is None:
            entry = async_entry_for_url(self.hass, url)  # added by hand: it follows the add-on
        if entry is not None:
            return self._async_update_discovered(entry, engine_data(url, api_key))
        self._addon = discovery_info
        self.context.update(
            {
                "title_placeholders": {CONF_NAME: discovery_info.name},
                "configuration_url": f"homeassistant://hassio/addon/{discovery_info.slug}/info",
            }
        )
        return await self.async_step_hassio_confirm()

    async def async_step_hassio_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask before adding the add-on's engine; probe it as the user step does."""
        engine = addon_engine(self._addon.config) if self._addon is not None else None
        if self._addon is None or engine is None:  # only async_step_hassio leads here
            return self.async_abort(reason="invalid_discovery_info")
        url, api_key = engine
        errors: dict[str, str] = {}
        if user_input is not None:
            if async_entry_for_url(self.hass, url) is not None:  # added by hand meanwhile
                return self.async_abort(reason="already_configured")
            error, server = await async_validate(self.hass, url, api_key)
            if error is None and server is not None:
                return await async_create_engine_entry(self, url, api_key, server)
            # The add-on may still be loading its model: the form stays, to try again.
            errors["base"] = error or "unknown"
        self._set_confirm_only()
        return self.async_show_form(
            step_id="hassio_confirm",
            description_placeholders={"addon": self._addon.name},
            errors=errors,
        )

    def _async_update_discovered(
        self, entry: ConfigEntry, data: Mapping[str, str]
    ) -> ConfigFlowResult:
        """Point a known entry at what its add-on announced (its host or key may have
        changed) and abort; an entry the user ignored stays ignored.

        A loaded entry reloads from its update listener when its data changed; one that
        failed to set up (e.g. a key the add-on has since replaced) is reloaded here.
        """
        if entry.source != SOURCE_IGNORE and (
            self.hass.config_entries.async_update_entry(entry, unique_id=self.unique_id, data=data)
            and not entry.update_listeners
        ):
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        return self.async_abort(reason="already_configured")
