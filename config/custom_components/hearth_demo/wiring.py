"""Wire Hearth in: its config entry (through its own config flows) and the Assist pipeline.

Tolerant by design: the Hearth integration is developed alongside the demo, so when it is
absent or a flow does not finish, a warning says so and the demo house runs without it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import probatio
from homeassistant.components.assist_pipeline import async_get_pipeline, async_update_pipeline
from homeassistant.components.conversation import HOME_ASSISTANT_AGENT
from homeassistant.config_entries import (
    SOURCE_RECONFIGURE,
    SOURCE_USER,
    ConfigEntry,
    ConfigFlowContext,
    ConfigFlowResult,
)
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import entity_registry as er
from homeassistant.loader import IntegrationNotFound, async_get_integration

from .const import HEARTH_AGENT, HEARTH_DOMAIN
from .model import HearthSpec

_LOGGER = logging.getLogger(__name__)


async def _async_run_flow(
    hass: HomeAssistant, context: ConfigFlowContext, user_input: dict[str, Any]
) -> ConfigFlowResult | None:
    """Start a Hearth config flow and submit its form; None when the flow fails."""
    try:
        result = await hass.config_entries.flow.async_init(HEARTH_DOMAIN, context=context)
        if result["type"] is FlowResultType.FORM:
            result = await hass.config_entries.flow.async_configure(result["flow_id"], user_input)
    except (HomeAssistantError, probatio.Invalid, ImportError) as err:
        _LOGGER.warning("Hearth %s flow failed: %s", context["source"], err)
        return None
    if result["type"] is FlowResultType.FORM:  # the form came back with errors
        hass.config_entries.flow.async_abort(result["flow_id"])
    return result


def _flow_problem(result: ConfigFlowResult) -> str:
    return f"{result['type']}: {result.get('errors') or result.get('reason')}"


async def _async_create_entry(hass: HomeAssistant, url: str) -> bool:
    """Run the Hearth config flow's user step with the engine URL."""
    result = await _async_run_flow(hass, {"source": SOURCE_USER}, {CONF_URL: url})
    if result is not None and result["type"] is FlowResultType.CREATE_ENTRY:
        _LOGGER.info("Created the Hearth config entry for engine %s", url)
        return True
    if result is not None:
        _LOGGER.warning(
            "Hearth config flow did not create an entry for engine %s (%s); is the engine"
            " up? Restart Home Assistant to retry",
            url,
            _flow_problem(result),
        )
    return False


async def _async_follow_url(hass: HomeAssistant, entry: ConfigEntry, url: str) -> None:
    """Point an existing entry at `url` (HEARTH_ENGINE_URL) through its reconfigure flow."""
    if str(entry.data.get(CONF_URL, "")).rstrip("/") == url.rstrip("/"):
        return
    user_input = {CONF_URL: url}
    if api_key := entry.data.get(CONF_API_KEY):
        user_input[CONF_API_KEY] = api_key
    context: ConfigFlowContext = {"source": SOURCE_RECONFIGURE, "entry_id": entry.entry_id}
    result = await _async_run_flow(hass, context, user_input)
    if result is not None and result.get("reason") == "reconfigure_successful":
        _LOGGER.info("Hearth entry now uses engine %s", url)
    elif result is not None:
        _LOGGER.warning(
            "Could not point the Hearth entry at engine %s (%s); it keeps %s",
            url,
            _flow_problem(result),
            entry.data.get(CONF_URL),
        )


def _async_set_agent_options(hass: HomeAssistant, options: Mapping[str, Any]) -> None:
    """Give the conversation agents of the Hearth entry ``options`` (the bench's knobs)."""
    for entry in hass.config_entries.async_entries(HEARTH_DOMAIN):
        for subentry in entry.subentries.values():
            if subentry.subentry_type != "conversation":
                continue
            if {**subentry.data, **options} != dict(subentry.data):
                hass.config_entries.async_update_subentry(
                    entry, subentry, data={**subentry.data, **options}
                )
                _LOGGER.info("Hearth agent %s: options %s", subentry.title, dict(options))


def _async_set_entry_options(hass: HomeAssistant, options: Mapping[str, Any]) -> None:
    """Give the Hearth entry ``options`` (they apply at once: no reload, no re-pin)."""
    for entry in hass.config_entries.async_entries(HEARTH_DOMAIN):
        if {**entry.options, **options} != dict(entry.options):
            hass.config_entries.async_update_entry(entry, options={**entry.options, **options})
            _LOGGER.info("Hearth entry %s: options %s", entry.title, dict(options))


def _hearth_agent_exists(hass: HomeAssistant) -> bool:
    """The agent entity is there (registered, even while its entry retries)."""
    return (
        hass.states.get(HEARTH_AGENT) is not None
        or er.async_get(hass).async_get(HEARTH_AGENT) is not None
    )


async def _async_set_pipeline_agent(
    hass: HomeAssistant, agent: str, prefer_local: bool = True
) -> None:
    """Make `agent` the conversation agent of the preferred Assist pipeline.

    With `prefer_local`, Home Assistant's own sentence matcher answers the commands it
    understands first (instantly and exactly); the agent gets the rest.
    """
    pipeline = async_get_pipeline(hass)
    if (pipeline.conversation_engine, pipeline.prefer_local_intents) == (agent, prefer_local):
        return
    await async_update_pipeline(
        hass, pipeline, conversation_engine=agent, prefer_local_intents=prefer_local
    )
    _LOGGER.info(
        "Assist pipeline %r now answers with %s (local commands first: %s)",
        pipeline.name,
        agent,
        prefer_local,
    )


async def _async_wire(hass: HomeAssistant, spec: HearthSpec) -> bool:
    """Create the Hearth entry, or make the only one follow the engine URL.

    True when the Hearth agent exists afterwards.
    """
    try:
        await async_get_integration(hass, HEARTH_DOMAIN)
    except IntegrationNotFound:
        _LOGGER.warning(
            "The Hearth integration is not installed (config/custom_components/hearth):"
            " the demo house runs with Home Assistant's built-in Assist agent"
        )
        return False
    entries = hass.config_entries.async_entries(HEARTH_DOMAIN)
    if not entries:
        if not await _async_create_entry(hass, spec.engine_url):
            return False
    elif len(entries) == 1:
        await _async_follow_url(hass, entries[0], spec.engine_url)
    if spec.agent_options:
        _async_set_agent_options(hass, spec.agent_options)
    if spec.entry_options:
        _async_set_entry_options(hass, spec.entry_options)
    if not _hearth_agent_exists(hass):
        _LOGGER.warning(
            "%s does not exist (did the Hearth entry load? see above); Assist keeps"
            " Home Assistant's built-in agent",
            HEARTH_AGENT,
        )
        return False
    return True


async def async_wire_hearth(hass: HomeAssistant, spec: HearthSpec) -> None:
    """Wire Hearth in, and point the preferred Assist pipeline at whichever agent exists.

    Without Hearth, a pipeline left on conversation.hearth by an earlier start goes back
    to Home Assistant's own agent, so the Assist dialog keeps working.
    """
    hearth_ready = await _async_wire(hass, spec)
    if not spec.set_pipeline:
        return
    if hearth_ready:
        await _async_set_pipeline_agent(hass, HEARTH_AGENT, spec.prefer_local)
    elif async_get_pipeline(hass).conversation_engine == HEARTH_AGENT:
        await _async_set_pipeline_agent(hass, HOME_ASSISTANT_AGENT)
