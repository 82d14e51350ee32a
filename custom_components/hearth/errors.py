"""Server errors mapped to Home Assistant exceptions and spoken replies, in one place.

Two clients raise them: the pin API client (``api.HearthError``) and the ``openai`` SDK
for chat (``openai.OpenAIError``: ``APIConnectionError``, ``AuthenticationError``,
``APIStatusError``, an ``APIError`` sent inside a stream). ``error_key`` gives both the
same translation keys: ``exceptions.<key>`` for a raised error (an action, an AI Task),
``common.spoken_<key>`` for what a conversation agent says (hassfest allows free
strings only under ``common``).

A request over the model's context is told apart here for every kind of server
(``is_context_exceeded``); what a turn then leaves out, and what it says when nothing
helps (``ContextOverflow``), is ``turn/context_fit.py``'s.
"""

from __future__ import annotations

import openai
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import translation

from .backend.api import HearthAuthError, HearthConnectionError, HearthError, HearthResponseError
from .backend.chat import EngineStalled
from .const import DOMAIN
from .language.intents_data import async_language_data

# What a request to the server can raise (for ``except``).
BACKEND_ERRORS: tuple[type[Exception], ...] = (HearthError, openai.OpenAIError)
_BUSY = (429, 503)
# What Home Assistant's own Assist says (home-assistant-intents, ``responses.errors``)
# that fits an error of ours, for a language we have no strings for: a failure of the
# engine is HA's "an unexpected error occurred"; a turn whose model made no call that
# could run (a reply that was not speech, a call refused, calls until the bound) its "I
# could not understand that". ``action_done`` has no such sentence.
HA_ERRORS: dict[str, str] = {
    "cannot_connect": "handle_error",
    "context_length_exceeded": "handle_error",
    "house_too_big": "handle_error",
    "max_tokens_exceed_context": "handle_error",
    "engine_busy": "handle_error",
    "engine_error": "handle_error",
    "engine_stalled": "handle_error",
    "invalid_auth": "handle_error",
    "tool_loop_limit": "no_intent",
    "markup_only": "no_intent",
    "not_run": "no_intent",
}
COMMON = "common"  # the translation category of what an agent says (``spoken_<key>``)
# How other servers say a request is over the model's context (Hearth's engine, like
# OpenAI, says ``context_length_exceeded``): llama.cpp by its error type, vLLM and SGLang
# only in the message of a 400.
_OVERFLOW_TYPES = frozenset({"exceed_context_size_error"})
_OVERFLOW_MESSAGES = ("maximum context length is", "longer than the model's context length")


class ContextOverflow(HearthError):
    """A turn's request over the model's context with everything that could be left out
    left out (``turn/context_fit.py``); ``key`` names what helps (``house_too_big``,
    ``max_tokens_exceed_context``), ``cause`` is the server's refusal."""

    def __init__(self, key: str, cause: Exception) -> None:
        super().__init__(describe(cause))
        self.key = key
        self.cause = cause


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


def is_context_exceeded(err: Exception) -> bool:
    """Whether the server refused a request for being over the model's context."""
    if error_code(err) == "context_length_exceeded":
        return True
    if not isinstance(err, openai.APIError):
        return False
    if err.type in _OVERFLOW_TYPES:
        return True
    told = err.body.get("message") if isinstance(err.body, dict) else None
    message = f"{err.message} {told if isinstance(told, str) else ''}".lower()
    return http_status(err) == 400 and any(said in message for said in _OVERFLOW_MESSAGES)


def error_key(err: Exception) -> str:
    """Translation key of a server error (``exceptions.<key>``, ``common.spoken_<key>``)."""
    if isinstance(err, ContextOverflow):
        return err.key
    if is_auth_error(err):
        return "invalid_auth"
    if isinstance(err, EngineStalled):
        return "engine_stalled"  # before cannot_connect: it is an APITimeoutError too
    if isinstance(err, HearthConnectionError | openai.APIConnectionError):
        return "cannot_connect"  # includes openai.APITimeoutError
    if is_context_exceeded(err):
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
    """What an agent says for ``key`` (``common.spoken_<key>`` in strings.json) in
    ``language``: our own translation where there is one (the language, or its base:
    ``de`` for ``de-CH``), else the sentence Home Assistant's own Assist speaks for such
    a failure in that language (``HA_ERRORS``), else English."""
    language = language or hass.config.language or "en"
    english = await _async_strings(hass, "en")
    name = f"component.{DOMAIN}.{COMMON}.spoken_{key}"
    if name not in english:
        raise KeyError(f"no spoken message {key!r}")
    for lang in dict.fromkeys((language, language.split("-")[0])):
        if lang == "en":
            break
        ours = (await _async_strings(hass, lang)).get(name)
        if ours is not None and ours != english[name]:  # HA fills gaps with English
            return ours.format(error=error)
    if language.split("-")[0] != "en" and (ha_key := HA_ERRORS.get(key)) is not None:
        data = await async_language_data(hass, language)
        if data is not None and (said := data.errors.get(ha_key)):
            return said
    return english[name].format(error=error)


async def _async_strings(hass: HomeAssistant, language: str) -> dict[str, str]:
    return await translation.async_get_translations(hass, language, COMMON, {DOMAIN})
