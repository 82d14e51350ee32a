"""Questions about the house are answered from the house: a turn that asks starts by
reading it (``GetLiveContext``), never by acting.

Home Assistant's prompt tells the model to read live context for questions about the
current state. A small model does not: it answers from nothing ("The garage door is
open."), and shown worked examples of actions (prefix/examples.py) it may act on a question
instead (measured: "Is the front door locked?" unlocked the door). For a question, the
turn's first request names the live-context tool in ``tool_choice``: the engine's
grammar then lets it call only that tool, and the reply comes from its result.

What is a question comes from Home Assistant's own data, in the request's language: a
sentence that matches a template of one of HA's question intents (``QUESTION_INTENTS``:
"is {name} on", "what is the temperature"; any name), or one that ends with a question
mark (``?``, ``？``, or opens with ``¿``). A polite command ("can you turn on the
light?") matches a command's template first and is not a question.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..tool_names import bare_name
from .intents_data import LanguageData, cached_language_data
from .sentences import matches

LIVE_CONTEXT = "GetLiveContext"
# HA's intents that ask about the house rather than act on it.
QUESTION_INTENTS = frozenset({
    "HassGetState", "HassGetWeather", "HassClimateGetTemperature", "HassGetCurrentTime",
    "HassGetCurrentDate", "HassTimerStatus",
})  # fmt: skip
# Intents a polite question asks to have done ("can you turn on the light?"): HA's
# intents that act on a named thing.
ACTS = frozenset({
    "HassTurnOn", "HassTurnOff", "HassLightSet", "HassSetPosition", "HassClimateSetTemperature",
    "HassMediaPause", "HassMediaUnpause", "HassSetVolume", "HassFanSetSpeed", "HassVacuumStart",
})  # fmt: skip
_ASKS = ("?", "？", "¿")


def is_question(
    text: str,
    language: str,
    data: LanguageData | None = None,
    *,
    names: Iterable[tuple[str, str]] | None = None,
    places: tuple[Iterable[str], Iterable[str]] | None = None,
) -> bool:
    """Whether ``text`` asks a question, by ``language``'s intents data (``data``, or
    the loaded data of ``language``: see intents_data.async_language_data) and its
    punctuation; a language without data: by punctuation only. ``names``: the house's
    (name, domain) pairs, where known: a template must then name one of them ("tell
    me a joke" names nothing), and a polite command ("can you turn on the Kitchen
    Light?") is told from a question, by the house's ``places`` (areas, floors) where
    given."""
    said = text.strip()
    if not said:
        return False
    data = data or cached_language_data(language)
    names = list(names) if names is not None else None
    if data is not None:
        if matches(data, said, QUESTION_INTENTS, names):
            return True
        # Its areas and floors are the house's: "did I leave the kitchen light on" is no
        # command whose area is "did I leave".
        if names is not None and matches(data, said, ACTS, names, places):
            return False
    return said.endswith(_ASKS[:2]) or said.startswith(_ASKS[2])


def reads(tool: str) -> bool:
    """Whether ``tool`` only reads the house: the live context, HA's question intents,
    and the ``Get``/``get_`` tools (the date and time, a calendar's events, a to-do
    list's items)."""
    short = bare_name(tool)
    return short == LIVE_CONTEXT or short in QUESTION_INTENTS or short.startswith(("Get", "get_"))


def live_context_tool(tools: Iterable[Mapping[str, Any]]) -> str | None:
    """The offered live-context tool's full name (``homeassistant__GetLiveContext``)."""
    for tool in tools:
        name = str((tool.get("function") or {}).get("name", ""))
        if bare_name(name) == LIVE_CONTEXT:
            return name
    return None
