"""Server errors mapped to Home Assistant exceptions and spoken replies, in one place.

Two clients raise them: the pin API client (``api.HearthError``) and the ``openai`` SDK
for chat (``openai.OpenAIError``: ``APIConnectionError``, ``AuthenticationError``,
``APIStatusError``, an ``APIError`` sent inside a stream). ``error_key`` gives both the
same translation keys: ``exceptions.<key>`` for a raised error (an action, an AI Task),
``common.spoken_<key>`` for what a conversation agent says (hassfest allows free
strings only under ``common``).
"""

from __future__ import annotations

import openai
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import translation

from .api import HearthAuthError, HearthConnectionError, HearthError, HearthResponseError
from .const import DOMAIN

# What a request to the server can raise (for ``except``).
BACKEND_ERRORS: tuple[type[Exception], ...] = (HearthError, openai.OpenAIError)
_BUSY = (429, 503)
COMMON = "common"  # the translation category of what an agent says (``spoken_<key>``)


def is_auth_error(err: Exception) -> bool:
    """Whether the server refused the API key (re-authentication is needed)."""
    return isinstance(err, HearthAuthError | openai.AuthenticationError)


def http_status(err: Exception) -> int | None:
    """The HTTP status the server answered with (None: no answer, or an error sent
    inside a stream)."""
    if isinstance(err, HearthResponseError):
        return err.status
    if isinstance(err, openai.APIStatusError):
        return err.status_code
    return None


def error_code(err: Exception) -> str | None:
    """The server's error code (OpenAI style: ``context_length_exceeded``...)."""
    if isinstance(err, HearthResponseError):
        return err.code
    if isinstance(err, openai.APIError):  # a status error, or one sent inside the stream
        return err.code
    return None


def error_key(err: Exception) -> str:
    """Translation key of a server error (``exceptions.<key>``, ``common.spoken_<key>``)."""
    if is_auth_error(err):
        return "invalid_auth"
    if isinstance(err, HearthConnectionError | openai.APIConnectionError):
        return "cannot_connect"  # includes openai.APITimeoutError
    if error_code(err) == "context_length_exceeded":
        return "context_length_exceeded"
    if http_status(err) in _BUSY:
        return "engine_busy"
    return "engine_error"


def describe(err: Exception) -> str:
    """The error in one line (the server's own message where it sent one)."""
    if isinstance(err, openai.APIStatusError):
        return f"HTTP {err.status_code} ({err.code or 'error'}): {err.message}"
    return str(err)


def as_ha_error(err: Exception) -> HomeAssistantError:
    """A translated ``HomeAssistantError`` for a server error (actions, AI Tasks)."""
    return HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key=error_key(err),
        translation_placeholders={"error": describe(err)},
    )


async def async_spoken(hass: HomeAssistant, language: str | None, key: str, error: str = "") -> str:
    """What an agent says for ``key`` (``common.spoken_<key>`` in strings.json) in ``language``,
    English where that language lacks it."""
    for lang in dict.fromkeys((language or "en", "en")):
        strings = await translation.async_get_translations(hass, lang, COMMON, {DOMAIN})
        if template := strings.get(f"component.{DOMAIN}.{COMMON}.spoken_{key}"):
            return template.format(error=error)
    raise KeyError(f"no spoken message {key!r}")
