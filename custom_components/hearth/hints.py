"""The worked example nearest to this turn's request, shown right before it.

The pinned examples (examples.py) teach a small model the call format, but which tool it
picks leans on the last example it saw: the default model set thermostats with
``HassSetPosition`` because that came last. So a turn also gets one more example, chosen
for its request: the template whose words are most like the user's (shared words,
weighted by how few templates say them; only templates of the domains the request names,
by an entity's name or alias or a word such as "lights"; a template that says the
opposite, "off" for "on", loses). It names another thing of that domain where the house
has one, the one least like the request (a small model copies names), so it shows the
call, not the answer. An English question gets a question's example (``GetLiveContext``,
the thing's real live-context entry, and a reply that says what it reads).

The hint also says what the request is about (``Hint.domains``): entity.py then lets a
command call only the tools that act on those domains (house_values.allowed_for).

It is picked by words, not by a model, from HA's own intents, and it is not pinned: it
differs per request, so its 60-120 tokens are prefilled with the request. English only.
``hint_messages`` is pure; ``house_hint`` reads the house.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar

from .examples import (
    AREA,
    NOTHING,
    TEMPLATES,
    House,
    Template,
    Thing,
    exposed_things,
    name_args,
    offered_tools,
)
from .questions import LIVE_CONTEXT, is_question

# Templates only hints use (the pinned examples stay short): HA intents whose requests
# the pinned ones do not show.
HINT_ONLY: tuple[Template, ...] = (
    Template("HassMediaUnpause", "media_player", "resume the {}", name_args()),
    Template("HassMediaNext", "media_player", "skip to the next track on the {}", name_args()),
    Template("HassMediaPrevious", "media_player", "go back to the previous song on the {}",
             name_args()),
    Template("HassMediaPlayerMute", "media_player", "mute the {}", name_args()),
    Template("HassMediaPlayerUnmute", "media_player", "unmute the {}", name_args()),
    Template("HassVacuumReturnToBase", "vacuum", "send the {} back to its dock", name_args()),
    Template("HassListCompleteItem", "todo", "check off milk on the {}",
             name_args({"item": "milk"})),
    Template("HassTurnOn", AREA, "turn on the lights in the {}",
             lambda area: {"area": area, "domain": ["light"]}),
    Template("HassTurnOff", "light", "turn off the {}", name_args()),
    Template("HassTurnOn", "switch", "turn on the {}", name_args()),
    Template("HassTurnOn", "fan", "turn on the {}", name_args()),
    Template("HassTurnOff", "fan", "turn off the {}", name_args()),
    Template("HassTurnOn", "climate", "turn on the {}", name_args()),
    Template("HassTurnOff", "climate", "turn off the {}", name_args()),
    Template("HassTurnOn", "media_player", "turn on the {}", name_args()),
    Template("HassTurnOff", "media_player", "turn off the {}", name_args()),
    Template("HassTurnOn", "valve", "open the {}", name_args()),
    Template("HassTurnOff", "valve", "close the {}", name_args()),
)  # fmt: skip

# Questions, by the domain they ask about; any other domain gets "is the {} on?". The
# example reads its target's live-context entry (``live``): the reply it shows is true.
QUESTIONS: tuple[Template, ...] = (
    Template(LIVE_CONTEXT, "sensor", "what is the {}?", name_args()),
    Template(LIVE_CONTEXT, "lock", "is the {} locked?", name_args()),
    Template(LIVE_CONTEXT, "cover", "is the {} open?", name_args()),
    Template(LIVE_CONTEXT, "climate", "what is the {} set to?", name_args()),
    Template(LIVE_CONTEXT, "media_player", "what is playing on the {}?", name_args()),
)

# Words that carry no intent. "on", "off", "up", "down" and the like are kept.
STOPWORDS = frozenset({
    "a", "an", "the", "to", "in", "of", "my", "our", "please", "for", "at", "and", "me",
    "can", "could", "would", "you", "i", "it", "its", "all", "be", "with", "is", "are",
})  # fmt: skip
# A template that says one of these where the request says the other is the wrong one.
OPPOSITES = {
    "on": "off", "off": "on", "open": "close", "close": "open", "lock": "unlock",
    "unlock": "lock", "pause": "resume", "resume": "pause", "mute": "unmute",
    "unmute": "mute", "start": "stop", "stop": "start",
}  # fmt: skip
# Words that name a domain ("the fan in the bedroom" names no fan, but asks about one).
DOMAIN_WORDS = {
    "light": "light", "lights": "light", "lamp": "light", "lamps": "light",
    "fan": "fan", "fans": "fan", "lock": "lock", "locks": "lock",
    "vacuum": "vacuum", "valve": "valve", "thermostat": "climate", "heating": "climate",
    "degrees": "climate", "blinds": "cover", "curtains": "cover", "shades": "cover",
    "speaker": "media_player", "music": "media_player", "tv": "media_player",
}  # fmt: skip
YES_OR_NO = ("switch", "light")  # a question naming nothing: asked of these
HINT_CALL_ID = "example_hint"
# What a template must share with a request to be shown: one word at most two others
# say too ("degrees", "pause"), or more of the common ones ("set", "turn").
MIN_SCORE = 0.5
_WORDS = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORDS.findall(text.lower().replace("%", " percent ").replace("'", ""))


def _says(words: list[str], phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``words`` as whole words."""
    wanted = _words(phrase)
    n = len(wanted)
    return n > 0 and any(words[i : i + n] == wanted for i in range(len(words) - n + 1))


def _rarity(templates: Iterable[Template]) -> dict[str, float]:
    """Each word's weight: 1 / the number of templates that say it ("set" says little,
    "degrees" much)."""
    counts: dict[str, int] = {}
    for template in templates:
        for word in _said(template):
            counts[word] = counts.get(word, 0) + 1
    return {word: 1 / n for word, n in counts.items()}


def _said(template: Template) -> set[str]:
    """A template's words that count (not its example numbers: "21 degrees")."""
    return {w for w in _words(template.ask.format("")) if w not in STOPWORDS and not w.isdigit()}


def _domain(template: Template) -> str:
    return "light" if template.domain == AREA else template.domain  # the lights of an area


@dataclass(frozen=True, slots=True)
class Hint:
    """A request's nearest example (``messages``, OpenAI chat messages; empty: none)
    and the domains it is about: those the request names (its things', or words such
    as "lights"); none where it names none and its example names nothing (a timer);
    None where not known (the example's domain is only a guess)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    domains: frozenset[str] | None = None

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
) -> Hint:
    """The example turn (OpenAI messages) nearest to the request ``text`` in a house
    with ``things``, ``areas`` (names), ``tools`` and ``live`` (entity id -> its
    live-context entry, which a question's example reads); an empty Hint when nothing
    is near enough. ``question``: the request asks about the house."""
    things = list(things)
    words = _words(text)
    request = {w for w in words if w not in STOPWORDS}

    def named(thing: Thing) -> bool:  # every word of a name of it is in the request
        return any(
            (said := set(_words(n)) - STOPWORDS) and said <= request
            for n in (thing.name, *thing.aliases)
        )

    found = [t for t in things if named(t)]
    mentioned = {t.domain for t in found}
    mentioned |= {domain for word, domain in DOMAIN_WORDS.items() if word in request}
    areas = list(areas)
    in_areas = {area for area in areas if _says(words, area)}
    area_named = bool(in_areas)
    if question:
        asked = {t.domain for t in QUESTIONS}
        others = [*sorted(mentioned - asked), *YES_OR_NO]
        candidates = [*QUESTIONS, *(_yes_or_no(d) for d in others)]
    else:
        candidates = [t for t in (*TEMPLATES, *HINT_ONLY) if t.intent != LIVE_CONTEXT]
    if mentioned:  # a request about a light is shown a light's example, or none
        candidates = [t for t in candidates if _domain(t) in mentioned]
    rarity = _rarity(candidates)

    def score(template: Template) -> float:
        said = _said(template)
        value = sum(rarity[w] for w in said & request)
        value -= sum(1 for w in said if OPPOSITES.get(w) in request and w not in request)
        if template.domain == AREA:  # "the lights in the office", where no light is named
            value += -0.25 if found else 0.5 if area_named else 0
        return value

    def rank(thing: Thing) -> tuple[int, int]:
        # Among the others, for a question one whose state says the most (a player that
        # plays shows its title), then the one least like the request (a small model
        # copies names).
        said = len((live.get(thing.entity_id) or {}).get("attributes") or {})
        return (said if question else 0, -len(set(_words(thing.name)) & request))

    house = House.of(things, areas)
    offered = offered_tools(tools)
    avoid = frozenset(t.entity_id for t in found)
    best: tuple[float, list[dict[str, Any]], Template] | None = None
    for template in candidates:
        value = score(template)
        if (best is not None and value <= best[0]) or (value < MIN_SCORE and not question):
            continue
        turn = house.turn(template, offered, HINT_CALL_ID, avoid=avoid, live=live, rank=rank)
        if turn is not None:
            best = (value, turn, template)
    if best is None:
        return Hint()
    turn, template = best[1], best[2]
    if in_areas and not found and not question:
        # "make it 23 degrees in the living room": an area, not a thing, so the example
        # names another area's thing by its area.
        elsewhere = frozenset(t.entity_id for t in things if t.area in in_areas)
        by_area = house.turn(
            template, offered, HINT_CALL_ID, avoid=elsewhere, rank=rank, by_area=True
        )
        turn = by_area or turn
    if mentioned:
        return Hint(turn, frozenset(mentioned))
    return Hint(turn, frozenset() if template.domain == NOTHING else None)


def _yes_or_no(domain: str) -> Template:
    """A yes-or-no question on a thing of ``domain``."""
    return Template(LIVE_CONTEXT, domain, "is the {} on?", name_args())


def house_hint(
    hass: HomeAssistant, tools: Iterable[Mapping[str, Any]], language: str, text: str
) -> Hint:
    """This request's hint in this house (none outside English, or without tools)."""
    if not language.lower().startswith("en") or not tools:
        return Hint()
    areas = [area.name for area in ar.async_get(hass).async_list_areas()]
    question = is_question(text, language)
    # What HA's live-context tool would say of each entity: a question's example reads it.
    live = async_get_exposed_entities(hass, conversation.DOMAIN) if question else {}
    return hint_messages(text, exposed_things(hass), areas, tools, live, question=question)
