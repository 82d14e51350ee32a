"""The worked example nearest to this turn's request, shown right before it.

The pinned examples (examples.py) teach a small model the call format, but which tool it
picks leans on the last example it saw: the default model set thermostats with
``HassSetPosition`` because that came last. So a turn also gets one more example, chosen
for its request, in the request's language: the request is matched against Home
Assistant's own sentence templates (``home-assistant-intents``, with this house's
names, aliases and areas as slot lists, as HA's matcher does; a name the house does not
have still matches a template), which gives the intent it asks for and what it names.
Where no template matches, the example whose sentence shares the most words with the
request is taken (words: Unicode ``\\w+``; for a script written without spaces,
character pairs). The example is of that intent, on another thing of the same domain
where the house has one (a small model copies names), so it shows the call, not the
answer. A question gets a question's example (``GetLiveContext``, the thing's real
live-context entry, and HA's answer to it).

The hint also says what the request is about (``Hint.domains``): entity.py then lets a
command call only the tools that act on those domains (house_values.allowed_for).

It is not pinned: it differs per request, so its 60-120 tokens are prefilled with the
request. ``hint_messages`` is pure; ``house_hint`` reads the house.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hassil import RecognizeResult
from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar

from .examples import (
    LIVE_CONTEXT,
    NOTHING,
    STEPS,
    House,
    Step,
    Thing,
    exposed_things,
    offered_tools,
)
from .intents_data import LanguageData, cached_language_data
from .questions import QUESTION_INTENTS, is_question
from .sentences import AREA, NAME, recognize, slot_lists

HINT_CALL_ID = "example_hint"
# Domains a question that names nothing is asked of (HA's yes-or-no things).
YES_OR_NO = ("switch", "light")
# The share of an example sentence's words (less the names) a request must say for
# the example to be taken when no template matches it.
MIN_OVERLAP = 0.5
_WORDS = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class Hint:
    """A request's nearest example (``messages``, OpenAI chat messages; empty: none)
    and the domains it is about: those the request names (its things', or a domain a
    template says, "lights"); none where it names none and its example names nothing
    (a timer); None where not known (the example's domain is only a guess)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    domains: frozenset[str] | None = None

    def __bool__(self) -> bool:
        return bool(self.messages)


def words(text: str) -> set[str]:
    """The words of ``text``, in any script: lower-case ``\\w+`` runs, and for runs of
    a script written without spaces (CJK, Thai...) their character pairs."""
    found: set[str] = set()
    for word in _WORDS.findall(unicodedata.normalize("NFKC", text).casefold()):
        if any(_unspaced(ch) for ch in word) and len(word) > 1:
            found |= {word[i : i + 2] for i in range(len(word) - 1)}
        else:
            found.add(word)
    return found


def _unspaced(ch: str) -> bool:
    name = unicodedata.name(ch, "")
    return name.startswith(("CJK", "HIRAGANA", "KATAKANA", "THAI", "HANGUL", "LAO", "KHMER"))


def hint_messages(
    text: str,
    things: Iterable[Thing],
    areas: Iterable[str],
    tools: Iterable[Mapping[str, Any]],
    live: Mapping[str, Mapping[str, Any]],
    *,
    question: bool = False,
    data: LanguageData | None = None,
) -> Hint:
    """The example turn (OpenAI messages) nearest to the request ``text`` in a house
    with ``things``, ``areas`` (names), ``tools`` and ``live`` (entity id -> its
    live-context entry, which a question's example reads), in ``data``'s language; an
    empty Hint when nothing is near enough or there is no data. ``question``: the
    request asks about the house."""
    tools = list(tools)
    if data is None or not tools:
        return Hint()
    things = list(things)
    areas = list(areas)
    house = House.of(things, areas)
    offered = offered_tools(tools)
    names = [(n, t.domain) for t in things for n in (t.name, *t.aliases)]
    wanted = set(offered) | set(QUESTION_INTENTS if question else ())
    result = recognize(data, text, slot_lists(names, areas), wanted)
    if result is None:
        return _nearest(data, text, things, house, offered)
    found = _named(result, things)
    if result.unmatched_entities and not found:
        return Hint()  # a name the house does not have, like none of its names
    domains = {t.domain for t in found} | _said_domains(result)
    area = _said(result, AREA)

    def rank(thing: Thing) -> tuple[int, int]:
        # Among the others, for a question one whose state says the most (a player that
        # plays shows its title), then the one least like the request.
        said = len((live.get(thing.entity_id) or {}).get("attributes") or {})
        return (said if question else 0, -len(words(thing.name) & words(text)))

    avoid = frozenset(t.entity_id for t in found)
    intent = result.intent.name
    if question or intent in QUESTION_INTENTS:
        asked = [*sorted(domains), *YES_OR_NO] if domains else [*sorted(house.by_domain)]
        for domain in asked:
            step = Step(LIVE_CONTEXT, domain)
            turn = house.turn(data, step, offered, HINT_CALL_ID, avoid=avoid, live=live, rank=rank)
            if turn is not None:
                return Hint(turn, frozenset(domains) or None)
        return Hint()
    if not domains and not _takes_target(result):
        turn = house.turn(data, Step(intent, NOTHING), offered, HINT_CALL_ID)
        return Hint(turn or [], frozenset())
    for domain in sorted(domains) or _guess(result, house):
        turn = None
        if area and not found:  # an area, not a thing: the example names another area's
            elsewhere = frozenset(t.entity_id for t in things if t.area == area)
            step = Step(intent, domain)
            turn = house.turn(data, step, offered, HINT_CALL_ID, avoid=elsewhere, by_area=True)
        turn = turn or house.turn(data, Step(intent, domain), offered, HINT_CALL_ID,
                                  avoid=avoid, rank=rank)  # fmt: skip
        if turn is not None:
            return Hint(turn, frozenset(domains) or None)
    return Hint()


def _named(result: RecognizeResult, things: list[Thing]) -> list[Thing]:
    """The things ``result`` names: by a name of theirs, or (a name the house does not
    have) the things whose name shares the most words with what was said."""
    if (said := _said(result, NAME)) is not None:
        return [t for t in things if said in {t.name, *t.aliases}]
    unmatched = result.unmatched_entities.get(NAME)
    if unmatched is None:
        return []
    asked = words(str(getattr(unmatched, "text", "")))
    scored = [(len(asked & words(" ".join((t.name, *t.aliases)))), t) for t in things]
    best = max((score for score, _ in scored), default=0)
    return [t for score, t in scored if best and score == best]


def _said(result: RecognizeResult, slot: str) -> str | None:
    entity = result.entities.get(slot)
    return None if entity is None or entity.value is None else str(entity.value)


def _said_domains(result: RecognizeResult) -> set[str]:
    """A domain the matched template says ("the lights": ``domain: light``)."""
    value = _said(result, "domain")
    return {value} if value else set()


def _takes_target(result: RecognizeResult) -> bool:
    """Whether the matched template names a thing, an area or a floor."""
    named = set(result.entities) | set(result.unmatched_entities)
    return bool(named & {NAME, AREA, "floor"}) or bool(result.intent_data.requires_context)


def _guess(result: RecognizeResult, house: House) -> list[str]:
    """Domains the matched template may act on, that the house has."""
    required = (result.intent_data.requires_context or {}).get("domain") or []
    required = [required] if isinstance(required, str) else list(required)
    return [d for d in required if d in house.by_domain]


def _nearest(
    data: LanguageData,
    text: str,
    things: list[Thing],
    house: House,
    offered: Mapping[str, tuple[str, tuple[str, ...]]],
) -> Hint:
    """No template matches ``text``: the example whose sentence's words (less the
    thing's name) the request says most of, if it says at least ``MIN_OVERLAP``."""
    asked = words(text)
    named = {t.domain for t in things if words(t.name) and words(t.name) <= asked}
    best: tuple[float, list[dict[str, Any]], Step] | None = None
    for step in STEPS:
        if step.intent == LIVE_CONTEXT or (named and step.domain not in named):
            continue
        turn = house.turn(data, step, offered, HINT_CALL_ID)
        if turn is None:
            continue
        said = words(str(turn[0]["content"]))
        call = turn[1]["tool_calls"][0]["function"]["arguments"]
        said -= words(call)  # the names and numbers are not what it asks
        if not said:
            continue
        score = len(said & asked) / len(said)
        if score >= MIN_OVERLAP and (best is None or score > best[0]):
            best = (score, turn, step)
    if best is None:
        return Hint()
    step = best[2]
    if named:
        return Hint(best[1], frozenset(named))
    return Hint(best[1], frozenset() if step.domain == NOTHING else None)


def house_hint(
    hass: HomeAssistant, tools: Iterable[Mapping[str, Any]], language: str, text: str
) -> Hint:
    """This request's hint in this house (none without tools, or where ``language``
    has no intents data or it is not loaded yet: intents_data.async_language_data)."""
    data = cached_language_data(language)
    tools = list(tools)
    if data is None or not tools:
        return Hint()
    areas = [area.name for area in ar.async_get(hass).async_list_areas()]
    things = exposed_things(hass)
    names = [(n, t.domain) for t in things for n in (t.name, *t.aliases)]
    question = is_question(text, language, data, names=names)
    # What HA's live-context tool would say of each entity: a question's example reads it.
    live = async_get_exposed_entities(hass, conversation.DOMAIN) if question else {}
    return hint_messages(text, things, areas, tools, live, question=question, data=data)
