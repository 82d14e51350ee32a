"""What a turn says after its tools ran (turn/result_speech.py): what HA reports was done."""

from __future__ import annotations

from typing import Any

import pytest
from homeassistant.core import HomeAssistant

import custom_components.hearth  # noqa: F401 - resolve the real package first
from custom_components.hearth.turn.result_speech import (
    Outcome,
    async_responses,
    render_response,
    spoken_outcomes,
)

DONE = "Done."


def acted(
    success: list[dict[str, Any]], failed: list[dict[str, Any]] = (), **speech: str
) -> dict[str, Any]:
    plain = {"plain": {"speech": speech["said"]}} if speech else {}
    data = {"success": success, "failed": list(failed)}
    return {"speech": plain, "response_type": "action_done", "data": data}


def entity(name: str, entity_id: str) -> dict[str, str]:
    return {"type": "entity", "name": name, "id": entity_id}


GARAGE_LIGHT = entity("Garage Door Opener", "light.garage_door_opener")
KITCHEN = entity("Kitchen Light", "light.kitchen_light")


def say(outcomes: list[Outcome], request: str, rendered: str | None = None) -> str | None:
    return spoken_outcomes(
        outcomes, request, lambda _: rendered, DONE, lambda names: f"Failed: {', '.join(names)}."
    )


def test_the_target_asked_for_is_said_as_ha_says_it() -> None:
    outcome = Outcome("HassTurnOn", {"name": "Kitchen Light"}, acted([KITCHEN]))
    assert (
        say([outcome], "turn on the kitchen light", "Turned on the light") == "Turned on the light"
    )


def test_a_target_the_request_did_not_name_is_named() -> None:
    """'Open the curtains' switched on the garage opener's light: said as that."""
    outcome = Outcome("HassTurnOn", {"name": "Garage Door Opener"}, acted([GARAGE_LIGHT]))
    said = say([outcome], "open the curtains", "Turned on the light")
    assert said == "Turned on the light: Garage Door Opener."
    assert say([outcome], "open the curtains") == "Done: Garage Door Opener."


def test_a_target_said_inflected_or_in_the_speech_is_not_named_again() -> None:
    """Polish inflects the name ("lampkę nocną" for "Lampka nocna"); HA's Polish
    sentence names the thing itself: neither is followed by the name once more."""
    lamp = entity("Lampka nocna", "light.lampka_nocna")
    outcome = Outcome("HassTurnOff", {"name": "Lampka nocna"}, acted([lamp]))
    assert say([outcome], "zgaś lampkę nocną", "Wyłączono") == "Wyłączono"
    assert say([outcome], "zgaś wszystko", "Wyłączono Lampka nocna") == "Wyłączono Lampka nocna"
    assert say([outcome], "zgaś wszystko", "Wyłączono") == "Wyłączono: Lampka nocna."


def test_has_own_speech_wins() -> None:
    outcome = Outcome("HassStartTimer", {"minutes": 5}, acted([], said="Timer started"))
    assert say([outcome], "set a timer", "x") == "Timer started"


def test_failed_targets_are_said() -> None:
    outcome = Outcome(
        "HassTurnOff",
        {"area": "Kitchen"},
        acted(
            [{"type": "area", "name": "Kitchen", "id": "kitchen"}, KITCHEN],
            [entity("Kitchen Fan", "fan.kitchen")],
        ),
    )
    assert say([outcome], "turn off the kitchen", "Turned off") == "Turned off Failed: Kitchen Fan."


@pytest.mark.parametrize(
    "result",
    [
        {"error": "MatchFailedError", "error_text": "Multiple entities share the name"},
        {"success": True, "result": "Live Context: ..."},  # a question's answer
        {"response_type": "query_answer", "data": {"success": [KITCHEN], "failed": []}},
        acted([]),  # a call by name that reached nothing
    ],
)
def test_errors_answers_and_no_target_are_left_to_the_model(result: dict[str, Any]) -> None:
    outcome = Outcome("HassTurnOn", {"name": "Kitchen Light"}, result, error="error" in result)
    assert say([outcome], "turn on the kitchen light", "Turned on") is None


async def test_ha_sentences_in_the_users_language(hass: HomeAssistant) -> None:
    """HA's own response sentences, rendered with the target's state (en, de)."""
    hass.states.async_set("light.kitchen_light", "on", {"friendly_name": "Kitchen Light"})
    hass.states.async_set("cover.garage", "opening", {"friendly_name": "Garage"})
    light = Outcome("HassTurnOn", {"name": "Kitchen Light"}, acted([KITCHEN]))
    cover = Outcome("HassTurnOn", {"name": "Garage"}, acted([entity("Garage", "cover.garage")]))
    item = Outcome("HassListAddItem", {"name": "Shopping", "item": "milk"}, acted([]))
    english = await async_responses(hass, "en-US")
    german = await async_responses(hass, "de")
    assert render_response(hass, english.intents, light) == "Turned on the light"
    assert render_response(hass, english.intents, cover) == "Opening"
    assert render_response(hass, english.intents, item) == "Added milk"
    assert render_response(hass, german.intents, light) == "Licht eingeschaltet"
    assert render_response(hass, german.intents, item) == "milk hinzugefügt"
    assert german.failed(hass, ["Garage"]) == "Es ist ein unerwarteter Fehler aufgetreten: Garage."
    nothing = await async_responses(hass, "tlh")  # no intents data: nothing rendered
    assert render_response(hass, nothing.intents, light) is None


async def test_an_error_is_said_as_assist_says_it(hass: HomeAssistant) -> None:
    """Asked to pause a player that is already paused, HA's intent fails on its state:
    Assist says no device is playing, not "An unexpected error occurred"."""
    english = await async_responses(hass, "en")
    german = await async_responses(hass, "de")

    def failed(text: str, **arguments: Any) -> Outcome:
        return Outcome("HassMediaPause", arguments, {"error_text": text}, error=True)

    paused = failed(
        "No entities were in the required state (given name 'Den Speaker', domains "
        "media_player, states playing)",
        name="Den Speaker",
    )
    assert english.error(hass, paused) == "Sorry, no device is playing"
    assert "playing" in german.error(hass, paused)
    assert english.error(hass, failed("No entities were in the required state")) == (
        "An unexpected error occurred"  # no state said: nothing to name
    )
    several = "Multiple entities matched, but a single target is required (given area 'Den')"
    assert english.error(hass, failed(several, area="Den")) == (
        "Sorry, more than one device matched your request"
    )
    assert english.error(hass, failed(several, name="Speaker")) == (
        "Sorry, there are multiple devices called Speaker"
    )


def test_an_action_that_reached_nothing_says_so_never_the_models_words() -> None:
    """HA ran the call (action_done) and reports no target changed: the reply says
    nothing was changed, also beside another call's result; a timer's name is no
    target, so a started timer is said as HA says it."""
    nothing = Outcome("HassTurnOn", {"name": "Kitchen Light"}, acted([]))
    done = Outcome("HassTurnOff", {"name": "Kitchen Light"}, acted([KITCHEN]))
    timer = Outcome("HassStartTimer", {"name": "pasta", "minutes": 5}, acted([]))

    def said(outcomes: list[Outcome]) -> str | None:
        return spoken_outcomes(
            outcomes, "turn on the kitchen light", lambda _: "Turned off", DONE,
            lambda names: "", unchanged="Nothing was changed.",
        )  # fmt: skip

    assert said([nothing]) == "Nothing was changed."
    assert said([done, nothing]) == "Turned off Nothing was changed."
    assert said([timer]) == "Turned off"
