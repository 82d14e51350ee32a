"""The house's names for the engine's grammar: tool calls can only name what exists.

The engine narrows string arguments of the offered tools to these values (the ``hearth``
request extension, see docs/api.md). They are never rendered into the prompt, so the
pinned prefix stays byte-identical; a small model then cannot call ``HassTurnOn`` on a
"porch light" the house does not have.

Only Home Assistant's own intent tools that target entities are narrowed
(``argument_tools``): a timer's ``name`` is free text, and a script tool's arguments are
whatever its author chose. Intents that act on one domain (``HassListAddItem`` on to-do
lists, ``HassClimateSetTemperature`` on thermostats, ...) get only that domain's names
(``Tool.name`` keys): the default model otherwise added items to a light, and looped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_should_expose
from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers import floor_registry as fr
from homeassistant.helpers import intent, llm

from ..tool_names import bare_name, model_tool_names
from .names import HouseNames, Named

# Arguments of the intent tools that name a part of the house.
HOUSE_ARGUMENTS = ("name", "area", "floor", "domain")
MAX_VALUES = 10_000  # the engine's limit per argument
MAX_VALUE_LEN = 256
# Intents whose ``name`` is an entity of one domain (HA's intent handlers, 2026.10).
DOMAIN_INTENTS: dict[str, str] = {
    "HassListAddItem": "todo",
    "HassListCompleteItem": "todo",
    "HassClimateSetTemperature": "climate",
    "HassClimateGetTemperature": "climate",
    "HassLightSet": "light",
    "HassMediaPause": "media_player",
    "HassMediaUnpause": "media_player",
    "HassMediaNext": "media_player",
    "HassMediaPrevious": "media_player",
    "HassSetVolume": "media_player",
    "HassSetVolumeRelative": "media_player",
    "HassMediaSearchAndPlay": "media_player",
    "HassVacuumStart": "vacuum",
    "HassVacuumReturnToBase": "vacuum",
    "HassFanSetSpeed": "fan",
    "HassLawnMowerStartMowing": "lawn_mower",
    "HassLawnMowerDock": "lawn_mower",
}


def tool_domains(hass: HomeAssistant, api: llm.APIInstance) -> dict[str, frozenset[str]]:
    """Tool name as the model sees it -> the entity domains it acts on, for the intent
    tools whose handler says so (HA's ``IntentHandler.platforms``: ``HassSetPosition``
    covers and valves, ``HassClimateSetTemperature`` thermostats). Tools not listed act
    on anything (``HassTurnOn``) or on no entity (a timer)."""
    platforms = {h.intent_type: h.platforms for h in intent.async_get(hass)}
    shown = model_tool_names(tool.name for tool in api.tools)
    domains = {}
    for tool in api.tools:
        if found := platforms.get(getattr(tool, "intent_type", None)):
            domains[shown[tool.name]] = frozenset(found)
    return domains


def allowed_for(
    tools: Iterable[Mapping[str, Any]],
    domains: Mapping[str, frozenset[str]],
    about: frozenset[str] | None,
) -> list[str] | None:
    """Of ``tools`` (OpenAI function tools), the names of those that may act on the
    domains a command is ``about``, by ``domains`` (see ``tool_domains``): those made
    for one of them, and those for any thing (``HassTurnOn``), not those that name no
    thing of the house (a timer: asked to skip a track, the default model cancelled
    every timer). A command about no domain (a timer) may call only the tools that name
    no entity. None where that leaves them all, or nothing is known."""
    tools = list(tools)
    names = [str((tool.get("function") or {}).get("name", "")) for tool in tools]
    if about is None:
        return None
    targeting = set(entity_tools(tools))
    if about:
        allowed = [
            n
            for n in names
            if ((d := domains.get(n)) is not None and d & about) or (d is None and n in targeting)
        ]
    else:
        allowed = [n for n in names if n not in targeting]
    return allowed if allowed and len(allowed) < len(names) else None


# Intents that act on every entity an area (or floor) holds when the call names no thing
# and no domain: "turn off" the office would switch off its heating and unlock its door.
AREA_WIDE = frozenset({"HassTurnOn", "HassTurnOff"})


def scoped_arguments(
    tool: str, arguments: dict[str, Any], about: frozenset[str] | None
) -> dict[str, Any]:
    """The ``arguments`` of a call of ``tool``, kept to the domains the request named
    (``about``, see hints.Hint) where the call names an area or floor but neither a thing
    nor a domain: ``HassTurnOff {"area": "Office"}`` acts on everything in the office,
    its thermostat and its locks too, when "the lights in the office" were meant."""
    if (
        bare_name(tool) not in AREA_WIDE
        or not about
        or not {"area", "floor"} & set(arguments)
        or {"name", "domain"} & set(arguments)
    ):
        return arguments
    return {**arguments, "domain": sorted(about)}


def entity_tools(tools: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the offered intent tools whose house arguments name entities, and of
    the live-context tool (its ``name``, ``area`` and ``domain`` filter the house)."""
    names = []
    for tool in tools:
        function = tool.get("function") or {}
        name = str(function.get("name", ""))
        short = bare_name(name)
        properties = (function.get("parameters") or {}).get("properties") or {}
        if (
            (short.startswith("Hass") or short == "GetLiveContext")
            and "Timer" not in short
            and set(properties) & {*HOUSE_ARGUMENTS}
        ):
            names.append(name)
    return sorted(names)


def _clean(values: Iterable[object]) -> list[str]:
    """Distinct, non-empty strings within the engine's limits (aliases may also hold
    non-string markers, such as "the entity's own name")."""
    texts = {v.strip() for v in values if isinstance(v, str)}
    return sorted(v for v in texts if v and len(v) <= MAX_VALUE_LEN)[:MAX_VALUES]


def names_by_domain(hass: HomeAssistant) -> dict[str, list[object]]:
    """Exposed entities' names and aliases, by domain."""
    entities = er.async_get(hass)
    by_domain: dict[str, list[object]] = {}
    for state in hass.states.async_all():
        if not async_should_expose(hass, conversation.DOMAIN, state.entity_id):
            continue
        own: list[object] = [state.name]
        if (entry := entities.async_get(state.entity_id)) is not None:
            own.extend(entry.aliases)
        by_domain.setdefault(state.domain, []).extend(own)
    return by_domain


def house_names(hass: HomeAssistant) -> HouseNames:
    """What the house calls its exposed things (their names and aliases as HA's intent
    matching reads them), its areas and its floors (house/names.py)."""
    entities = er.async_get(hass)
    things: list[tuple[list[str], Named]] = []
    for state in hass.states.async_all():
        if not async_should_expose(hass, conversation.DOMAIN, state.entity_id):
            continue
        names = [state.name]
        entry = entities.async_get(state.entity_id)
        device_class = state.attributes.get("device_class")
        main = False
        if entry is not None:
            names += intent.async_get_entity_aliases(hass, entry, state=state)
            device_class = entry.device_class or entry.original_device_class or device_class
            # The device's own entity: it is named by its device alone.
            main = bool(entry.device_id and entry.has_entity_name and not entry.original_name)
            main = main and entry.name is None
        things.append((names, Named(state.entity_id, _text(device_class), main)))
    areas = ar.async_get(hass).async_list_areas()
    floors = fr.async_get(hass).async_list_floors()
    return HouseNames.of(
        things,
        [name for area in areas for name in (area.name, *area.aliases)],
        [name for floor in floors for name in (floor.name, *floor.aliases)],
    )


def _text(value: object) -> str | None:
    return str(value) if value else None


def domain_names(hass: HomeAssistant) -> dict[str, list[str]]:
    """Exposed entities' names and aliases by domain, as the engine takes values."""
    return {domain: _clean(names) for domain, names in names_by_domain(hass).items()}


def house_values(hass: HomeAssistant, tools: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ``hearth`` extension for requests with ``tools``, or None if nothing applies."""
    scoped = entity_tools(tools)
    if not scoped:
        return None
    by_domain = names_by_domain(hass)
    names = [name for own in by_domain.values() for name in own]
    domains = set(by_domain)
    areas = [
        name
        for area in ar.async_get(hass).async_list_areas()
        for name in (area.name, *area.aliases)
    ]
    floors = [
        name
        for floor in fr.async_get(hass).async_list_floors()
        for name in (floor.name, *floor.aliases)
    ]
    values = {
        "name": _clean(names),
        "area": _clean(areas),
        "floor": _clean(floors),
        "domain": _clean(domains),
    }
    for tool in scoped:
        short = bare_name(tool)
        if (domain := DOMAIN_INTENTS.get(short)) is not None:
            values[f"{short}.name"] = _clean(by_domain.get(domain, ()))
    # The engine refuses empty lists: an argument with nothing to name stays free.
    values = {key: found for key, found in values.items() if found}
    if not values:
        return None
    return {"argument_values": values, "argument_tools": scoped}
