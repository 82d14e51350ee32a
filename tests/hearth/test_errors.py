"""What an agent says for an error, in a language the integration has no strings for."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.const import DOMAIN
from custom_components.hearth.errors import async_spoken


async def test_a_language_without_strings_speaks_english(hass: HomeAssistant) -> None:
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, DOMAIN, {})
    english = await async_spoken(hass, "en", "cannot_connect")
    assert english == "Sorry, I cannot reach the Hearth engine. Check that it is running."
    assert await async_spoken(hass, "de", "cannot_connect") == english
    assert await async_spoken(hass, None, "cannot_connect") == english


async def test_an_unknown_message_is_a_bug_not_silence(hass: HomeAssistant) -> None:
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, DOMAIN, {})
    with pytest.raises(KeyError, match="no_such_message"):
        await async_spoken(hass, "de", "no_such_message")
