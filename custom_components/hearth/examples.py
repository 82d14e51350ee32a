"""Worked examples for small models: a few turns of the house's own tools, pinned.

A small model (the default SmolLM2-135M) told about tools in its system prompt mostly
answers in prose, or calls a tool it copied from the top of the list. Shown a few
earlier turns in which a user asks and the assistant calls the right tool, it does what
they show: on the project's accuracy dataset its correct answers went from 0 to 27 of
71 (README, "Accuracy"). The examples are built from the house itself (its exposed
entities, its areas and the tools its LLM API offers, so every call in them is valid
here) and sit in the pinned prefix after the system message, so they cost nothing per
request. They depend on names only, never on states: a state change does not re-pin.
English only (the words of the requests are English). Where they would make the house
prompt longer than the model's context, the agent pins without them (``pins.py``).

``house_examples`` picks the entities (HA glue); ``example_messages`` is pure. ``House``
renders one template's turn; hints.py uses it for each request's nearest example.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import entity_registry as er
from homeassistant.util import yaml as yaml_util

from .tool_names import bare_name


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


# What a request calls a thing of a domain, when it names the thing by its area.
NOUNS = {"light": "light", "climate": "thermostat", "cover": "blinds", "media_player": "speaker"}
AREA = "area"  # a template's target: the house's first area by name (if it has lights)
NOTHING = "nothing"  # a template without a target (a timer)


@dataclass(frozen=True, slots=True)
class Template:
    """One example: ``intent`` (a tool's short name) on the ``pick``-th entity of
    ``domain`` (or ``AREA``, or ``NOTHING``), asked as ``ask`` (``{}`` is the name)."""

    intent: str
    domain: str
    ask: str
    arguments: Callable[[str], dict[str, Any]]
    pick: int = 0
    answer: str = "off"  # a question's: the state its result shows and its reply says


def name_args(extra: Mapping[str, Any] | None = None) -> Callable[[str], dict[str, Any]]:
    """A template's arguments: the target's ``name``, and ``extra``."""
    return lambda name: {"name": name, **(extra or {})}


# In the order shown. A small model leans on the last examples it saw, so the common
# on/off requests come last, and questions and settings first.
TEMPLATES: tuple[Template, ...] = (
    Template("GetLiveContext", "switch", "is the {} on?", name_args()),
    Template("HassStartTimer", NOTHING, "set a timer for 10 minutes", lambda _: {"minutes": 10}),
    Template("HassMediaPause", "media_player", "pause the {}", name_args()),
    Template("HassClimateSetTemperature", "climate", "set the {} to 21 degrees",
             name_args({"temperature": 21})),
    Template("HassSetVolume", "media_player", "set the {} volume to 30 percent",
             name_args({"volume_level": 30}), pick=1),
    Template("HassSetPosition", "cover", "set the {} to 40 percent", name_args({"position": 40})),
    Template("HassLightSet", "light", "set the {} brightness to 30%",
             name_args({"brightness": 30}), pick=1),
    Template("HassFanSetSpeed", "fan", "set the {} speed to 50 percent",
             name_args({"percentage": 50})),
    Template("HassVacuumStart", "vacuum", "start the {}", name_args()),
    Template("HassListAddItem", "todo", "add milk to the {}", name_args({"item": "milk"})),
    Template("HassTurnOff", "lock", "unlock the {}", name_args()),
    Template("HassTurnOn", "cover", "open the {}", name_args(), pick=1),
    Template("HassTurnOff", AREA, "turn off the lights in the {}",
             lambda area: {"area": area, "domain": ["light"]}),
    Template("HassTurnOn", "lock", "lock the {}", name_args(), pick=1),
    Template("HassTurnOff", "cover", "close the {}", name_args()),
    Template("HassTurnOff", "switch", "switch off the {}", name_args(), pick=1),
    Template("HassTurnOn", "light", "turn on the {}", name_args()),
)  # fmt: skip

ACTION_REPLY = "Done."
TIMER_REPLY = "Timer set for 10 minutes."
# Examples that show the whole loop (the tool's result and the reply): the first (a
# question, answered from the result) and the last LAST_FULL ones (what a small model
# copies most: after a result, a short reply, no further call). The others show only
# the call, which is what they teach, at a fifth of the tokens.
LAST_FULL = 3


def example_messages(
    things: Iterable[Thing], areas: Iterable[str], tools: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The example turns (OpenAI chat messages) for a house with ``things`` (exposed
    entities), ``areas`` and ``tools`` (OpenAI function tools): one per template whose
    tool is offered, whose arguments that tool takes, and whose domain (or area) the
    house has."""
    house = House.of(things, areas)
    offered = offered_tools(tools)
    turns: list[list[dict[str, Any]]] = []
    for template in TEMPLATES:
        turn = house.turn(template, offered, f"example_{len(turns) + 1}")
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
        template: Template,
        offered: Mapping[str, tuple[str, tuple[str, ...]]],
        call_id: str,
        *,
        avoid: frozenset[str] = frozenset(),
        live: Mapping[str, Mapping[str, Any]] | None = None,
        rank: Callable[[Thing], Any] | None = None,
        by_area: bool = False,
    ) -> list[dict[str, Any]] | None:
        """``template``'s whole turn on this house (None where its tool is not offered,
        takes other arguments, or the house has nothing to name). The target is the
        ``pick``-th thing of its domain (or the first of highest ``rank``), skipping
        ``avoid`` (entity ids) where others are left. A question reads its target's
        entry in ``live`` (entity id -> HA's live-context entry) where given.
        ``by_area``: a template that names one thing names its target's area instead
        ("set the thermostat in the Bedroom to 21 degrees": ``area``, not ``name``)."""
        tool = offered.get(template.intent)
        if tool is None:
            return None
        name, properties = tool
        target: Thing | None = None
        if template.domain == NOTHING:
            said = ""
        elif template.domain == AREA:
            if not self.areas or "light" not in self.by_domain:
                return None
            said = self.areas[0]
        else:
            found = self.by_domain.get(template.domain) or []
            if by_area:
                found = [t for t in found if t.area]
            if not found:
                return None
            found = [t for t in found if t.entity_id not in avoid] or found
            target = max(found, key=rank) if rank else found[template.pick % len(found)]
            said = target.name
        arguments = template.arguments(said)
        if by_area:
            if target is None or arguments.pop("name", None) is None:
                return None
            noun = NOUNS.get(target.domain, target.domain.replace("_", " "))
            template = replace(template, ask=template.ask.replace("{}", f"{noun} in the {{}}"))
            # An area alone is every entity in it ("turn off the Bedroom"): with the
            # domain where the tool takes one (HassTurnOff), else the tool's own.
            in_domain = {"domain": [target.domain]} if "domain" in properties else {}
            said, target = target.area, None
            arguments = {"area": said, **in_domain, **arguments}
        if not set(arguments) <= set(properties):
            return None
        # In the schema's order: the grammar writes keys in that order, so the model can
        # copy the call (shown "area" first, it wrote only "temperature" and closed).
        arguments = {key: arguments[key] for key in properties if key in arguments}
        info = live.get(target.entity_id) if live is not None and target is not None else None
        return _turn(call_id, template, name, arguments, said, target, info)


# What HA's live-context tool says before the entities it lists.
LIVE_HEADER = "Live Context: An overview of the areas and the devices in this smart home:"


def spoken_state(name: str, info: Mapping[str, Any]) -> str:
    """A short answer that says what ``info`` (a live-context entry) reads: a
    thermostat's target, what a player plays, a sensor's value with its unit, or else
    the state."""
    attributes = info.get("attributes") or {}
    if info.get("domain") == "climate" and attributes.get("temperature") is not None:
        return f"The {name} is set to {attributes['temperature']}."
    if title := attributes.get("media_title"):
        artist = attributes.get("media_artist")
        return f"The {name} is playing {title}{f' by {artist}' if artist else ''}."
    state = info.get("state", "")
    unit = attributes.get("unit_of_measurement")
    return f"The {name} is {state} {unit}." if unit else f"The {name} is {state}."


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
    call_id: str,
    template: Template,
    tool: str,
    arguments: dict[str, Any],
    said: str,
    target: Thing | None,
    info: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """User asks, assistant calls, the tool answers as Home Assistant would, the assistant
    confirms (or, for a question, answers from the tool's result: ``info``, the target's
    live-context entry, where given; else a made-up state)."""
    if template.intent == "GetLiveContext" and info is not None:
        result: dict[str, Any] = {"result": f"{LIVE_HEADER}\n{yaml_util.dump([dict(info)])}"}
        reply = spoken_state(said, info)
    elif template.intent == "GetLiveContext":
        domain = target.domain if target else ""
        state = f"- names: {said}\n  domain: {domain}\n  state: '{template.answer}'\n"
        result = {"success": True, "result": state}
        reply = f"The {said} is {template.answer}."
    elif template.domain == NOTHING:
        result = {"response_type": "action_done", "data": {"success": [], "failed": []}}
        reply = TIMER_REPLY
    else:
        entry = (
            {"name": said, "type": "entity", "id": target.entity_id}
            if target is not None
            else {"name": said, "type": AREA, "id": said.lower().replace(" ", "_")}
        )
        result = {"response_type": "action_done", "data": {"success": [entry], "failed": []}}
        reply = ACTION_REPLY
    call = {"name": tool, "arguments": json.dumps(arguments, ensure_ascii=False)}
    return [
        {"role": "user", "content": template.ask.format(said)},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        },
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
    hass: HomeAssistant, tools: Iterable[Mapping[str, Any]], language: str
) -> tuple[dict[str, Any], ...]:
    """The example turns for this house (none outside English, or without tools)."""
    if not language.lower().startswith("en"):
        return ()
    areas = [area.name for area in ar.async_get(hass).async_list_areas()]
    return tuple(example_messages(exposed_things(hass), areas, tools))
