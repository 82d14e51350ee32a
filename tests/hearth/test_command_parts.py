"""Several commands in one sentence (turn/parts.py): pure over HA's intents data, then a
real turn through real Home Assistant and a real engine (tiny-tools), where each part
runs as a turn of its own and both happen."""

from __future__ import annotations

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant

from custom_components.hearth.const import CONF_EXAMPLES
from custom_components.hearth.house.names import HouseNames, Named
from custom_components.hearth.language.intents_data import load_language_data
from custom_components.hearth.turn.parts import command_parts
from custom_components.hearth.turn.run import Part

from .common import (
    KITCHEN_LIGHT,
    EngineProcess,
    async_setup_entry,
    converse,
    hearth_traces,
    make_entry,
    speech,
)
from .conftest import async_setup_house

DATA = {language: load_language_data(language) for language in ("en", "de", "pl")}
THINGS = {
    "en": [("Kitchen Light", "light.kitchen"), ("Ceiling Fan", "fan.ceiling"),
           ("Front Door", "lock.front_door")],
    "de": [("Schreibtischlampe", "light.desk"), ("Deckenventilator", "fan.ceiling")],
    "pl": [("Lampka nocna", "light.lampka_nocna"), ("Kinkiet", "light.kinkiet"),
           ("Rolety", "cover.rolety")],
}  # fmt: skip
AREAS = {"en": ["Kitchen"], "de": ["Küche"], "pl": ["Sypialnia"]}


def names(language: str) -> HouseNames:
    things = [([name], Named(entity_id)) for name, entity_id in THINGS[language]]
    return HouseNames.of(things, AREAS[language])


@pytest.mark.parametrize(
    ("language", "text", "parts"),
    [
        ("en", "turn on the kitchen light and turn off the ceiling fan",
         ("turn on the kitchen light", "turn off the ceiling fan")),
        ("en", "turn on the kitchen light and then lock the front door",
         ("turn on the kitchen light", "lock the front door")),
        # Polish, its names said inflected ("lampkę nocną" is the "Lampka nocna").
        ("pl", "Zgaś lampkę nocną i zapal kinkiet", ("Zgaś lampkę nocną", "zapal kinkiet")),
        ("pl", "Opuść rolety i zgaś światło w sypialni",
         ("Opuść rolety", "zgaś światło w sypialni")),
        ("de", "schalte die Schreibtischlampe ein und schalte den Deckenventilator aus",
         ("schalte die Schreibtischlampe ein", "schalte den Deckenventilator aus")),
        # Three commands.
        ("en", "turn on the kitchen light, turn off the ceiling fan and lock the front door",
         ("turn on the kitchen light,", "turn off the ceiling fan", "lock the front door")),
    ],
)  # fmt: skip
def test_a_request_of_several_commands_is_split_into_them(
    language: str, text: str, parts: tuple[str, ...]
) -> None:
    data = DATA[language]
    assert data is not None
    assert command_parts(data, text, names(language)) == parts


@pytest.mark.parametrize(
    ("language", "text"),
    [
        # One command: HA's templates read it whole.
        ("en", "turn on the kitchen light"),
        ("pl", "Zgaś lampkę nocną"),
        # "the ceiling fan" alone reads as turning it on in HA's templates: the fan is not
        # turned on by a sentence that turns things off.
        ("en", "turn off the kitchen light and the ceiling fan"),
        # A part that says no command of its own ("it"): left to the model, whole.
        ("de", "schalte die Schreibtischlampe ein und dann schalte sie aus"),
        # A question, and words HA reads as nothing.
        ("en", "is the kitchen light on and is the front door locked"),
        ("en", "please could you make it nice and warm in here tonight"),
    ],
)
def test_a_request_that_is_not_several_read_commands_is_not_split(language: str, text: str) -> None:
    data = DATA[language]
    assert data is not None
    assert command_parts(data, text, names(language)) == ()


def test_a_parts_requests_see_the_part_and_its_own_calls_only() -> None:
    """The chat log as a part's requests see it: the part in place of the sentence, and
    nothing of the earlier parts (each says what it did)."""
    system = conversation.SystemContent("prompt")
    asked = conversation.UserContent("turn on the light and turn off the fan")
    first = conversation.AssistantContent("hearth", "Turned on the light")
    second = conversation.AssistantContent("hearth", "Turned off the fan")
    log = [system, asked, first]
    seen = Part("turn on the light", 2).content(log)
    assert seen[0] is system and seen[2] is first and len(seen) == 3
    assert seen[1].content == "turn on the light" and seen[1].role == "user"
    seen = Part("turn off the fan", 3).content([*log, second])
    assert [item.content for item in seen] == ["prompt", "turn off the fan", second.content]


async def test_both_commands_of_a_sentence_happen_and_are_said(
    hass: HomeAssistant, engine: EngineProcess
) -> None:
    """Real Home Assistant and engine: "turn on the kitchen light and turn off the desk
    fan" turns the light on and the fan off (before, one of them happened), and says
    what HA did for each."""
    await async_setup_house(hass, desk_fan="Desk Fan")
    await hass.services.async_call(
        "input_boolean", "turn_on", {"entity_id": "input_boolean.desk_fan"}, blocking=True
    )
    async_expose_entity(hass, "conversation", "input_boolean.desk_fan", True)
    await async_setup_entry(hass, make_entry(engine.url, **{CONF_EXAMPLES: True}))
    result = await converse(hass, "turn on the kitchen light and turn off the desk fan")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
    assert hass.states.get("input_boolean.desk_fan").state == "off"
    trace = hearth_traces()[-1]
    assert trace["parts"] == ["turn on the kitchen light", "turn off the desk fan"]
    said = speech(result)
    assert said.startswith("Turned on") and ". Turned off" in said
