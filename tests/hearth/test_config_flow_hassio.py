"""Supervisor discovery of the engine add-on (``async_step_hassio``), on real engines.

The Supervisor cannot run here. Each test stands in for it: it builds the
``HassioServiceInfo`` that HA's hassio integration builds from the add-on's announcement
(``hassio/discovery.py``: the add-on's config plus its name under ``addon``) and starts
the flow with the source hassio uses. Everything after that is real: the flow, the probe
of a real engine process on a loopback port, the entry's setup and its pins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from homeassistant.config_entries import (
    SOURCE_HASSIO,
    SOURCE_IGNORE,
    SOURCE_USER,
    ConfigEntryState,
    ConfigSubentryData,
)
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers.discovery_flow import DiscoveryKey
from homeassistant.helpers.service_info.hassio import HassioServiceInfo
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.const import (
    DOMAIN,
    RECOMMENDED_CONVERSATION_OPTIONS,
    SUBENTRY_CONVERSATION,
)

from .common import (
    ENGINE_KEY,
    EngineProcess,
    agent_options,
    async_setup_entry,
    free_port,
    make_entry,
)

SLUG = "a0d7b954_hearth"  # an add-on from a repository; a local one is "local_hearth"
ADDON_NAME = "Hearth engine"


@pytest.fixture(autouse=True)
async def core(hass: HomeAssistant) -> None:
    """HA's core integration: the conversation dependency needs it (toolchain.md)."""
    assert await async_setup_component(hass, "homeassistant", {})


def addon_info(port: int, api_key: str | None = None, slug: str = SLUG) -> HassioServiceInfo:
    """What hassio hands the flow for the add-on's announcement (see the module doc)."""
    config: dict[str, Any] = {"host": "127.0.0.1", "port": port, "addon": ADDON_NAME}
    if api_key is not None:
        config["api_key"] = api_key
    return HassioServiceInfo(
        config=config, name=ADDON_NAME, slug=slug, uuid="5a0c6f1e8f0d4b7f9c6a2e1d3b4c5d6e"
    )


def _discovery_key(info: HassioServiceInfo) -> DiscoveryKey:
    return DiscoveryKey(domain="hassio", key=info.uuid, version=1)


async def _discover(hass: HomeAssistant, info: HassioServiceInfo) -> dict[str, Any]:
    """Start the flow as hassio's ``async_process_new`` does."""
    context = {"source": SOURCE_HASSIO, "discovery_key": _discovery_key(info)}
    return dict(await hass.config_entries.flow.async_init(DOMAIN, context=context, data=info))


def _addon_entry(url: str, api_key: str | None = None, slug: str = SLUG) -> MockConfigEntry:
    """An entry the add-on's discovery made earlier (as ``make_entry``'s, but from hassio)."""
    data = {CONF_URL: url} | ({CONF_API_KEY: api_key} if api_key else {})
    return MockConfigEntry(
        domain=DOMAIN,
        title="Hearth",
        data=data,
        source=SOURCE_HASSIO,
        unique_id=slug,
        subentries_data=[
            ConfigSubentryData(
                data=agent_options(),
                subentry_type=SUBENTRY_CONVERSATION,
                title="Hearth",
                unique_id=None,
            )
        ],
    )


async def test_discovered_addon_is_confirmed_and_added(
    hass: HomeAssistant, house: None, keyed: EngineProcess
) -> None:
    info = addon_info(keyed.port, ENGINE_KEY)
    result = await _discover(hass, info)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "hassio_confirm"
    assert result["description_placeholders"] == {"addon": ADDON_NAME}
    assert result["errors"] == {}
    (flow,) = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert flow["context"]["title_placeholders"] == {"name": ADDON_NAME}
    assert flow["context"]["confirm_only"] is True

    result = dict(await hass.config_entries.flow.async_configure(result["flow_id"], {}))
    await hass.async_block_till_done(wait_background_tasks=True)

    assert result["type"] is FlowResultType.CREATE_ENTRY
    # The same data and agent as the user step makes.
    assert result["data"] == {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    entry = result["result"]
    assert entry.unique_id == SLUG
    assert entry.source == SOURCE_HASSIO
    assert entry.discovery_keys == {"hassio": (_discovery_key(info),)}
    (subentry,) = entry.subentries.values()
    assert subentry.subentry_type == SUBENTRY_CONVERSATION
    assert subentry.title == "Hearth"
    assert dict(subentry.data) == RECOMMENDED_CONVERSATION_OPTIONS
    assert entry.state is ConfigEntryState.LOADED
    assert f"hearth.{subentry.subentry_id}" in keyed.pins()


async def test_confirm_while_the_engine_is_down_then_up(
    hass: HomeAssistant, socket_enabled: None, tmp_path: Path
) -> None:
    """The add-on may still be loading its model: the form says so and stays."""
    engine = EngineProcess(free_port(), tmp_path / "engine.log")  # announced, not started
    result = await _discover(hass, addon_info(engine.port))
    result = dict(await hass.config_entries.flow.async_configure(result["flow_id"], {}))
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "hassio_confirm"
    assert result["errors"] == {"base": "cannot_connect"}
    assert not hass.config_entries.async_entries(DOMAIN)

    await hass.async_add_executor_job(engine.start)
    try:
        result = dict(await hass.config_entries.flow.async_configure(result["flow_id"], {}))
        await hass.async_block_till_done(wait_background_tasks=True)
        assert result["type"] is FlowResultType.CREATE_ENTRY
        assert result["data"] == {CONF_URL: engine.url}
        assert result["result"].state is ConfigEntryState.LOADED
        assert await hass.config_entries.async_unload(result["result"].entry_id)
    finally:
        await hass.async_add_executor_job(engine.stop)


async def test_confirm_with_a_refused_key(hass: HomeAssistant, keyed: EngineProcess) -> None:
    result = await _discover(hass, addon_info(keyed.port, "not-the-key"))
    result = dict(await hass.config_entries.flow.async_configure(result["flow_id"], {}))
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "invalid_auth"}


async def test_rediscovery_of_a_configured_addon_aborts(hass: HomeAssistant) -> None:
    """The Supervisor replays its announcements at every start: nothing changes."""
    entry = _addon_entry("http://127.0.0.1:8765", "key-1")
    entry.add_to_hass(hass)
    result = await _discover(hass, addon_info(8765, "key-1"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert dict(entry.data) == {CONF_URL: "http://127.0.0.1:8765", CONF_API_KEY: "key-1"}
    assert entry.state is ConfigEntryState.NOT_LOADED  # unchanged: not reloaded


async def test_rediscovery_with_a_new_host_and_key_moves_the_entry(
    hass: HomeAssistant, house: None, engine: EngineProcess, keyed: EngineProcess
) -> None:
    entry = _addon_entry(engine.url)
    await async_setup_entry(hass, entry)
    assert entry.state is ConfigEntryState.LOADED

    result = await _discover(hass, addon_info(keyed.port, ENGINE_KEY))
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert dict(entry.data) == {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    assert entry.unique_id == SLUG
    assert entry.state is ConfigEntryState.LOADED
    assert entry.runtime_data.client.url == keyed.url  # reloaded onto the new engine
    assert f"hearth.{next(iter(entry.subentries))}" in keyed.pins()


async def test_rediscovery_with_a_new_key_repairs_a_refused_entry(
    hass: HomeAssistant, house: None, keyed: EngineProcess
) -> None:
    """A reinstalled add-on makes a new key: the entry that failed on the old one
    takes the new one and sets up."""
    entry = _addon_entry(keyed.url, "old-key")
    entry.add_to_hass(hass)
    assert not await hass.config_entries.async_setup(entry.entry_id)
    assert entry.state is ConfigEntryState.SETUP_ERROR

    result = await _discover(hass, addon_info(keyed.port, ENGINE_KEY))
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["reason"] == "already_configured"
    assert entry.data[CONF_API_KEY] == ENGINE_KEY
    assert entry.state is ConfigEntryState.LOADED


async def test_an_entry_added_by_hand_follows_the_addon(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """The add-on's engine was added through the user step before: no second entry;
    the entry takes the add-on's slug, and the user step still finds it."""
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)

    result = await _discover(hass, addon_info(engine.port, slug="local_hearth"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert entry.unique_id == "local_hearth"
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1

    result = dict(
        await hass.config_entries.flow.async_init(DOMAIN, context={"source": SOURCE_USER})
    )
    result = dict(
        await hass.config_entries.flow.async_configure(result["flow_id"], {CONF_URL: engine.url})
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def test_an_ignored_addon_stays_ignored(hass: HomeAssistant) -> None:
    ignored = MockConfigEntry(domain=DOMAIN, source=SOURCE_IGNORE, unique_id=SLUG, data={})
    ignored.add_to_hass(hass)
    result = await _discover(hass, addon_info(8765, "key-1"))
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert dict(ignored.data) == {}


async def test_two_installs_of_the_addon_are_two_engines(hass: HomeAssistant) -> None:
    """A local add-on beside a repository's: another slug, another host, another entry."""
    _addon_entry("http://127.0.0.1:8765", "key-1", slug="local_hearth").add_to_hass(hass)
    result = await _discover(hass, addon_info(8766, "key-2", slug=SLUG))
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "hassio_confirm"


@pytest.mark.parametrize(
    "config",
    [
        {"port": 8765},
        {"host": "", "port": 8765},
        {"host": "bad host", "port": 8765},
        {"host": "127.0.0.1"},
        {"host": "127.0.0.1", "port": "http"},
        {"host": "127.0.0.1", "port": 70000},
    ],
)
async def test_an_unusable_announcement_aborts(hass: HomeAssistant, config: dict[str, Any]) -> None:
    info = HassioServiceInfo(config=config, name=ADDON_NAME, slug=SLUG, uuid="0" * 32)
    result = await _discover(hass, info)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "invalid_discovery_info"


async def test_reconfigure_of_the_addon_entry(
    hass: HomeAssistant, house: None, engine: EngineProcess, keyed: EngineProcess
) -> None:
    """The same engine keeps the add-on's slug; another engine makes it the entry of
    that URL (the add-on's announcements then no longer move it)."""
    entry = _addon_entry(engine.url)
    await async_setup_entry(hass, entry)

    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: engine.url + "/"}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["reason"] == "reconfigure_successful"
    assert entry.unique_id == SLUG

    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_URL: keyed.url, CONF_API_KEY: ENGINE_KEY}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["reason"] == "reconfigure_successful"
    assert entry.unique_id == keyed.url
    assert entry.state is ConfigEntryState.LOADED
