"""A question's turn starts by reading the house (language/questions.py), through real Home
Assistant and a real engine: the engine's grammar lets the first request call only the
live-context tool, so a question is never taken for a command."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.const import CONF_READ_FIRST
from custom_components.hearth.language.intents_data import load_language_data
from custom_components.hearth.language.questions import is_question, live_context_tool

from .common import (
    KITCHEN_LIGHT,
    ChatSpy,
    EngineProcess,
    async_setup_entry,
    converse,
    make_entry,
)


@pytest.mark.parametrize(
    ("text", "asks"),
    [
        ("Is the front door locked?", True),
        ("Which lights are on in the living room?", True),
        ("is the kettle on", True),  # HA's question template, no question mark
        ("Turn on the kitchen light", False),
        ("Please lock the front door", False),
        ("Island lights on", False),
        ("", False),
    ],
)
def test_questions_by_home_assistants_templates_and_punctuation(text: str, asks: bool) -> None:
    """Other languages, names and polite commands: test_languages.py."""
    data = load_language_data("en")
    assert is_question(text, "en", data) is asks
    assert is_question(text, "en-GB", data) is asks


def test_a_question_is_no_polite_command_whose_area_is_its_first_words() -> None:
    """ "Did I leave the kitchen light on?" matched HA's "{area} {name} on" with any words
    as the area ("did I leave"): told from a polite command by the house's own areas, it
    is a question; "can you turn on the kitchen light?" is still a command."""
    data = load_language_data("en")
    names = [("Kitchen Light", "light")]
    places = (["Kitchen", "Living Room"], ["Upstairs"])
    asked = "Did I leave the kitchen light on?"
    assert not is_question(asked, "en", data, names=names)  # any words as an area
    assert is_question(asked, "en", data, names=names, places=places)
    polite = "can you turn on the kitchen light?"
    assert not is_question(polite, "en", data, names=names, places=places)
    assert not is_question("can you turn the kitchen lights on?", "en", data, names=names,
                           places=places)  # fmt: skip


def test_the_live_context_tool_is_found_by_its_short_name() -> None:
    tools = [
        {"type": "function", "function": {"name": "intent__HassTurnOn"}},
        {"type": "function", "function": {"name": "homeassistant__GetLiveContext"}},
    ]
    assert live_context_tool(tools) == "homeassistant__GetLiveContext"
    assert live_context_tool(tools[:1]) is None


@pytest.mark.parametrize("read_first", [True, False], ids=["read-first", "off"])
async def test_a_question_turn_starts_with_the_live_context_tool(
    hass: HomeAssistant, house: None, engine: EngineProcess, read_first: bool
) -> None:
    assert await async_setup_component(hass, "conversation", {})
    entry = make_entry(engine.url, **{CONF_READ_FIRST: read_first})
    await async_setup_entry(hass, entry)
    with ChatSpy() as spy:
        await converse(hass, "Did I leave the kitchen light on?")  # not a sentence of HA's
        await converse(hass, "turn on the kitchen light")
    question = spy.bodies[0]
    if read_first:
        assert question["tool_choice"] == {
            "type": "function",
            "function": {"name": "GetLiveContext"},
        }
        # Only a question's first request reads; a command's must act (turn/policy.py).
        later = [body.get("tool_choice") for body in spy.bodies[1:]]
        assert not any(isinstance(c, dict) and c.get("type") == "function" for c in later)
    else:
        # Not forced to read; still never to act: words, or a tool that reads.
        assert question["tool_choice"] == {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "auto",
                "tools": [
                    {"type": "function", "function": {"name": "GetDateTime"}},
                    {"type": "function", "function": {"name": "GetLiveContext"}},
                ],
            },
        }
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
