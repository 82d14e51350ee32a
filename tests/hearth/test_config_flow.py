"""Config flow, reauth, reconfigure and the conversation subentry (real engines)."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from homeassistant.components.conversation import ConversationEntityFeature
from homeassistant.config_entries import SOURCE_USER, ConfigEntryState
from homeassistant.const import CONF_API_KEY, CONF_LLM_HASS_API, CONF_NAME, CONF_PROMPT, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import llm
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.backend.api import HearthClient, HearthResponseError
from custom_components.hearth.const import (
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_REPIN_DEBOUNCE,
    CONF_TEMPERATURE,
    DOMAIN,
    RECOMMENDED_CONVERSATION_OPTIONS,
    SUBENTRY_CONVERSATION,
)

from .common import ENGINE_KEY, EngineProcess, async_setup_entry, free_port, make_entry


async def _start(hass: HomeAssistant) -> str:
    result = await hass.config_entries.flow.async_init(DOMAIN, context={"source": SOURCE_USER})
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "user"
    assert result["errors"] == {}
    return str(result["flow_id"])


async def test_user_flow_creates_engine_and_default_agent(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    flow_id = await _start(hass)
    result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: engine.url + "/"})
    await hass.async_block_till_done(wait_background_tasks=True)

    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {CONF_URL: engine.url}
    entry = result["result"]
    assert entry.unique_id == engine.url
    (subentry,) = entry.subentries.values()
    assert subentry.subentry_type == SUBENTRY_CONVERSATION
    assert subentry.title == "Hearth"
    assert dict(subentry.data) == RECOMMENDED_CONVERSATION_OPTIONS
    assert subentry.data[CONF_PROMPT] == llm.DEFAULT_INSTRUCTIONS_PROMPT
    assert subentry.data[CONF_LLM_HASS_API] == [llm.LLM_API_ASSIST]
    assert entry.state is ConfigEntryState.LOADED
    assert hass.states.get("conversation.hearth") is not None
    assert f"hearth.{subentry.subentry_id}" in engine.pins()

    # The same engine again: one entry per engine.
    flow_id = await _start(hass)
    result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: engine.url})
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def test_user_flow_cannot_connect_then_recovers(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    flow_id = await _start(hass)
    result = await hass.config_entries.flow.async_configure(
        flow_id,
        {CONF_URL: f"http://127.0.0.1:{free_port()}"},  # nothing listens there
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}

    result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: "not a url"})
    assert result["errors"] == {"base": "invalid_url"}

    result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: engine.url})
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY


async def test_user_flow_invalid_auth_then_recovers(
    hass: HomeAssistant, house: None, keyed: EngineProcess
) -> None:
    flow_id = await _start(hass)
    result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: keyed.url})
    assert result["errors"] == {"base": "invalid_auth"}  # /health is open, /v1/models is not

    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: keyed.url, CONF_API_KEY: "wrong"}
    )
    assert result["errors"] == {"base": "invalid_auth"}

    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_URL: keyed.url, CONF_API_KEY: f" {ENGINE_KEY} "}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"] == {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    assert result["result"].state is ConfigEntryState.LOADED


async def test_user_flow_unknown_error(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """An unexpected engine answer is "unknown". Mocked: the real engine cannot be made
    to answer /v1/models with an unexpected error."""
    flow_id = await _start(hass)
    with patch.object(
        HearthClient,
        "async_models",
        side_effect=HearthResponseError(500, "internal_error", "boom"),
    ):
        result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: engine.url})
    assert result["errors"] == {"base": "unknown"}


async def test_user_flow_unexpected_exception_is_logged(
    hass: HomeAssistant, house: None, engine: EngineProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug while probing shows "unknown" and logs its traceback. Mocked: a bug of ours
    is what this stands in for."""
    flow_id = await _start(hass)
    with patch.object(HearthClient, "async_models", side_effect=RuntimeError("bug")):
        result = await hass.config_entries.flow.async_configure(flow_id, {CONF_URL: engine.url})
    assert result["errors"] == {"base": "unknown"}
    assert "Unexpected exception while probing" in caplog.text
    assert "RuntimeError: bug" in caplog.text


async def test_reauth(hass: HomeAssistant, house: None, keyed: EngineProcess) -> None:
    """A refused key fails the setup and starts reauth; a good key loads the entry."""
    entry = make_entry(keyed.url, api_key="stale-key")
    entry.add_to_hass(hass)
    assert not await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.SETUP_ERROR

    (flow,) = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert flow["context"]["source"] == "reauth"
    assert flow["step_id"] == "reauth_confirm"

    result = await hass.config_entries.flow.async_configure(
        flow["flow_id"], {CONF_API_KEY: "still-wrong"}
    )
    assert result["errors"] == {"base": "invalid_auth"}

    result = await hass.config_entries.flow.async_configure(
        flow["flow_id"], {CONF_API_KEY: ENGINE_KEY}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reauth_successful"
    assert entry.data[CONF_API_KEY] == ENGINE_KEY
    assert entry.state is ConfigEntryState.LOADED
    assert f"hearth.{next(iter(entry.subentries))}" in keyed.pins()


async def test_reconfigure_moves_to_another_engine(
    hass: HomeAssistant, house: None, engine: EngineProcess, keyed: EngineProcess
) -> None:
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)

    result = await entry.start_reconfigure_flow(hass)
    assert result["step_id"] == "reconfigure"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: keyed.url}
    )
    assert result["errors"] == {"base": "invalid_auth"}
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert entry.data == {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    assert entry.unique_id == keyed.url
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.client.url == keyed.url
    assert f"hearth.{next(iter(entry.subentries))}" in keyed.pins()


async def test_reconfigure_to_a_configured_engine_aborts(
    hass: HomeAssistant, house: None, engine: EngineProcess, keyed: EngineProcess
) -> None:
    MockConfigEntry(domain=DOMAIN, data={CONF_URL: keyed.url}, unique_id=keyed.url).add_to_hass(
        hass
    )
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert entry.data == {CONF_URL: engine.url}


async def test_conversation_subentry(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """Add a second agent, then reconfigure it without an LLM API."""
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)

    result = await hass.config_entries.subentries.async_init(
        (entry.entry_id, SUBENTRY_CONVERSATION), context={"source": SOURCE_USER}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "set_options"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Kitchen Helper",
            CONF_PROMPT: "You are the kitchen helper.",
            CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
            CONF_MAX_HISTORY: 4.0,
            CONF_TEMPERATURE: 0.2,
            CONF_MAX_TOKENS: 128.0,
            CONF_REPIN_DEBOUNCE: 1.5,
        },
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    subentry = next(s for s in entry.subentries.values() if s.title == "Kitchen Helper")
    assert dict(subentry.data) == {
        CONF_PROMPT: "You are the kitchen helper.",
        CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
        CONF_MAX_HISTORY: 4,
        CONF_TEMPERATURE: 0.2,
        CONF_MAX_TOKENS: 128,
        CONF_REPIN_DEBOUNCE: 1.5,
    }
    state = hass.states.get("conversation.kitchen_helper")
    assert state is not None
    assert state.attributes["supported_features"] == ConversationEntityFeature.CONTROL
    pin = f"hearth.{subentry.subentry_id}"
    assert pin in engine.pins()

    result = await entry.start_subentry_reconfigure_flow(hass, subentry.subentry_id)
    assert result["step_id"] == "set_options"
    result = await hass.config_entries.subentries.async_configure(
        result["flow_id"], {CONF_PROMPT: "You are the kitchen helper."}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert CONF_LLM_HASS_API not in entry.subentries[subentry.subentry_id].data
    state = hass.states.get("conversation.kitchen_helper")
    assert state.attributes["supported_features"] == 0
    # The first agent is untouched.
    assert hass.states.get("conversation.hearth") is not None
