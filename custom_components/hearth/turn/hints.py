"""The worked example nearest to this turn's request, shown right before it.

The pinned examples (prefix/examples.py) teach a small model the call format, but which tool it
picks leans on the last example it saw: the default model set thermostats with
``HassSetPosition`` because that came last. So a turn also gets one more example, chosen
for its request, in the request's language: the request is matched against Home
Assistant's own sentence templates (``home-assistant-intents``, with this house's
names, aliases and areas as slot lists, as HA's matcher does; a name the house does not
have still matches a template), which gives the intent it asks for and what it names.
Where no template matches (or one matches only with a name the house does not have,
and the request says one it has), the intent is the one whose templates say most of
the request's words (language/words.py: "resume the music on the bedroom speaker" is
HassMediaUnpause). The example is of that intent, on another thing of the same domain
where the house has one (a small model copies names), so it shows the call, not the
answer. A question gets a question's example (``GetLiveContext``, the thing's real
live-context entry, and HA's answer to it with the attributes that entry shows), of the
kind it asks about: what it names, else what its intent is about in HA's data (a
temperature: climate). A template's free text (a timer's name, a to-do item) names no
thing of the house; it is said in the example too.

The hint also says what the request is about (``Hint.domains``): the policy
(turn/decide.py) then lets a command call only the tools that act on those domains
(values.allowed_for).

It is not pinned: it differs per request, so its tokens are prefilled with the request
(an action's example is its call alone, about 40 tokens; a question's shows the result
and the answer too). Pure: ``house_hint`` (turn/understand.py) reads the house for
``hint_messages``, with the request's words split once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from hassil import RecognizeResult
from hassil.intents import Intent

from ..language.intents_data import LanguageData
from ..language.questions import QUESTION_INTENTS
from ..language.sentences import AREA, NAME, TARGET_LISTS, recognize, slot_lists
from ..language.words import block_domains, said_in, said_most, words
from ..prefix.examples import (
    LIVE_CONTEXT,
    NOTHING,
    House,
    Step,
    Thing,
    offered_tools,
)
from ..tool_names import bare_name

HINT_CALL_ID = "example_hint"
# Domains a question that names nothing is asked of (HA's yes-or-no things).
YES_OR_NO = ("switch", "light")
# What a request that no template matches must say of an intent's words to get its
# example (words.said_most): one word at most two of the language's intents say
# ("resume", "degrees"), or several that more say; where it names a thing of the house,
# one that five say ("percent", among the intents that act on that thing).
MIN_SCORE = 0.5
MIN_SCORE_NAMED = 0.2
# An intent whose templates name at most this many domains is about them (_intent_domains).
FEW_DOMAINS = 2


@dataclass(frozen=True, slots=True)
class Hint:
    """A request's nearest example (``messages``, OpenAI chat messages; empty: none)
    and the domains it is about: those the request names (its things', or a domain a
    template says, "lights"); none where it names none and its example names nothing
    (a timer); None where not known (the example's domain is only a guess)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    domains: frozenset[str] | None = None
    # The action a sentence template of HA says the request asks for, where one matched
    # with this house's names (HA's own matcher would run it): "lock the front door" is
    # HassTurnOn. None where no template matched it whole, or it asks a question.
    intent: str | None = None
    # What that template read of its target: name, area, floor, domain, device class.
    # A question's too (its intent stays None): its live-context call reads only that.
    slots: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.messages)


def hint_messages(
    text: str,
    things: Iterable[Thing],
    areas: Iterable[str],
    tools: Iterable[Mapping[str, Any]],
    live: Mapping[str, Mapping[str, Any]],
    *,
    question: bool = False,
    data: LanguageData | None = None,
    platforms: Mapping[str, frozenset[str]] | None = None,
    floors: Iterable[str] = (),
    area_aliases: Iterable[str] = (),
    said: frozenset[str] | None = None,
) -> Hint:
    """The example turn (OpenAI messages) nearest to the request ``text`` in a house
    with ``things``, ``areas`` (names), ``tools`` and ``live`` (entity id -> its
    live-context entry, which a question's example reads), in ``data``'s language; an
    empty Hint when nothing is near enough or there is no data. ``question``: the
    request asks about the house. ``platforms``: tool -> the domains it acts on, for
    the tools that act on some only (values.tool_domains). ``floors`` (names and
    aliases) and ``area_aliases``: what else HA's matcher reads as a place; ``said``:
    the request's words, where the turn has split it (turn/understand.py).

    An action's example is its call alone: a turn that acts ends with what Home
    Assistant says was done, never the model's words, so HA's result and the reply
    would only be prefilled (about 60 of a hint's 100 tokens). A question's keeps its
    result and answer: answering from the result is what it shows."""
    request = Asked(text, frozenset(words(text)) if said is None else said, question)
    house = (list(things), list(areas), list(floors), list(area_aliases))
    hint = _nearest_turn(request, house, tools, live=live, data=data, platforms=platforms)
    calls = hint.messages[1]["tool_calls"] if hint else []
    if calls and bare_name(calls[0]["function"]["name"]) != LIVE_CONTEXT:
        return dataclasses.replace(hint, messages=hint.messages[:2])
    return hint


@dataclass(frozen=True, slots=True)
class Asked:
    """The request as the hint reads it: its ``text``, its words (``said``), whether it
    is a ``question``."""

    text: str
    said: frozenset[str]
    question: bool = False


def _nearest_turn(
    request: Asked,
    places: tuple[list[Thing], list[str], list[str], list[str]],
    tools: Iterable[Mapping[str, Any]],
    *,
    live: Mapping[str, Mapping[str, Any]],
    data: LanguageData | None,
    platforms: Mapping[str, frozenset[str]] | None,
) -> Hint:
    """``hint_messages``, with the whole turn of an action (``places``: the things,
    the areas, the floors and the areas' aliases)."""
    tools = list(tools)
    if data is None or not tools:
        return Hint()
    text, question = request.text, request.question
    things, areas, floors, area_aliases = places
    house = House.of(things, areas)
    offered = offered_tools(tools)
    platforms = {bare_name(tool): acts for tool, acts in (platforms or {}).items()}
    names = [(n, t.domain) for t in things for n in (t.name, *t.aliases)]
    wanted = set(offered) | set(QUESTION_INTENTS if question else ())
    result = recognize(data, text, slot_lists(names, [*areas, *area_aliases], floors), wanted)
    if result is None and question:
        by_words = _asked_by_words(data, request.said, things, house)
        if by_words.domains:
            return by_words
        return _nearest(data, request.said, things, house, offered, platforms)
    if result is None:
        return _nearest(data, request.said, things, house, offered, platforms)
    found = _named(result, things)
    if result.unmatched_entities and not found:
        # What it says for a name or an area is not one of the house's: a jacuzzi gets
        # no example, but a thing's name in it ("resume the music on the bedroom
        # speaker", read as an area) is a thing said: its words decide, as below. A
        # question ("what's the weather like today": a name) by the question's words.
        by_words = _asked_by_words(data, request.said, things, house) if question else Hint()
        if by_words.domains:
            return by_words
        return _nearest(data, request.said, things, house, offered, platforms, names_house=True)
    domains = {t.domain for t in found} | _said_domains(result)
    area = _said(result, AREA)

    def rank(thing: Thing) -> tuple[int, int]:
        # Among the others, for a question one whose state says the most (a player that
        # plays shows its title), then the one least like the request.
        said = len((live.get(thing.entity_id) or {}).get("attributes") or {})
        return (said if question else 0, -len(words(thing.name) & request.said))

    avoid = frozenset(t.entity_id for t in found)
    intent = result.intent.name
    # Free text it says (a to-do item) is said in the example too: HA has no example
    # item in any language, and without one the intent has no example at all.
    free = {k: e.text.strip() for k, e in result.entities.items() if e.is_wildcard and e.text}
    says = frozenset(result.entities)  # the example says what the request says, where it can
    if question or intent in QUESTION_INTENTS:
        # "What is the temperature in the den", "what's the weather": the kind its
        # intent is about (in HA's data) first, and it is about that kind of thing.
        implied = [] if domains else _intent_domains(result.intent, house)
        asked = [*sorted(domains), *YES_OR_NO] if domains else [*implied, *sorted(house.by_domain)]
        # What it read filters the live context (decide.live_values); where it read no
        # target, the one kind its intent is about (the weather: not a thermostat).
        read = ({} if result.unmatched_entities else _target(result)) or _one_kind(implied)
        for domain in asked:
            step = Step(LIVE_CONTEXT, domain)
            turn = house.turn(data, step, offered, HINT_CALL_ID, avoid=avoid, live=live, rank=rank)
            if turn is not None:
                return Hint(turn, frozenset(domains or implied) or None, slots=read)
        return Hint()
    if not domains and not _takes_target(result):
        turn = house.turn(data, Step(intent, NOTHING), offered, HINT_CALL_ID, free=free, says=says)
        return Hint(turn or [], frozenset(), intent if turn else None, _target(result))
    for domain in sorted(domains) or _guess(result, house):
        turn = None
        if area and not found:  # an area, not a thing: the example names another area's
            elsewhere = frozenset(t.entity_id for t in things if t.area == area)
            step = Step(intent, domain)
            turn = house.turn(data, step, offered, HINT_CALL_ID, avoid=elsewhere, by_area=True)
        turn = turn or house.turn(data, Step(intent, domain), offered, HINT_CALL_ID,
                                  avoid=avoid, rank=rank, free=free, says=says)  # fmt: skip
        if turn is not None:
            if result.unmatched_entities:
                return Hint(turn, frozenset(domains) or None)
            return Hint(turn, frozenset(domains) or None, intent, _target(result))
    if result.unmatched_entities:  # a partial match, of an intent that cannot act on it
        return _nearest(data, request.said, things, house, offered, platforms, names_house=True)
    # Read whole, with nothing else to show its example on (the house's one player): no
    # example, but the call is still the template's, on what it read, as HA's would be.
    return Hint([], frozenset(domains) or None, intent, _target(result))


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


def _target(result: RecognizeResult) -> dict[str, str]:
    """What ``result``'s template read of its target (its name, area, floor, domain);
    "" for a slot it takes from the speaking device (its area: not known here). The
    device class too ("the curtains": ``curtain``)."""
    slots = (*TARGET_LISTS, "domain", "device_class")
    return {slot: _said(result, slot) or "" for slot in slots if slot in result.entities}


def _said_domains(result: RecognizeResult) -> set[str]:
    """A domain the matched template says ("the lights": ``domain: light``)."""
    value = _said(result, "domain")
    return {value} if value else set()


def _intent_domains(intent: Intent, house: House) -> list[str]:
    """The domains ``intent`` is about that ``house`` has, where it is about few: those
    its templates are for (``words.block_domains``), in the data's order.
    HassClimateGetTemperature is about climate, HassSetPosition about cover and valve;
    HassGetState names eleven and is about none in particular ([])."""
    found = list(dict.fromkeys(d for block in intent.data for d in block_domains(block)))
    return [d for d in found if d in house.by_domain] if len(found) <= FEW_DOMAINS else []


def _one_kind(implied: list[str]) -> dict[str, str]:
    """What a question that names no target reads where its intent is about one kind
    of thing: that kind (decide.live_values; the weather, not a thermostat)."""
    return {"domain": implied[0]} if len(implied) == 1 else {}


def _said_in(asked: Set[str], things: list[Thing], house: House) -> tuple[list[Thing], list[str]]:
    """The things and the areas all of whose name's words are among the words
    ``asked``, inflected or not ("roletę" says "Roleta": ``words.alike``)."""
    named = [t for t in things if _says_all(asked, t.name)]
    places = [a for a in house.areas if _says_all(asked, a)]
    return named, places


def _says_all(asked: Set[str], name: str) -> bool:
    """Whether each word of ``name`` is said in ``asked``."""
    theirs = words(name)
    return bool(theirs) and all(said_in(w, asked) for w in theirs)


def _less(asked: Set[str], name: str) -> set[str]:
    """``asked`` without the words that say ``name``'s."""
    theirs = words(name)
    return {a for a in asked if not said_in(a, theirs)}


def _asked_by_words(
    data: LanguageData, asked: frozenset[str], things: list[Thing], house: House
) -> Hint:
    """A question no template reads and that names nothing of the house ("what's the
    weather like today"): about the kinds of thing that the question intent whose
    templates say most of its words is about (as ``_nearest`` picks an action), where
    one says enough and the house has them. Its turn then reads the house first (the
    model made the weather up). It has no example: an example names a thing, and the
    model copies that name into its call (a thermostat, asked how cold it is outside).
    An empty Hint otherwise: "tell me a joke" says too little of any. ``asked``: the
    question's words."""
    if any(_said_in(asked, things, house)):
        return Hint()
    intents = data.intents.intents
    ranked = said_most(data, asked, [(i, None) for i in sorted(QUESTION_INTENTS) if i in intents])
    best = [s for s in ranked if s.score == ranked[0].score] if ranked else []
    if len(best) != 1 or best[0].score < MIN_SCORE:
        return Hint()
    implied = _intent_domains(intents[best[0].intent], house)
    # One kind: its call reads that kind, as where a template reads it (left free, the
    # model read a light for the weather).
    return Hint([], frozenset(implied) or None, slots=_one_kind(implied))


def _takes_target(result: RecognizeResult) -> bool:
    """Whether the matched template names a thing, an area or a floor."""
    said = {key for key, entity in result.entities.items() if not entity.is_wildcard}
    named = said | set(result.unmatched_entities)  # free text (a timer's name) names nothing
    return bool(named & {NAME, AREA, "floor"}) or bool(result.intent_data.requires_context)


def _guess(result: RecognizeResult, house: House) -> list[str]:
    """Domains the matched template may act on, that the house has."""
    required = (result.intent_data.requires_context or {}).get("domain") or []
    required = [required] if isinstance(required, str) else list(required)
    return [d for d in required if d in house.by_domain]


def _nearest(  # noqa: PLR0917
    data: LanguageData,
    asked: Set[str],
    things: list[Thing],
    house: House,
    offered: Mapping[str, tuple[str, tuple[str, ...]]],
    platforms: Mapping[str, frozenset[str]],
    *,
    names_house: bool = False,
) -> Hint:
    """No template matches the request whose words are ``asked`` (or, ``names_house``,
    only with a name the house does not have, where it says a thing or an area the
    house has): the example of the offered intent whose templates say most of its
    words less the names it says
    (words.said_most), on the domain of the things it names (naming none: on
    any) where the intent acts on it (``platforms``: intent -> the domains it acts
    on), where that says enough (``MIN_SCORE``) and no other intent as much. An
    area it names (and no thing) is named in the example too, another one."""
    named, places = _said_in(asked, things, house)
    if names_house and not (named or places):
        return Hint()
    for said in (*(t.name for t in named), *places):
        asked = _less(asked, said)
    domains: list[str | None] = [*sorted({t.domain for t in named})]
    domains = domains or [*sorted(house.by_domain), None]
    candidates = [
        (intent, domain)
        for intent in offered
        for domain in domains
        if intent != LIVE_CONTEXT
        and (domain is None or (acts := platforms.get(intent)) is None or domain in acts)
    ]
    ranked = said_most(data, asked, candidates)
    enough = MIN_SCORE_NAMED if named else MIN_SCORE
    best = [s for s in ranked if ranked[0].score >= enough and s.score == ranked[0].score]
    if not any(ch.isdigit() for word in asked for ch in word):  # it says no value
        best = [s for s in best if s.plain] or best  # "close the curtain": not a position
    if len({s.intent for s in best}) != 1:
        return Hint()  # nothing says enough, or two intents say as much
    avoid = frozenset(t.entity_id for t in named)
    for scored in best:
        step = Step(scored.intent, scored.domain or NOTHING)
        turn = None
        if places and not named and scored.domain:
            elsewhere = frozenset(t.entity_id for t in things if t.area in places)
            turn = house.turn(data, step, offered, HINT_CALL_ID, avoid=elsewhere, by_area=True)
        turn = turn or house.turn(data, step, offered, HINT_CALL_ID, avoid=avoid)
        if turn is None:
            continue
        if named:
            return Hint(turn, frozenset(t.domain for t in named))
        if platforms.get(scored.intent) and scored.domain:
            return Hint(turn, frozenset({scored.domain}))  # it acts on that domain only
        return Hint(turn, frozenset() if step.domain == NOTHING else None)
    return Hint()
