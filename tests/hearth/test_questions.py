"""A question's turn starts by reading the house (questions.py), through real Home
Assistant and a real engine: the engine's grammar lets the first request call only the
live-context tool, so a question is never taken for a command."""

from __future__ import annotations

import pytest
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.const import CONF_READ_FIRST
from custom_components.hearth.questions import is_question, live_context_tool

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
        ("what's the temperature in the kitchen", True),
        ("Which lights are on in the living room?", True),
        ("How much power is the house using?", True),
        ("  Does the garage door stand open", True),
        ("Turn on the kitchen light", False),
        ("Can you turn on the kitchen light?", False),  # a polite command
        ("Please lock the front door", False),
        ("Island lights on", False),  # "is" only as a whole word
        ("Could you check if the kitchen light is on?", True),  # asks to be told
        ("please tell me whether the door is locked", True),
        ("Check the mail and turn on the light", False),
        ("", False),
    ],
)
def test_english_questions_start_with_a_question_word(text: str, asks: bool) -> None:
    assert is_question(text, "en") is asks
    assert is_question(text, "en-GB") is asks


def test_other_languages_are_never_questions_here() -> None:
    assert not is_question("Is the front door locked?", "de")


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
        await converse(hass, "Is the kitchen light on?")
        await converse(hass, "turn on the kitchen light")
    question = spy.bodies[0]
    if read_first:
        assert question["tool_choice"] == {
            "type": "function",
            "function": {"name": "GetLiveContext"},
        }
        later = [body for body in spy.bodies[1:] if "tool_choice" in body]
        assert later == []  # only a question's first request; commands go as before
    else:
        assert "tool_choice" not in question
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
