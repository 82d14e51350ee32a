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

``house_examples`` picks the entities (HA glue); ``example_messages`` is pure.
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


@dataclass(frozen=True, slots=True)
class Thing:
    """An exposed entity, as the examples name it."""

    entity_id: str
    name: str

    @property
    def domain(self) -> str:
        return self.entity_id.split(".", 1)[0]


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


def _name(extra: Mapping[str, Any] | None = None) -> Callable[[str], dict[str, Any]]:
    return lambda name: {"name": name, **(extra or {})}


# In the order shown. A small model leans on the last examples it saw, so the common
# on/off requests come last, and questions and settings first.
TEMPLATES: tuple[Template, ...] = (
    Template("GetLiveContext", "switch", "is the {} on?", _name()),
    Template("HassStartTimer", NOTHING, "set a timer for 10 minutes", lambda _: {"minutes": 10}),
    Template("HassMediaPause", "media_player", "pause the {}", _name()),
    Template("HassClimateSetTemperature", "climate", "set the {} to 21 degrees",
             _name({"temperature": 21})),
    Template("HassSetVolume", "media_player", "set the {} volume to 30 percent",
             _name({"volume_level": 30}), pick=1),
    Template("HassSetPosition", "cover", "set the {} to 40 percent", _name({"position": 40})),
    Template("HassLightSet", "light", "set the {} brightness to 30%",
             _name({"brightness": 30}), pick=1),
    Template("HassFanSetSpeed", "fan", "set the {} speed to 50 percent",
             _name({"percentage": 50})),
    Template("HassVacuumStart", "vacuum", "start the {}", _name()),
    Template("HassListAddItem", "todo", "add milk to the {}", _name({"item": "milk"})),
    Template("HassTurnOff", "lock", "unlock the {}", _name()),
    Template("HassTurnOn", "cover", "open the {}", _name(), pick=1),
    Template("HassTurnOff", AREA, "turn off the lights in the {}",
             lambda area: {"area": area, "domain": ["light"]}),
    Template("HassTurnOn", "lock", "lock the {}", _name(), pick=1),
    Template("HassTurnOff", "cover", "close the {}", _name()),
    Template("HassTurnOff", "switch", "switch off the {}", _name(), pick=1),
    Template("HassTurnOn", "light", "turn on the {}", _name()),
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
    by_domain: dict[str, list[Thing]] = {}
    for thing in sorted(things, key=lambda t: t.entity_id):
        by_domain.setdefault(thing.domain, []).append(thing)
    area_names = sorted(areas)
    offered = _offered(tools)
    turns: list[list[dict[str, Any]]] = []
    for template in TEMPLATES:
        tool = offered.get(template.intent)
        if tool is None:
            continue
        name, properties = tool
        target: Thing | None = None
        if template.domain == NOTHING:
            said = ""
        elif template.domain == AREA:
            if not area_names or "light" not in by_domain:
                continue
            said = area_names[0]
        else:
            found = by_domain.get(template.domain)
            if not found:
                continue
            target = found[template.pick % len(found)]
            said = target.name
        arguments = template.arguments(said)
        if not set(arguments) <= properties:
            continue
        turns.append(_turn(len(turns) + 1, template, name, arguments, said, target))
    messages: list[dict[str, Any]] = []
    for i, turn in enumerate(turns):
        full = i == 0 or i >= len(turns) - LAST_FULL
        messages += turn if full else turn[:2]
    return messages


def _offered(tools: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, set[str]]]:
    """Short tool name (``HassTurnOn`` for ``intent__HassTurnOn``) -> (full name, its
    argument names)."""
    offered: dict[str, tuple[str, set[str]]] = {}
    for tool in tools:
        function = tool.get("function") or {}
        name = str(function.get("name", ""))
        properties = (function.get("parameters") or {}).get("properties") or {}
        offered.setdefault(name.rsplit("__", 1)[-1], (name, set(properties)))
    return offered


def _turn(  # noqa: PLR0917
    index: int,
    template: Template,
    tool: str,
    arguments: dict[str, Any],
    said: str,
    target: Thing | None,
) -> list[dict[str, Any]]:
    """User asks, assistant calls, the tool answers as Home Assistant would, the assistant
    confirms (or, for a question, answers from the tool's result)."""
    call_id = f"example_{index}"
    if template.intent == "GetLiveContext":
        state = f"- names: {said}\n  domain: {target.domain if target else ''}\n  state: 'off'\n"
        result: dict[str, Any] = {"success": True, "result": state}
        reply = f"The {said} is off."
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


def house_examples(
    hass: HomeAssistant, tools: Iterable[Mapping[str, Any]], language: str
) -> tuple[dict[str, Any], ...]:
    """The example turns for this house (none outside English, or without tools)."""
    if not language.lower().startswith("en"):
        return ()
    things = []
    for state in hass.states.async_all():
        if not async_should_expose(hass, conversation.DOMAIN, state.entity_id):
            continue
        if state.name:
            things.append(Thing(state.entity_id, state.name))
    areas = [area.name for area in ar.async_get(hass).async_list_areas()]
    return tuple(example_messages(things, areas, tools))
