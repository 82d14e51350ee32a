"""Worked examples for small models: a few turns of the house's own tools, pinned.

A small model (the default SmolLM2-135M) told about tools in its system prompt mostly
answers in prose, or calls a tool it copied from the top of the list. Shown a few
earlier turns in which a user asks and the assistant calls the right tool, it does what
they show: on the project's accuracy dataset its correct answers went from 0 to 27 of
71 (README, "Accuracy"). The examples are built from the house itself (its exposed
entities, its areas and the tools its LLM API offers, so every call in them is valid
here) and sit in the pinned prefix after the system message, so they cost nothing per
request. They depend on names only, never on states: a state change does not re-pin.

Their words are Home Assistant's own, in the agent's language: each example is a
sentence template of the intent it calls (``home-assistant-intents``, see
language/sentences.py) filled with this house's names, its arguments are the slots HA's matcher
reads from that sentence, and the reply is HA's response for it. A language the
intents data does not have gets no examples. Where they would make the house prompt
longer than the model's context, the agent pins without them (``pins/pinning.py``).

``house_examples`` picks the entities (HA glue); ``example_messages`` is pure. ``House``
renders one step's turn; turn/hints.py uses it for each request's nearest example.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.util import yaml as yaml_util

from ..language.intents_data import LanguageData, async_language_data, cached_language_data
from ..language.sentences import NAME, Said, Target, say, speak
from ..tool_names import bare_name


@dataclass(frozen=True, slots=True)
class Thing:
    """An exposed entity, as the examples name it."""

    entity_id: str
    name: str
    aliases: tuple[str, ...] = ()  # what else the user may call it (not shown)
    area: str = ""  # the name of its area (or its device's), if any

    @property
    def domain(self) -> str:
        return self.entity_id.split(".", 1)[0]


AREA = "area"  # a step's target: an area (the house's first by name with such things)
NOTHING = "nothing"  # a step without a target (a timer)
LIVE_CONTEXT = "GetLiveContext"
QUESTION_INTENT = "HassGetState"  # the intents data's question; the model reads live context


@dataclass(frozen=True, slots=True)
class Step:
    """One example: ``intent`` (a tool's short name) on the ``pick``-th entity of
    ``domain`` (or on an ``AREA``'s things of ``domain``, or on ``NOTHING``).
    ``LIVE_CONTEXT`` asks HA's question intent of the thing and reads the house."""

    intent: str
    domain: str
    pick: int = 0
    area: bool = False

    @property
    def asks(self) -> str:
        """The intent whose sentences ask it."""
        return QUESTION_INTENT if self.intent == LIVE_CONTEXT else self.intent


# In the order shown. Few, and the same whatever the house's size (about 450 tokens on
# the demo house with the default tokenizer): each request is also shown the example
# nearest to it (turn/hints.py), so these teach the call's form, not every intent. A small
# model leans on the last examples it saw, so the common on/off requests come last, and
# a question and a setting first; a lock's two directions are both shown (locking is
# ``HassTurnOn``). A timer's example shows only where its tools are offered (a satellite
# that can set timers has a prefix of its own). Intent names and domains only: the
# words come from the language's intents data.
STEPS: tuple[Step, ...] = (
    Step(LIVE_CONTEXT, "switch"),
    Step("HassStartTimer", NOTHING),
    Step("HassClimateSetTemperature", "climate"),
    Step("HassTurnOff", "lock"),
    Step("HassTurnOn", "lock", pick=1),
    Step("HassTurnOff", "light", area=True),
    Step("HassTurnOn", "light"),
)
QUESTION_STATE = "off"  # the state a pinned question's made-up result shows
# Examples that show the whole loop (the tool's result and the reply): the first (a
# question, answered from the result) and the last LAST_FULL ones (what a small model
# copies most: after a result, a short reply, no further call). The others show only
# the call, which is what they teach, at a fifth of the tokens.
LAST_FULL = 1


def example_messages(
    things: Iterable[Thing],
    areas: Iterable[str],
    tools: Iterable[Mapping[str, Any]],
    data: LanguageData | None,
) -> list[dict[str, Any]]:
    """The example turns (OpenAI chat messages) for a house with ``things`` (exposed
    entities), ``areas`` and ``tools`` (OpenAI function tools), in ``data``'s language:
    one per step whose tool is offered, whose arguments that tool takes, whose domain
    (or area) the house has, and whose intent the language's data can say of it."""
    if data is None:
        return []
    house = House.of(things, areas)
    offered = offered_tools(tools)
    turns: list[list[dict[str, Any]]] = []
    for step in STEPS:
        turn = house.turn(data, step, offered, f"example_{len(turns) + 1}")
        if turn is not None:
            turns.append(turn)
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        full = i == 0 or i >= len(turns) - LAST_FULL
        messages += turn if full else turn[:2]
    return messages


@dataclass(frozen=True, slots=True)
class House:
    """What the examples may name: exposed things by domain (in entity-id order), and
    area names (sorted)."""

    by_domain: Mapping[str, list[Thing]]
    areas: list[str]

    @classmethod
    def of(cls, things: Iterable[Thing], areas: Iterable[str]) -> House:
        by_domain: dict[str, list[Thing]] = {}
        for thing in sorted(things, key=lambda t: t.entity_id):
            by_domain.setdefault(thing.domain, []).append(thing)
        return cls(by_domain, sorted(areas))

    def turn(
        self,
        data: LanguageData,
        step: Step,
        offered: Mapping[str, tuple[str, tuple[str, ...]]],
        call_id: str,
        *,
        avoid: frozenset[str] = frozenset(),
        live: Mapping[str, Mapping[str, Any]] | None = None,
        rank: Callable[[Thing], Any] | None = None,
        by_area: bool = False,
        free: Mapping[str, str] | None = None,
        says: frozenset[str] = frozenset(),
    ) -> list[dict[str, Any]] | None:
        """``step``'s whole turn on this house (None where its tool is not offered,
        takes other arguments, the house has nothing to name, or the language's data
        cannot say it). The target is the ``pick``-th thing of its domain (or the first
        of highest ``rank``), skipping ``avoid`` (entity ids) where others are left. A
        question reads its target's entry in ``live`` (entity id -> HA's live-context
        entry) where given. ``by_area``: name the target's area instead of the thing
        ("set the temperature in the Bedroom to 21": ``area``, not ``name``). ``free``:
        what to say for a slot of free text; ``says``: slots to say where a template
        can (sentences.say)."""
        tool = offered.get(step.intent)
        if tool is None:
            return None
        name, properties = tool
        thing: Thing | None = None
        if step.domain == NOTHING:
            target = Target("")
        elif step.area:
            with_domain = {t.area for t in self.by_domain.get(step.domain, ()) if t.area}
            found = [a for a in self.areas if a in with_domain] or (
                self.areas if step.domain in self.by_domain else []
            )
            if not found:
                return None
            target = Target(AREA, found[0], step.domain)
        else:
            things = self.by_domain.get(step.domain) or []
            if by_area:
                things = [t for t in things if t.area]
            if not things:
                return None
            things = [t for t in things if t.entity_id not in avoid] or things
            thing = max(things, key=rank) if rank else things[step.pick % len(things)]
            target = (
                Target(AREA, thing.area, thing.domain)
                if by_area
                else Target(NAME, thing.name, thing.domain, thing.entity_id)
            )
        question = step.intent == LIVE_CONTEXT
        said = say(data, step.asks, target, asked="one" if question else None, free=free, says=says)
        if said is None:
            return None
        arguments = _arguments(said, target, properties, question=question)
        if arguments is None:
            return None
        info = live.get(thing.entity_id) if live is not None and thing is not None else None
        return _turn(data, call_id, said, name, arguments, target, info)


def _arguments(
    said: Said, target: Target, properties: tuple[str, ...], *, question: bool
) -> dict[str, Any] | None:
    """The call's arguments: the slots HA read from the sentence that the tool takes,
    in the schema's order (the grammar writes keys in that order, so the model can copy
    the call). None where a slot the sentence says is not one the tool takes. A
    question reads its target by name (or area)."""
    if question:
        slots = {target.kind: target.said} if target.kind else {}
    else:
        slots = dict(said.slots)
        if "domain" in slots:
            if "domain" in properties:
                slots["domain"] = [slots["domain"]]
            else:
                del slots["domain"]  # implied by the intent (HassLightSet: lights)
    if not set(slots) <= set(properties):
        return None
    return {key: slots[key] for key in properties if key in slots}


# What HA's live-context tool says before the entities it lists.
LIVE_HEADER = "Live Context: An overview of the areas and the devices in this smart home:"


def spoken_state(data: LanguageData, said: Said, info: Mapping[str, Any]) -> str | None:
    """HA's answer to the question ``said`` about a thing whose live-context entry is
    ``info`` (its state, with the unit where it has one), in the data's language, then
    the other attributes that entry shows, as it shows them ("temperature: 18"): HA
    answers with the state alone, and a small model that copies that answered what a
    thermostat was set to with "heat"."""
    attributes = info.get("attributes") or {}
    state = str(info.get("state", ""))
    unit = attributes.get("unit_of_measurement")
    spoken = answer(data, said, state, f"{state} {unit}" if unit else state)
    shown = [f"{key}: {value}" for key, value in attributes.items() if key != "unit_of_measurement"]
    if spoken is None or not shown:
        return spoken
    return f"{spoken} ({', '.join(shown)})"


def answer(data: LanguageData, said: Said, state: str, with_unit: str) -> str | None:
    """HA's response to the question ``said`` where its thing is in ``state``."""
    asked = said.slots.get("state")
    thing = {
        "name": said.slots.get(NAME, ""),
        "domain": said.slots.get("domain", ""),
        "state": state,
        "state_with_unit": with_unit,
    }
    matched = asked in {None, state}
    return speak(data, QUESTION_INTENT, said.response, said.words, thing, matched=matched)


def offered_tools(tools: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Short tool name (``HassTurnOn`` for ``intent__HassTurnOn``) -> (full name, its
    argument names)."""
    offered: dict[str, tuple[str, tuple[str, ...]]] = {}
    for tool in tools:
        function = tool.get("function") or {}
        name = str(function.get("name", ""))
        properties = (function.get("parameters") or {}).get("properties") or {}
        offered.setdefault(bare_name(name), (name, tuple(properties)))
    return offered


def _turn(  # noqa: PLR0917
    data: LanguageData,
    call_id: str,
    said: Said,
    tool: str,
    arguments: dict[str, Any],
    target: Target,
    info: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """User asks, assistant calls, the tool answers as Home Assistant would, the
    assistant says HA's response (or, for a question, answers from the tool's result:
    ``info``, the target's live-context entry, where given; else a made-up state). A
    turn whose reply the data cannot say shows only the call."""
    reply: str | None
    if said.intent == QUESTION_INTENT and info is not None:
        result: dict[str, Any] = {"result": f"{LIVE_HEADER}\n{yaml_util.dump([dict(info)])}"}
        reply = spoken_state(data, said, info)
    elif said.intent == QUESTION_INTENT:
        state = f"- names: {target.said}\n  domain: {target.domain}\n  state: '{QUESTION_STATE}'\n"
        result = {"success": True, "result": state}
        reply = answer(data, said, QUESTION_STATE, QUESTION_STATE)
    else:
        success = []
        if target.kind == NAME:
            success = [{"name": target.said, "type": "entity", "id": target.entity_id}]
        elif target.kind:
            ident = target.said.lower().replace(" ", "_")
            success = [{"name": target.said, "type": target.kind, "id": ident}]
        result = {"response_type": "action_done", "data": {"success": success, "failed": []}}
        reply = said.speech
    call = {"name": tool, "arguments": json.dumps(arguments, ensure_ascii=False)}
    turn: list[dict[str, Any]] = [
        {"role": "user", "content": said.text},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
    ]
    if reply is None:
        return turn
    return [
        *turn,
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": json.dumps(result, ensure_ascii=False, separators=(",", ":")),
        },
        {"role": "assistant", "content": reply},
    ]


def exposed_things(hass: HomeAssistant) -> list[Thing]:
    """The entities exposed to Assist, with their aliases and areas."""
    entities, devices, areas = er.async_get(hass), dr.async_get(hass), ar.async_get(hass)
    things = []
    for state in hass.states.async_all():
        if not state.name or not async_should_expose(hass, conversation.DOMAIN, state.entity_id):
            continue
        entry = entities.async_get(state.entity_id)
        aliases = tuple(a for a in entry.aliases if isinstance(a, str)) if entry else ()
        area_id = entry.area_id if entry else None
        if entry and area_id is None and entry.device_id:
            device = devices.async_get(entry.device_id)
            area_id = dr.async_get_effective_area_id(hass, device) if device else None
        area = areas.async_get_area(area_id) if area_id else None
        things.append(Thing(state.entity_id, state.name, aliases, area.name if area else ""))
    return things


def house_examples(
    hass: HomeAssistant, tools: Iterable[Mapping[str, Any]], language: str = ""
) -> tuple[dict[str, Any], ...]:
    """The example turns for this house in ``language`` (default: the house's); none
    without tools, or where the language has no intents data or is not loaded yet
    (``async_house_examples`` loads it)."""
    data = cached_language_data(language or hass.config.language)
    if data is None or not tools:
        return ()
    areas = [area.name for area in ar.async_get(hass).async_list_areas()]
    return tuple(example_messages(exposed_things(hass), areas, tools, data))


async def async_house_examples(
    hass: HomeAssistant, tools: Iterable[Mapping[str, Any]], language: str = ""
) -> tuple[dict[str, Any], ...]:
    """``house_examples``, with the language's intents data loaded first (in the
    executor) and the sentences said there too (they parse templates on first use)."""
    tools = list(tools)
    data = await async_language_data(hass, language or hass.config.language)
    if data is None or not tools:
        return ()
    areas = [area.name for area in ar.async_get(hass).async_list_areas()]
    things = exposed_things(hass)
    messages = await hass.async_add_executor_job(example_messages, things, areas, tools, data)
    return tuple(messages)
