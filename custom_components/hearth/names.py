"""Names the integration gives: server kinds, what a server offers, and default titles.

The words come from ``strings.json`` (``common.server_<kind>``, ``common.feature_<key>``)
in the install's language. Entry and subentry titles are plain strings in Home
Assistant, so a default title is made once, in the language of the install when it is
created; the user may rename it later.

Titles are the names of devices (an engine entry's and each agent's), and the names of
their entities follow them, so two entries must not give two devices one name: a default
that is taken gets the server's address (``Hearth engine (10.0.0.5:8765)``), and a
number where even that is taken.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from homeassistant.core import HomeAssistant
from homeassistant.helpers import translation

from .backend.server_info import ServerKind
from .const import DOMAIN

COMMON = "common"


async def async_strings(hass: HomeAssistant, language: str | None = None) -> dict[str, str]:
    """The integration's ``common`` strings in ``language`` (default: the install's);
    Home Assistant fills what a language lacks with English."""
    language = language or hass.config.language or "en"
    return await translation.async_get_translations(hass, language, COMMON, {DOMAIN})


def _word(strings: dict[str, str], key: str) -> str:
    return strings[f"component.{DOMAIN}.{COMMON}.{key}"]


def server_name(strings: dict[str, str], kind: ServerKind) -> str:
    """The kind of server in words (``Hearth engine``, ``llama.cpp server``...)."""
    return _word(strings, f"server_{kind.value}")


def features_text(strings: dict[str, str], features: Iterable[str], slots: int = 0) -> str:
    """What a server offers (``Backend.features()``'s keys) as one line of words."""
    return ", ".join(_word(strings, f"feature_{key}").format(slots=slots) for key in features)


def address(url: str) -> str:
    """``host:port`` (and a path, where there is one) of ``url``, without credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return netloc + parts.path.rstrip("/")


def distinct(name: str, where: str, taken: Iterable[str]) -> str:
    """``name``, or ``name (where)`` when another device has it, or a numbered one."""
    used = {t.casefold() for t in taken}
    candidates = (name, f"{name} ({where})")
    for candidate in candidates:
        if candidate.casefold() not in used:
            return candidate
    number = 2
    while f"{candidates[-1]} {number}".casefold() in used:
        number += 1
    return f"{candidates[-1]} {number}"


def hearth_titles(hass: HomeAssistant) -> list[str]:
    """Every title of a Hearth entry and subentry: the names its devices are given."""
    return [
        title
        for entry in hass.config_entries.async_entries(DOMAIN, include_ignore=False)
        for title in (entry.title, *(s.title for s in entry.subentries.values()))
    ]
