"""What an agent says for an error, in the user's language."""

from __future__ import annotations

import pytest
from home_assistant_intents import get_intents
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.const import DOMAIN
from custom_components.hearth.errors import async_spoken


async def test_each_language_speaks_its_own_sentence(hass: HomeAssistant) -> None:
    """Our strings where we have the language (de, and de-CH by its base), HA's own
    Assist sentence where only home-assistant-intents has it (el, cs), else English."""
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, DOMAIN, {})
    english = await async_spoken(hass, "en", "cannot_connect")
    assert english == "Sorry, I cannot reach the Hearth engine. Check that it is running."
    german = "Entschuldigung, ich erreiche die Hearth-Engine nicht. Prüfe, ob sie läuft."
    assert await async_spoken(hass, "de", "cannot_connect") == german
    assert await async_spoken(hass, "de-CH", "cannot_connect") == german
    for language in ("el", "cs"):
        errors = get_intents(language)["responses"]["errors"]
        assert await async_spoken(hass, language, "cannot_connect") == errors["handle_error"]
        assert await async_spoken(hass, language, "markup_only") == errors["no_intent"]
        # The model kept calling until the bound: not understood, not "an error".
        assert await async_spoken(hass, language, "tool_loop_limit") == errors["no_intent"]
        # No fitting Assist sentence for "done": our English one.
        assert await async_spoken(hass, language, "action_done") == "Done."
    # Neither our strings nor HA's intents have Klingon.
    assert await async_spoken(hass, "tlh", "cannot_connect") == english
    hass.config.language = "fr"
    assert await async_spoken(hass, None, "action_done") == "C’est fait."


async def test_an_unknown_message_is_a_bug_not_silence(hass: HomeAssistant) -> None:
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, DOMAIN, {})
    with pytest.raises(KeyError, match="no_such_message"):
        await async_spoken(hass, "de", "no_such_message")
