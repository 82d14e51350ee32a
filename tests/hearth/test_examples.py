"""Worked examples in the pinned prefix (prefix/examples.py): valid calls of this house's tools.

The pure part is checked on hand-made houses; the rendering through real Home Assistant
(the Assist API's real tools, exposure, the house's language, the agent option) on the
``house`` fixture.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.setup import async_setup_component

from custom_components.hearth.backend.api import HearthClient
from custom_components.hearth.const import CONF_EXAMPLES, CONF_MAX_TOKENS
from custom_components.hearth.language.intents_data import async_language_data, load_language_data
from custom_components.hearth.prefix.budget import MARGIN, RESERVE_SHARE
from custom_components.hearth.prefix.examples import LAST_FULL, STEPS, Thing, example_messages
from custom_components.hearth.prefix.render import async_render_prefix

from .common import (
    KITCHEN_LIGHT,
    EngineProcess,
    agent_options,
    async_setup_entry,
    converse,
    function_tool,
    hearth_traces,
    make_entry,
)

TOOLS = [
    function_tool("intent__HassTurnOn", "name", "area", "domain"),
    function_tool("intent__HassTurnOff", "name", "area", "domain"),
    function_tool("intent__HassSetPosition", "name", "position"),
    function_tool("homeassistant__GetLiveContext", "name", "domain", "area"),
]
THINGS = [
    Thing("light.attic", "Attic Light"),
    Thing("light.porch", "Porch Light"),
    Thing("cover.garage", "Garage Door"),
    Thing("switch.kettle", "Kettle"),
    Thing("climate.hall", "Hall Thermostat"),  # no climate tool offered: no example
]


def _calls(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for message in messages
        for call in message.get("tool_calls", ())
    ]


def test_nothing_to_show_without_tools_or_things() -> None:
    """Examples in each language: test_languages.py."""
    data = load_language_data("en")
    assert example_messages(THINGS, ["Kitchen"], [], data) == []
    assert example_messages([], [], TOOLS, data) == []
    assert example_messages(THINGS, ["Kitchen"], TOOLS, None) == []


def test_the_first_turn_reads_the_house_and_the_last_ones_show_the_whole_loop() -> None:
    messages = example_messages(THINGS, ["Kitchen"], TOOLS, load_language_data("en"))
    calls = _calls(messages)
    assert calls[0][0] == "homeassistant__GetLiveContext"
    assert calls[-1] == ("intent__HassTurnOn", {"name": "Attic Light"})
    assert [m["role"] for m in messages[-4:]] == ["user", "assistant", "tool", "assistant"]
    assert messages[-1]["content"] == "Turned on the light"  # HA's response, not "Done."
    assert not any(arguments.get("name") == "Hall Thermostat" for _, arguments in calls)


def test_the_examples_stay_few_whatever_the_house_size() -> None:
    """Issue 49: the pinned examples are a few hundred tokens on any house. One turn per
    step at most, the same turns on a house of 1,000 things as on one of a few, and only
    the question and the last one show a result and a reply."""
    tools = [
        *TOOLS,
        function_tool("intent__HassClimateSetTemperature", "name", "temperature"),
        function_tool("intent__HassMediaPause", "name"),
    ]
    kinds = (("light", "Lamp"), ("lock", "Lock"), ("climate", "Thermostat"))
    kinds += (("switch", "Plug"), ("cover", "Blind"), ("media_player", "Speaker"))

    def house(rooms: int) -> list[Thing]:
        return [
            Thing(f"{domain}.room_{n:03}", f"Room {n:03} {name}", area=f"Room {n:03}")
            for n in range(rooms)
            for domain, name in kinds
        ]

    data = load_language_data("en")
    small = example_messages(house(2), ["Room 000", "Room 001"], tools, data)
    areas = [f"Room {n:03}" for n in range(170)]
    big = example_messages(house(170), areas, tools, data)
    assert len(house(170)) > 1000
    assert [m["role"] for m in big] == [m["role"] for m in small]
    assert sum(m["role"] == "user" for m in big) <= len(STEPS)
    assert [m["role"] for m in big].count("tool") == 1 + LAST_FULL
    # About four characters a token: a few hundred tokens.
    assert len(json.dumps(big, ensure_ascii=False)) < 2500


@pytest.fixture
async def assist(hass: HomeAssistant, house: None) -> None:
    assert await async_setup_component(hass, "conversation", {})
    await async_language_data(hass, "en")  # prefix/render.py does not load it yet
    hass.states.async_set("switch.kettle", "off", {"friendly_name": "Kettle"})
    async_expose_entity(hass, "conversation", "switch.kettle", True)
    hass.states.async_set("switch.secret_safe", "off", {"friendly_name": "Secret Safe"})
    async_expose_entity(hass, "conversation", "switch.secret_safe", False)


async def test_the_prefix_pins_examples_of_exposed_entities_only(
    hass: HomeAssistant, assist: None
) -> None:
    on = agent_options(**{CONF_EXAMPLES: True})
    prefix = await async_render_prefix(hass, on)
    examples = prefix.messages[1:]
    assert examples and examples == list(prefix.examples)
    offered = {t["function"]["name"] for t in prefix.tools}
    calls = _calls(examples)
    assert calls and all(name in offered for name, _ in calls)
    text = json.dumps(examples)
    assert "Kitchen Light" in text and "Kettle" in text
    assert "Secret Safe" not in text
    # Names, never states: a state change leaves the pinned bytes as they were.
    hass.states.async_set(KITCHEN_LIGHT, "on", {"friendly_name": "Kitchen Light"})
    hass.states.async_set("switch.kettle", "on", {"friendly_name": "Kettle"})
    assert (await async_render_prefix(hass, on)).data == prefix.data


async def test_no_examples_when_off_or_no_language_data(hass: HomeAssistant, assist: None) -> None:
    off = await async_render_prefix(hass, agent_options(**{CONF_EXAMPLES: False}))
    assert off.examples == () and len(off.messages) == 1
    hass.config.language = "eo"  # no intents data for Esperanto
    esperanto = await async_render_prefix(hass, agent_options(**{CONF_EXAMPLES: True}))
    assert esperanto.examples == ()


async def test_a_turn_with_examples_pinned_acts_on_the_house(
    hass: HomeAssistant, assist: None, engine: EngineProcess
) -> None:
    """The default options pin the examples with the house; the engine takes them (its
    chat template renders the example calls and results), and a turn works through them."""
    entry = make_entry(engine.url, **{CONF_EXAMPLES: True})
    await async_setup_entry(hass, entry)
    agent = next(iter(entry.subentries))
    prefix = await entry.runtime_data.prefixes.async_render(agent)
    assert prefix.examples
    with_examples = entry.runtime_data.prefixes.agent(agent).tokens
    assert with_examples
    await converse(hass, "turn on the kitchen light")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
    turn = hearth_traces()[-1]
    assert turn["cached_tokens"] >= with_examples  # the examples are pinned, not re-sent


async def test_examples_that_do_not_fit_the_model_context_are_left_out(
    hass: HomeAssistant,
    assist: None,
    engine: EngineProcess,
    private_engine_factory: Callable[..., EngineProcess],
) -> None:
    """A house prompt whose worked examples do not fit the room the model's context
    leaves the house (``prefix/budget.py``), while the house alone does: the agent pins,
    and serves, the prompt without them, listing the whole house (a thing left out
    would cost the commands naming it; the examples only help the model phrase a call)."""
    client = HearthClient(async_get_clientsession(hass), engine.url, None)
    on = await async_render_prefix(hass, agent_options(**{CONF_EXAMPLES: True}))
    off = await async_render_prefix(hass, agent_options())
    with_examples = (await client.async_put_prefix("measure.on", on.pin_body()))["tokens"]
    without = (await client.async_put_prefix("measure.off", off.pin_body()))["tokens"]
    share = 1 - RESERVE_SHARE  # of the context, the house's
    low, high = without * MARGIN / share, with_examples / share
    assert low + 100 < high
    context = round((low + high) / 2)
    short = private_engine_factory(args=("--max-context", str(context)))
    entry = make_entry(short.url, **{CONF_EXAMPLES: True, CONF_MAX_TOKENS: 64})
    await async_setup_entry(hass, entry)
    await hass.async_block_till_done(wait_background_tasks=True)  # fitted once counted
    agent = entry.runtime_data.prefixes.agent(next(iter(entry.subentries)))
    assert agent.pinned is not None and agent.pinned.examples == ()
    assert agent.pinned.house is not None and not agent.pinned.house.left_out
    assert agent.tokens == without and agent.error is None
    await converse(hass, "turn on the kitchen light")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
