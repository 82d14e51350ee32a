"""A question Home Assistant's own sentences read is answered by Home Assistant
(turn/ha_answer.py): real Home Assistant and engine."""

from __future__ import annotations

from homeassistant.core import HomeAssistant
from homeassistant.helpers import area_registry as ar
from homeassistant.helpers import intent
from pytest_homeassistant_custom_component.common import MockConfigEntry

from .common import ChatSpy, converse, speech


async def test_a_question_ha_reads_is_answered_by_ha_without_the_model(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """ "Is the kitchen light on?" matches HA's question template whole: HA's handler
    reads the house and its words answer; the engine is not asked. HA's answer is in the
    chat log, so a follow-up sees it."""
    with ChatSpy() as spy:
        result = await converse(hass, "is the kitchen light on?")
    assert result.response.response_type is intent.IntentResponseType.QUERY_ANSWER
    assert speech(result) == "No, off"  # HA's English one_yesno; the light is off
    assert spy.bodies == []
    with ChatSpy() as spy:
        await converse(hass, "turn it on", result.conversation_id)
    said = [m.get("content") for m in spy.bodies[0]["messages"] if m["role"] == "assistant"]
    assert "No, off" in said


async def test_what_ha_does_not_read_as_a_question_goes_to_the_model(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """A command HA reads whole is never run by HA here (only questions are); a
    question no template of HA's reads is the model's, from live context; so is one
    whose template reads a kind the house has none of (HA read "windows" as covers and
    answered "No" from nothing)."""
    texts = (
        "turn on the kitchen light",
        "did I leave the kitchen light on?",
        "are any windows open?",
    )
    for text in texts:
        with ChatSpy() as spy:
            await converse(hass, text)
        assert spy.bodies, text
    assert hass.states.get("input_boolean.kitchen_light_power").state == "on"  # the model's


async def test_a_question_that_says_a_place_inflected_is_read_as_the_house_writes_it(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Polish says names inflected: "w kuchni" is in the area "Kuchnia". HA's templates
    read a name only as written, so HA is asked again with it as the house writes it,
    and answers in Polish; the engine is not asked."""
    hass.config.language = "pl"
    areas = ar.async_get(hass)
    kitchen = next(a for a in areas.async_list_areas() if a.name == "Kitchen")
    areas.async_update(kitchen.id, name="Kuchnia")
    await hass.async_block_till_done()
    with ChatSpy() as spy:
        result = await converse(hass, "Które światła są włączone w kuchni?")
    assert result.response.response_type is intent.IntentResponseType.QUERY_ANSWER
    assert spy.bodies == []
