"""The engine entry, for every way of adding one (user, reconfigure, reauth, add-on).

Its identity is the server's URL, its data the URL and an optional API key, and it is
saved only after a probe of the server.
"""

from __future__ import annotations

from homeassistant.config_entries import ConfigEntry, ConfigFlow, ConfigFlowResult
from homeassistant.const import CONF_API_KEY, CONF_URL
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from yarl import URL

from .backend.api import HearthAuthError, HearthClient, HearthConnectionError, HearthError
from .backend.base import Backend
from .backend.kinds import async_connect
from .const import (
    DEFAULT_CONVERSATION_NAME,
    DOMAIN,
    LOGGER,
    RECOMMENDED_CONVERSATION_OPTIONS,
    SUBENTRY_CONVERSATION,
)
from .names import address, async_strings, distinct, features_text, hearth_titles, server_name


def normalize_url(url: str) -> str:
    """``scheme://host:port/path`` without a trailing slash: the entry's unique id."""
    parsed = URL(url.strip())
    return f"{parsed.scheme}://{parsed.host}:{parsed.port}{parsed.path.rstrip('/')}".lower()


def engine_data(url: str, api_key: str | None) -> dict[str, str]:
    """The entry's data."""
    data = {CONF_URL: url}
    if api_key:
        data[CONF_API_KEY] = api_key
    return data


async def async_validate(
    hass: HomeAssistant, url: str, api_key: str | None
) -> tuple[str | None, Backend | None]:
    """Probe the server (``/v1/models`` checks the key): (error key or None, what it is)."""
    client = HearthClient(async_get_clientsession(hass), url, api_key)
    try:
        backend = await async_connect(hass, client, api_key)
    except HearthAuthError:
        return "invalid_auth", None
    except HearthConnectionError:
        return "cannot_connect", None
    except HearthError as err:
        LOGGER.warning("Unexpected answer from the server at %s: %s", url, err)
        return "unknown", None
    except Exception:  # noqa: BLE001 - a bug of ours: logged with its traceback, as core does
        LOGGER.exception("Unexpected exception while probing %s", url)
        return "unknown", None
    return None, backend


@callback
def async_entry_for_url(hass: HomeAssistant, url: str) -> ConfigEntry | None:
    """The entry of the server at ``url``, whatever its unique id (an add-on's entry
    has the add-on's slug)."""
    wanted = normalize_url(url)
    return next(
        (
            entry
            for entry in hass.config_entries.async_entries(DOMAIN, include_ignore=False)
            if CONF_URL in entry.data and normalize_url(entry.data[CONF_URL]) == wanted
        ),
        None,
    )


async def async_create_engine_entry(
    flow: ConfigFlow, url: str, api_key: str | None, server: Backend
) -> ConfigFlowResult:
    """Create the engine entry with the default conversation agent; say what was found.

    The entry's title (its engine device's name) is the kind of server in the install's
    language, and the agent is "Hearth"; a name another Hearth device has already gets
    the server's address (``names.distinct``)."""
    strings = await async_strings(flow.hass)
    kind = server_name(strings, server.info.kind)
    taken = hearth_titles(flow.hass)
    title = distinct(kind, address(url), taken)
    agent = distinct(DEFAULT_CONVERSATION_NAME, address(url), [*taken, title])
    return flow.async_create_entry(
        title=title,
        data=engine_data(url, api_key),
        description="detected",
        description_placeholders={
            "server": kind,
            "model": server.info.model or "?",
            "features": features_text(strings, server.features(), server.info.slots),
        },
        subentries=[
            {
                "subentry_type": SUBENTRY_CONVERSATION,
                "data": RECOMMENDED_CONVERSATION_OPTIONS,
                "title": agent,
                "unique_id": None,
            }
        ],
    )
