"""The engine entry's options form: the stall time (real engine, real Home Assistant)."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType, InvalidData

from custom_components.hearth.const import CONF_STALL_TIMEOUT, DEFAULT_STALL_TIMEOUT

from .common import EngineProcess, async_setup_entry, make_entry


async def test_stall_time_is_set_in_the_options_form_and_applies_at_once(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    entry = make_entry(engine.url)
    await async_setup_entry(hass, entry)
    loaded = entry.runtime_data
    assert loaded.backend.chat.stall == DEFAULT_STALL_TIMEOUT

    result = await hass.config_entries.options.async_init(entry.entry_id)
    assert result["type"] is FlowResultType.FORM
    (key,) = result["data_schema"].schema
    assert key == CONF_STALL_TIMEOUT and key.default() == DEFAULT_STALL_TIMEOUT

    result = await hass.config_entries.options.async_configure(
        result["flow_id"], {CONF_STALL_TIMEOUT: 45}
    )
    await hass.async_block_till_done(wait_background_tasks=True)
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert entry.options == {CONF_STALL_TIMEOUT: 45.0}
    assert entry.runtime_data is loaded  # not reloaded: the pins and the agents stay
    assert loaded.backend.chat.stall == 45.0

    # The form opens again with the time that is set.
    result = await hass.config_entries.options.async_init(entry.entry_id)
    (key,) = result["data_schema"].schema
    assert key.default() == 45.0
    hass.config_entries.options.async_abort(result["flow_id"])


@pytest.mark.parametrize("seconds", [0, 4, 121, 3600])
async def test_a_stall_time_out_of_range_is_refused(
    hass: HomeAssistant, house: None, engine: EngineProcess, seconds: float
) -> None:
    entry = make_entry(engine.url, entry_options={CONF_STALL_TIMEOUT: 30.0})
    await async_setup_entry(hass, entry)
    result = await hass.config_entries.options.async_init(entry.entry_id)
    with pytest.raises(InvalidData):
        await hass.config_entries.options.async_configure(
            result["flow_id"], {CONF_STALL_TIMEOUT: seconds}
        )
    assert entry.options == {CONF_STALL_TIMEOUT: 30.0}
    assert entry.runtime_data.backend.chat.stall == 30.0
