"""Home Assistant's own language data (``home-assistant-intents``), loaded per language.

Everything that helps a small model in the user's language comes from here: the
sentence templates of every built-in intent (worked examples, the nearest example,
question detection) and the responses Home Assistant speaks for them. The package ships
one JSON file per language; ``hassil`` parses its templates. Loading costs time (tens
to hundreds of ms: the English templates are the largest), so a language is loaded once,
in the executor (``async_language_data``), and kept for the process: it is the
package's immutable data, the same for every house. The sync functions that build
prompts read it with ``cached_language_data`` and see None until it is loaded.
Loading also reads the number words its range lists need (``unicode_rbnf``'s XML rules,
which hassil would otherwise open on first use, inside the event loop), so nothing
that reads a loaded language opens a file.

A language the package does not have (see ``supported``) gets None: no examples, no
hint, and only punctuation tells a question.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hassil import Intents, RangeSlotList
from hassil.numbers import get_rbnf_engine
from home_assistant_intents import get_intents, get_languages
from homeassistant.core import HomeAssistant
from homeassistant.util import language as language_util

from ..const import LOGGER
from .words import said_by

# The value an example says for a number slot, by the range's type (HA's list types).
_RANGE_VALUES = {"percentage": 40, "temperature": 21}


@dataclass(frozen=True, slots=True)
class LanguageData:
    """One language's intents: ``intents`` (hassil, parsed), ``responses`` (intent ->
    response key -> HA's Jinja template of what it speaks), ``errors`` (what Assist
    says when it fails: ``handle_error``, ``no_intent``...) and ``language`` (the
    package's variant: ``de`` for ``de-DE``)."""

    language: str
    intents: Intents
    responses: Mapping[str, Mapping[str, str]]
    errors: Mapping[str, str] = field(default_factory=dict)
    load_ms: float = 0.0
    # Sentences said so far (sentences.say): the same house asks for the same ones.
    said: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def response(self, intent: str, key: str | None) -> str | None:
        """HA's response template for ``intent`` under ``key`` (or its default)."""
        found = self.responses.get(intent) or {}
        return found.get(key or "default") or found.get("default")

    def range_value(self, list_name: str) -> int | None:
        """The number an example says for the range list ``list_name`` (None: not a
        range): 40 for a percentage, 21 degrees, else a tenth of the way up."""
        found = self.intents.slot_lists.get(list_name)
        if not isinstance(found, RangeSlotList):
            return None
        if (value := _RANGE_VALUES.get(str(found.type.value))) is not None:
            return value
        step = max(found.step, 1)
        return int(found.start + ((found.stop - found.start) // 10 // step) * step)


def variant(language: str) -> str | None:
    """The package's language for ``language`` (``en`` for ``en-GB``), None if none."""
    found = language_util.matches(language, get_languages())
    return found[0] if found else None


def supported(language: str) -> bool:
    """Whether Home Assistant's intents data has ``language``."""
    return variant(language) is not None


def load_language_data(language: str) -> LanguageData | None:
    """Read and parse one language's intents (blocking: file I/O and parsing)."""
    chosen = variant(language)
    if chosen is None:
        return None
    started = time.perf_counter()
    raw: dict[str, Any] | None = get_intents(chosen)
    if not raw:
        return None
    intents = Intents.from_dict(raw)
    for intent in intents.intents.values():  # hassil parses templates on first use
        for block in intent.data:
            _ = block.sentences
    responses = (raw.get("responses") or {}).get("intents") or {}
    errors = (raw.get("responses") or {}).get("errors") or {}
    data = LanguageData(chosen, intents, responses, errors)
    said_by(data)  # the words of every intent (hints read them), counted once here
    _load_number_words(intents, chosen)
    load_ms = round((time.perf_counter() - started) * 1000, 1)
    LOGGER.debug("Loaded Home Assistant's intents for %s in %s ms", chosen, load_ms)
    return dataclasses.replace(data, load_ms=load_ms, said=data.said)  # keeps the counts


def _load_number_words(intents: Intents, language: str) -> None:
    """Read the number-word rules of every language ``intents``' range lists say their
    numbers in (the data's own, or a list's ``words_language``) into hassil's cache,
    which its matcher and sampler read from then on. A language without rules is
    skipped: hassil says so where a list needs it (and numbers in digits still match)."""
    lists = [*intents.slot_lists.values()]
    lists += [
        found for i in intents.intents.values() for b in i.data for found in b.slot_lists.values()
    ]
    spoken = {
        found.words_language or language
        for found in lists
        if isinstance(found, RangeSlotList) and found.words
    }
    for words_language in sorted(spoken):
        try:
            get_rbnf_engine(words_language)
        except ValueError:
            LOGGER.debug("No number words for %s: numbers match in digits", words_language)


class _Loaded:
    """Languages loaded so far (the package's data: one copy per process)."""

    def __init__(self) -> None:
        self.data: dict[str, LanguageData | None] = {}
        self.lock = threading.Lock()

    def get(self, language: str) -> tuple[bool, LanguageData | None]:
        key = language.lower()
        with self.lock:
            return key in self.data, self.data.get(key)

    def load(self, language: str) -> LanguageData | None:
        known, found = self.get(language)
        if known:
            return found
        found = load_language_data(language)
        with self.lock:
            return self.data.setdefault(language.lower(), found)


_LOADED = _Loaded()


async def async_language_data(hass: HomeAssistant, language: str) -> LanguageData | None:
    """``language``'s data, loaded in the executor the first time it is asked for."""
    known, found = _LOADED.get(language)
    if known:
        return found
    return await hass.async_add_executor_job(_LOADED.load, language)


def cached_language_data(language: str) -> LanguageData | None:
    """``language``'s data if it was loaded (see ``async_language_data``), else None."""
    return _LOADED.get(language)[1]
