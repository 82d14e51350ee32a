"""Understand: a turn's request, read once into one value (``Request``) that every later
stage reads: the policy (turn/decide.py), the calls' guard and arguments (turn/call.py)
and what is said (turn/speak.py).

``async_understand`` reads the chat log's last user text, splits it into its words once
(language/words.py), and reads the house (its names, each domain's names, what each tool
acts on): what of the house the request names, whether it asks (language/questions.py),
and its nearest example (turn/hints.py, with ``house_hint``: the house as the example
reads it) and the domains it is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.llm import async_get_exposed_entities
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import floor_registry as fr

from ..house.kinds import Kinds, async_kind_words, named_by_kind
from ..house.names import HouseNames, names_of, normalize, worded
from ..house.values import domain_names, house_names, tool_domains
from ..language.intents_data import async_language_data, cached_language_data
from ..language.questions import is_question
from ..language.words import words
from ..prefix.examples import exposed_things
from .hints import Hint, hint_messages
from .parts import command_parts
from .plan import RequestPlan


@dataclass(frozen=True, slots=True)
class Request:
    """The turn's request as every stage reads it (the policy reads the first fields)."""

    text: str
    question: bool  # it asks about something (questions.is_question)
    named: frozenset[str] = frozenset()  # names of this house's things, areas, floors it says
    hint: Sequence[dict[str, Any]] = ()  # its nearest example (turn/hints.py), if any
    about: frozenset[str] | None = None  # the domains it is about (hints.Hint.domains)
    things: frozenset[str] = frozenset()  # the things it names (names.said_things)
    intent: str | None = None  # the action HA's templates read in it (hints.Hint.intent)
    slots: Mapping[str, str] = field(default_factory=dict)  # its target (hints.Hint.slots)
    # The names a call may use where the turn refuses the others (call.Calls.refusal: a
    # spoken first turn): those of things sharing a word with it (names.worded).
    worded: frozenset[str] | None = None
    words: frozenset[str] = frozenset()  # its words (language/words.py), split once
    follow_up: bool = False  # the conversation has earlier turns ("turn it off")
    # The things it names by their kind: the only vacuum for "the vacuum" (house/kinds.py).
    by_kind: frozenset[str] = frozenset()  # their entity ids
    language: str = ""
    # The text with the names it says inflected written as the house writes them
    # ("włącz lampa stojąca"): what HA's templates read (names.HouseNames.spelled).
    spelled: str = ""
    # The commands it says one after another, each read whole by HA's templates
    # (turn/parts.py): each runs as a turn of its own (turn/run.py). Empty: one command.
    parts: tuple[str, ...] = ()

    @property
    def names_house(self) -> bool:
        """Whether it names something of this house (or a kind of thing in it)."""
        return bool(self.named) or bool(self.about)


@dataclass(frozen=True, slots=True)
class House:
    """What the turn read of the house: its ``names``, each domain's exposed names and
    aliases (``by_domain``), and each tool's ``platforms`` (tool -> the domains it acts
    on; values.tool_domains), and HA's words for its kinds and their states."""

    names: HouseNames
    by_domain: Mapping[str, Sequence[str]]
    platforms: Mapping[str, frozenset[str]]
    kinds: Kinds = field(default_factory=dict)  # HA's words for its kinds (house/kinds.py)


async def async_understand(
    hass: HomeAssistant,
    chat_log: conversation.ChatLog,
    plan: RequestPlan,
    *,
    language: str,
    spoken: bool,
    part: str | None = None,
) -> tuple[Request, House]:
    """This turn's request, and the house as the turn read it; ``part``: one command of
    the request's several (turn/parts.py), read in its place."""
    asked = [c for c in chat_log.content if isinstance(c, conversation.UserContent)]
    text = part if part is not None else asked[-1].content if asked else ""
    said = frozenset(words(text))  # the one split of the request
    await async_language_data(hass, language)  # hints and questions read it
    names = house_names(hass)
    spelled = names.spelled(text)
    by_domain = domain_names(hass)
    pairs = [(name, domain) for domain, found in by_domain.items() for name in found]
    places = (names.areas, names.floors)
    question = bool(text) and is_question(spelled, language, names=pairs, places=places)
    kinds = await async_kind_words(hass, language, by_domain)
    data = cached_language_data(language)
    by_kind = named_by_kind(names, spelled, kinds, data, said=said) if text else frozenset()
    # A command that names a thing by its kind names that thing (a question is read
    # whole: "how warm is it" is not only about the one thermostat).
    kind_names = frozenset() if question else names_of(names, by_kind)
    follow_up = len(asked) > 1  # "turn it off": the names are in the history
    platforms = tool_domains(hass, chat_log.llm_api) if chat_log.llm_api else {}
    hint = Hint()
    if text and plan.prefix.examples:
        hint = house_hint(hass, plan.tools, language, text, platforms, said=said)
        # HA's templates read the request as said first ("the kitchen lights": the
        # kitchen's lights, where a "Kitchen Light" is a thing); failing that, with the
        # names it says inflected written as the house writes them.
        if hint.intent is None and spelled != normalize(text):
            respelled = house_hint(hass, plan.tools, language, spelled, platforms, said=said)
            hint = respelled if respelled.intent is not None else hint
    # What the request is about: its hint's domains, else those of the things it names.
    things = names.said_things(text) | kind_names
    parts: tuple[str, ...] = ()
    if spoken and part is None and data is not None and text and not question:
        parts = await hass.async_add_executor_job(command_parts, data, text, names)
    about = hint.domains if hint.domains is not None else names.domains_of(things) or None
    request = Request(
        text,
        question,
        frozenset(names.mentioned(text)) | kind_names,
        tuple(hint.messages),
        about,
        things=things,
        intent=hint.intent,
        slots=names.house_slots(hint.slots),
        worded=worded(names, said) | kind_names if spoken and not follow_up else None,
        words=said,
        follow_up=follow_up,
        by_kind=by_kind,
        language=language,
        spelled=spelled,
        parts=parts,
    )
    return request, House(names, by_domain, platforms, kinds)


def house_hint(
    hass: HomeAssistant,
    tools: Iterable[Mapping[str, Any]],
    language: str,
    text: str,
    platforms: Mapping[str, frozenset[str]] | None = None,
    *,
    said: frozenset[str],
) -> Hint:
    """This request's hint in this house (none without tools, or where ``language``
    has no intents data or it is not loaded yet: intents_data.async_language_data);
    ``platforms``: as ``hints.hint_messages`` takes them; ``said``: the request's words."""
    data = cached_language_data(language)
    tools = list(tools)
    if data is None or not tools:
        return Hint()
    listed = ar.async_get(hass).async_list_areas()
    areas = [area.name for area in listed]
    floors = [n for f in fr.async_get(hass).async_list_floors() for n in (f.name, *f.aliases)]
    things = exposed_things(hass)
    names = [(n, t.domain) for t in things for n in (t.name, *t.aliases)]
    places = ([*areas, *(alias for area in listed for alias in area.aliases)], floors)
    question = is_question(text, language, data, names=names, places=places)
    # What HA's live-context tool would say of each entity: a question's example reads it.
    live = async_get_exposed_entities(hass, conversation.DOMAIN) if question else {}
    return hint_messages(
        text,
        things,
        areas,
        tools,
        live,
        question=question,
        data=data,
        platforms=platforms,
        floors=floors,
        area_aliases=[alias for area in listed for alias in area.aliases],
        said=said,
    )
