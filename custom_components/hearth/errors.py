"""Engine errors mapped to Home Assistant exceptions and messages, in one place."""

from __future__ import annotations

from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import translation

from .api import (
    HearthAuthError,
    HearthConnectionError,
    HearthError,
    HearthResponseError,
)
from .const import DOMAIN


def error_key(err: HearthError) -> str:
    """Translation key (``exceptions`` in strings.json) for an engine error."""
    if isinstance(err, HearthAuthError):
        return "invalid_auth"
    if isinstance(err, HearthConnectionError):
        return "cannot_connect"
    if isinstance(err, HearthResponseError):
        if err.code == "context_length_exceeded":
            return "context_length_exceeded"
        if err.status in (429, 503):
            return "engine_busy"
    return "engine_error"


def as_ha_error(err: HearthError) -> HomeAssistantError:
    """A translated ``HomeAssistantError`` for an engine error (actions, setup)."""
    return HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key=error_key(err),
        translation_placeholders={"error": str(err)},
    )


async def async_error_message(
    hass: HomeAssistant, language: str | None, key: str, error: str = ""
) -> str:
    """The message of ``exceptions.<key>`` in ``language`` (English as a fallback)."""
    placeholders = {"error": error}
    if language:
        strings = await translation.async_get_translations(hass, language, "exceptions", {DOMAIN})
        if template := strings.get(f"component.{DOMAIN}.exceptions.{key}.message"):
            return template.format(**placeholders)
    return str(
        HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key=key,
            translation_placeholders=placeholders,
        )
    )
