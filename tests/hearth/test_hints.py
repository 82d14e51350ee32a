"""The example nearest to a request (turn/hints.py), sent right before it.

The choice is pure and checked on a hand-made house; where it goes in a request
(turn/prompt.py) and that a real turn sends it (real Home Assistant, the tiny-tools engine)
are checked below.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from homeassistant.components import conversation
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component

from custom_components.hearth.const import CONF_EXAMPLES
from custom_components.hearth.house.names import HouseNames, Named
from custom_components.hearth.house.values import allowed_for, scoped_arguments
from custom_components.hearth.language.intents_data import async_language_data, load_language_data
from custom_components.hearth.language.words import block_words, words
from custom_components.hearth.prefix.examples import Thing
from custom_components.hearth.prefix.value import HousePrefix
from custom_components.hearth.turn.hints import HINT_CALL_ID, hint_messages
from custom_components.hearth.turn.prompt import build_messages

from .common import (
    KITCHEN_LIGHT,
    ChatSpy,
    EngineProcess,
    async_setup_entry,
    converse,
    function_tool,
    hearth_traces,
    make_entry,
)

ENTITY = ("name", "area", "domain")
TOOLS = [
    function_tool("intent__HassTurnOn", *ENTITY),
    function_tool("intent__HassTurnOff", *ENTITY),
    function_tool("intent__HassSetPosition", "name", "position"),
    function_tool("climate__HassClimateSetTemperature", "name", "area", "temperature"),
    function_tool("media_player__HassMediaPause", "name"),
    function_tool("media_player__HassMediaUnpause", "name"),
    function_tool("homeassistant__GetLiveContext", *ENTITY),
]
THINGS = [
    Thing("light.attic", "Attic Light"),
    Thing("light.porch", "Porch Light", ("front light",)),
    Thing("lock.front", "Front Door"),
    Thing("lock.shed", "Shed Lock"),
    Thing("climate.hall", "Hall Thermostat", area="Den"),
    Thing("climate.loft", "Loft Thermostat", area="Loft"),
    Thing("media_player.den", "Den Speaker"),
    Thing("media_player.loft", "Loft Speaker"),
    Thing("sensor.loft_temperature", "Loft Temperature"),
    Thing("sensor.den_temperature", "Den Temperature"),
    Thing("sensor.power", "House Power"),
    Thing("switch.kettle", "Kettle"),
    Thing("vacuum.robbie", "Robbie"),  # no vacuum tool offered
]
AREAS = ["Attic", "Den", "Loft"]


def _live(name: str, domain: str, state: str, **attributes: str) -> dict[str, Any]:
    """An entry as Home Assistant's live-context tool lists it."""
    info: dict[str, Any] = {"names": name, "domain": domain, "state": state}
    return {**info, "attributes": attributes} if attributes else info


LIVE = {
    "sensor.loft_temperature": _live("Loft Temperature", "sensor", "19.5",
                                     unit_of_measurement="°C"),
    "sensor.power": _live("House Power", "sensor", "612", unit_of_measurement="W"),
    "climate.hall": _live("Hall Thermostat", "climate", "heat", temperature="20"),
    "media_player.den": _live("Den Speaker", "media_player", "playing",
                              media_title="Clair de Lune", media_artist="Debussy"),
    "lock.shed": _live("Shed Lock", "lock", "locked"),
}  # fmt: skip


EN = load_language_data("en")


def _hint(text: str, *, question: bool = False) -> list[dict[str, Any]]:
    return hint_messages(text, THINGS, AREAS, TOOLS, LIVE, question=question, data=EN).messages


def _call(hint: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    call = hint[1]["tool_calls"][0]
    assert call["id"] == HINT_CALL_ID
    return call["function"]["name"], json.loads(call["function"]["arguments"])


def test_the_hint_shows_the_tool_the_request_needs_on_another_thing() -> None:
    """Other languages: test_languages.py."""
    assert _call(_hint("Lock the front door")) == ("intent__HassTurnOn", {"name": "Shed Lock"})
    assert _call(_hint("unlock the front door")) == ("intent__HassTurnOff", {"name": "Shed Lock"})
    tool, arguments = _call(_hint("Set the hall thermostat to 22 degrees"))
    assert tool == "climate__HassClimateSetTemperature"
    assert arguments["name"] == "Loft Thermostat"
    assert _call(_hint("switch the front light off")) == (
        "intent__HassTurnOff",
        {"name": "Attic Light"},
    )
    # The intent a template reads in it (HA's matcher would run it); none where only
    # the words decide, or a question.
    read = hint_messages("Lock the front door", THINGS, AREAS, TOOLS, LIVE, data=EN)
    assert read.intent == "HassTurnOn"
    assert read.slots == {"name": "Front Door"}
    lights = hint_messages("turn off the lights in the attic", THINGS, AREAS, TOOLS, LIVE, data=EN)
    assert (lights.intent, lights.slots) == ("HassTurnOff", {"area": "Attic", "domain": "light"})
    unread = hint_messages("resume the music on the den speaker", THINGS, AREAS, TOOLS, LIVE,
                           platforms=PLATFORMS, data=EN)  # fmt: skip
    assert unread and unread.intent is None
    asked = hint_messages("is the den speaker on?", THINGS, AREAS, TOOLS, LIVE, question=True,
                          data=EN)  # fmt: skip
    assert asked.intent is None
    # Floors (and areas' aliases) read as HA's matcher reads them.
    upstairs = hint_messages("Turn off the lights upstairs", THINGS, AREAS, TOOLS, LIVE,
                             data=EN, floors=["Upstairs"])  # fmt: skip
    assert (upstairs.intent, upstairs.slots) == (
        "HassTurnOff",
        {"floor": "Upstairs", "domain": "light"},
    )
    roof = hint_messages("turn on the lights in the roof space", THINGS, AREAS, TOOLS, LIVE,
                         data=EN, area_aliases=["Roof Space"])  # fmt: skip
    assert roof.slots == {"area": "Roof Space", "domain": "light"}
    covers = [Thing("cover.den", "Den Curtains", area="Den"),
              Thing("cover.loft", "Loft Curtains", area="Loft")]  # fmt: skip
    curtains = hint_messages("open the curtains in the den", covers, AREAS, TOOLS, LIVE, data=EN)
    assert curtains.intent == "HassTurnOn"
    assert curtains.slots == {"area": "Den", "domain": "cover", "device_class": "curtain"}
    # An action's example is its call alone (the turn ends with what HA says was
    # done); a question's shows the result and the answer (below).
    hint = _hint("turn on the kettle")
    assert [m["role"] for m in hint] == ["user", "assistant"]
    asked = _hint("is the den speaker on?", question=True)
    assert [m["role"] for m in asked] == ["user", "assistant", "tool", "assistant"]
    assert asked[2]["tool_call_id"] == HINT_CALL_ID


PLATFORMS = {
    "climate__HassClimateSetTemperature": frozenset({"climate"}),
    "media_player__HassMediaPause": frozenset({"media_player"}),
    "media_player__HassMediaUnpause": frozenset({"media_player"}),
}


def test_no_template_matches_the_intent_whose_templates_say_its_words() -> None:
    """HA's templates say "resume {name}" and "resume the music in {area}", not "the
    music on {name}": its words still say which intent (language/words.py), and the
    example is of that intent on another thing of the same domain."""

    def nearest(text: str) -> Any:
        return hint_messages(text, THINGS, AREAS, TOOLS, LIVE, data=EN, platforms=PLATFORMS)

    resume = nearest("Resume the music on the loft speaker")
    assert _call(resume.messages) == ("media_player__HassMediaUnpause", {"name": "Den Speaker"})
    assert resume.domains == {"media_player"}
    pause = nearest("pause the music on the loft speaker")
    assert _call(pause.messages) == ("media_player__HassMediaPause", {"name": "Den Speaker"})
    # An area, no thing: the example names another area's, and the intent's domain is
    # what the request is about (its on/off calls may not name a temperature sensor).
    warm = nearest("Make it 23 degrees in the loft")
    tool, arguments = _call(warm.messages)
    assert tool == "climate__HassClimateSetTemperature"
    assert arguments["area"] == "Den" and "name" not in arguments
    assert warm.domains == {"climate"}
    # A thing it names that no intent offered here acts on, a place the house does not
    # have, or words two intents say as much: no example.
    assert not nearest("send robbie back to its dock")
    assert not nearest("make it 23 degrees in the basement")
    assert not nearest("the song on the den speaker")  # pause or resume?
    # Words most intents say ("is", "at", "in") say no intent: an automation's account
    # of what happened gets no command's example.
    assert not nearest("Motion detected in the den at 23:40 while everyone is in bed.")


def test_free_text_it_says_is_said_in_the_example() -> None:
    """HA's data has no example to-do item in any language: the request's own goes in
    the example, on another list (without it the intent had no example at all)."""
    lists = [Thing("todo.shopping", "Shopping List"), Thing("todo.chores", "Chores")]
    tools = [function_tool("todo__HassListAddItem", "item", "name")]
    hint = hint_messages("put batteries on the shopping list", lists, [], tools, {}, data=EN)
    assert _call(hint.messages) == (
        "todo__HassListAddItem",
        {"item": "batteries", "name": "Chores"},
    )
    assert hint.domains == {"todo"}
    german = [Thing("todo.einkauf", "Einkaufsliste"), Thing("todo.haus", "Hausarbeit")]
    hint = hint_messages("Setz Milch auf die Einkaufsliste", german, [], tools, {},
                         data=load_language_data("de"))  # fmt: skip
    assert _call(hint.messages) == (
        "todo__HassListAddItem",
        {"item": "Milch", "name": "Hausarbeit"},
    )


@pytest.mark.parametrize(
    ("language", "text", "name"),
    [("en", "set a timer for 8 minutes called pasta", "pasta"),
     ("de", "stelle einen Timer für 8 Minuten namens Nudeln", "Nudeln")],
)  # fmt: skip
def test_a_timers_name_is_its_own_not_a_thing_of_the_house(
    language: str, text: str, name: str
) -> None:
    """A template's free text (a timer's name) names no thing: the request gets its
    intent's example, with the name said, and the turn calls that intent with it."""
    tools = [function_tool("intent__HassStartTimer", "minutes", "name"), *TOOLS]
    data = load_language_data(language)
    hint = hint_messages(text, THINGS, AREAS, tools, LIVE, data=data)
    assert hint.intent == "HassStartTimer" and hint.slots == {"name": name}
    tool, arguments = _call(hint.messages)
    assert tool == "intent__HassStartTimer" and arguments["name"] == name


def test_an_intents_words_are_what_its_templates_can_say() -> None:
    climate = set().union(*(w for _, w in block_words(EN, "HassClimateSetTemperature")))
    assert {"degree", "degrees", "temperature", "make"} <= climate  # "degree[s]" said whole
    assert not climate & {"kitchen", "21"}  # names and numbers are lists' values
    assert words("Küche 21 キッチン") == {"küche", "キッ", "ッチ", "チン"}


@pytest.mark.parametrize(
    ("language", "intent", "word"),
    [
        # Verb endings in one word: "sub(a|e|ir|í)", "añad(a|e|ir|í)", "reanud(a|e|ar)".
        ("es", "HassSetVolumeRelative", "sube"),
        ("es", "HassListAddItem", "añade"),
        ("es", "HassMediaUnpause", "reanuda"),
    ],
)
def test_a_word_spelled_inside_a_template_is_said_whole(
    language: str, intent: str, word: str
) -> None:
    """HA's Spanish templates spell a verb's forms inside one word; each
    form is a word of the intent, not only the form that one walk of the template says."""
    said = set().union(*(w for _, w in block_words(load_language_data(language), intent)))
    assert word in said


def test_a_questions_example_answers_with_what_the_house_shows() -> None:
    """HA answers "X is playing"; the example's reply also says what the live context
    shows of it (a small model copies the reply: without, it never said the title)."""
    hint = _hint("what is playing on the loft speaker?", question=True)
    assert _call(hint) == ("homeassistant__GetLiveContext", {"name": "Den Speaker"})
    reply = hint[3]["content"]
    assert reply.startswith("Den speaker is playing")
    assert "media_title: Clair de Lune" in reply and "media_artist: Debussy" in reply
    # A unit is part of the state HA says, not said again.
    temperature = _hint("what is the den temperature?", question=True)
    assert temperature[3]["content"] in {"Loft temperature is 19.5 °C", "House power is 612 W"}


@pytest.mark.parametrize(
    ("language", "text"),
    [("en", "What is the temperature in the den?"), ("de", "Wie warm ist es im Den?")],
)
def test_a_question_of_one_kind_of_thing_shows_that_kind(language: str, text: str) -> None:
    """A question whose template names no domain is shown the kind its intent is about
    (HassClimateGetTemperature: climate, from the intents data), not the house's first
    domain: a door sensor's "No, off" was copied as the kitchen's temperature."""
    door = Thing("binary_sensor.back_door", "Back Door", area="Den")
    things = [door, *THINGS]
    live = {**LIVE, door.entity_id: _live("Back Door", "binary_sensor", "off")}
    data = load_language_data(language)
    hint = hint_messages(text, things, AREAS, TOOLS, live, question=True, data=data)
    assert hint.messages, text
    _tool, arguments = _call(hint.messages)
    assert arguments["name"] in {"Hall Thermostat", "Loft Thermostat"}
    # A question HA's templates name many kinds for keeps to the house's order.
    lights = hint_messages("is the attic light on?", things, AREAS, TOOLS, live, question=True,
                           data=EN)  # fmt: skip
    assert _call(lights.messages)[1]["name"] == "Porch Light"


@pytest.mark.parametrize(
    ("language", "text", "slots"),
    [
        ("en", "Which lights are on in the den?", {"area": "Den", "domain": "light"}),
        ("en", "Is the Shed Lock locked?", {"name": "Shed Lock"}),
        ("de", "Welche Lichter sind im Den an?", {"area": "Den", "domain": "light"}),
        ("en", "Is the jacuzzi on?", {}),  # a name the house does not have: nothing read
    ],
)
def test_a_question_says_what_its_template_read(
    language: str, text: str, slots: dict[str, str]
) -> None:
    """What HA's template read of a question (its area, its name, the kind it asks
    about) is the hint's ``slots``, in any language: the live-context call then reads
    only that (policy.live_values). It stays no action (``intent`` None)."""
    hint = hint_messages(
        text, THINGS, AREAS, TOOLS, LIVE, question=True, data=load_language_data(language)
    )
    assert hint.intent is None
    assert hint.slots == slots


@pytest.mark.parametrize(
    ("language", "text"), [("en", "what is the weather"), ("de", "Wie ist das Wetter?")]
)
def test_a_question_that_names_nothing_is_about_the_kind_its_intent_reads(
    language: str, text: str
) -> None:
    """HA's weather question names no thing: it is about the house's weather (so the
    turn reads the house first, where the model made the weather up) and its live
    context reads weather only, not the thermostat of its example."""
    things = [*THINGS, Thing("weather.home", "Home Forecast")]
    data = load_language_data(language)
    hint = hint_messages(text, things, AREAS, TOOLS, LIVE, question=True, data=data)
    assert hint.domains == {"weather"}
    assert hint.slots == {"domain": "weather"}
    # A house without weather: nothing implied, as before.
    plain = hint_messages(text, THINGS, AREAS, TOOLS, LIVE, question=True, data=data)
    assert plain.domains is None and plain.slots == {}


@pytest.mark.parametrize(
    ("language", "text", "about"),
    [
        ("en", "What's the weather like today?", {"weather"}),
        ("de", "Wie wird das Wetter heute?", {"weather"}),
        ("en", "tell me a joke?", None),  # says too little of any question intent
        ("en", "what is the capital of France?", None),
    ],
)
def test_a_question_no_template_reads_is_about_what_its_words_ask(
    language: str, text: str, about: set[str] | None
) -> None:
    """No template reads "what's the weather like today" (HA's says "what's the
    weather like"): the question intent whose templates say most of its words decides
    what it is about, so the turn reads the house first (the model made the weather
    up), and reads the weather. No example: its thing's name would be copied."""
    things = [*THINGS, Thing("weather.home", "Home Forecast")]
    data = load_language_data(language)
    hint = hint_messages(text, things, AREAS, TOOLS, LIVE, question=True, data=data)
    assert hint.domains == about
    assert not hint.messages
    assert hint.slots == ({"domain": "weather"} if about else {})  # its call reads weather


def test_no_hint_when_nothing_is_near() -> None:
    assert _hint("tell me a joke") == []
    assert _hint("start robbie") == []  # no vacuum tool offered
    assert not hint_messages("turn on the kettle", THINGS, AREAS, [], LIVE, data=EN)


def test_the_hint_goes_between_this_turns_context_and_request() -> None:
    """The context first: a satellite's area line is then cached with the prefix."""
    prefix = HousePrefix(system="house", tools=())
    hint = _hint("turn on the kettle")
    earlier = [
        conversation.SystemContent(content="HA's prompt"),
        conversation.UserContent(content="hello"),
        conversation.AssistantContent(agent_id="a", content="hi"),
        conversation.UserContent(content="turn on the kettle"),
    ]
    messages = build_messages(prefix, earlier, "it is noon", 5, hint)
    assert messages[0] == {"role": "system", "content": "house"}
    assert messages[1:3] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    assert messages[3] == {"role": "system", "content": "it is noon"}
    assert messages[4:6] == hint
    assert messages[6:] == [{"role": "user", "content": "turn on the kettle"}]


def test_a_command_may_call_only_the_tools_for_what_it_is_about() -> None:
    tools = [*TOOLS, function_tool("intent__HassStartTimer", "minutes")]
    domains = {
        "intent__HassSetPosition": frozenset({"cover", "valve"}),
        "climate__HassClimateSetTemperature": frozenset({"climate"}),
        "media_player__HassMediaPause": frozenset({"media_player"}),
        "media_player__HassMediaUnpause": frozenset({"media_player"}),
    }
    names = [t["function"]["name"] for t in tools]
    # A thermostat: not the cover or media tools, nor the timer (it names no thing); the
    # tools for any thing stay.
    about = hint_messages("set the hall thermostat to 22 degrees", THINGS, AREAS, tools, LIVE,
                          data=EN)  # fmt: skip
    assert about.domains == {"climate"}
    allowed = allowed_for(tools, domains, about.domains)
    kept = [n for n in names if n not in domains and not n.endswith("Timer")]
    assert allowed == [n for n in names if n in kept or n.startswith("climate")]
    assert "intent__HassStartTimer" not in allowed
    # A timer is about no entity: only the tools that name none.
    timer = hint_messages("set a timer for 5 minutes", THINGS, AREAS, tools, LIVE, data=EN)
    assert timer.domains == frozenset()
    assert allowed_for(tools, domains, timer.domains) == ["intent__HassStartTimer"]
    # Nothing known, or nothing left out: no restriction.
    assert allowed_for(tools, domains, None) is None
    # No tool's domains known: only those that name no thing of the house are left out.
    assert allowed_for(tools, {}, frozenset({"light"})) == [
        n for n in names if n != "intent__HassStartTimer"
    ]
    assert allowed_for(TOOLS, {}, frozenset({"light"})) is None


def test_an_on_off_call_by_area_alone_keeps_to_the_domains_asked_about() -> None:
    lights = frozenset({"light"})
    office = {"area": "Office"}
    assert scoped_arguments("HassTurnOff", office, lights) == {**office, "domain": ["light"]}
    assert scoped_arguments("intent__HassTurnOn", {"floor": "Up"}, lights)["domain"] == ["light"]
    # A thing or a domain named in the call, nothing asked about, or another intent: as is.
    for tool, arguments, about in (
        ("HassTurnOff", {**office, "name": "Desk Lamp"}, lights),
        ("HassTurnOff", {**office, "domain": ["fan"]}, lights),
        ("HassTurnOff", office, None),
        ("HassTurnOff", office, frozenset()),
        ("HassClimateSetTemperature", {**office, "temperature": 20}, lights),
        ("HassTurnOff", {"name": "Desk Lamp"}, lights),
    ):
        assert scoped_arguments(tool, arguments, about) == arguments


async def test_a_turn_sends_the_hint_where_examples_are_pinned(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """With examples on, a real turn shows its nearest example, may call only the tool
    of the intent HA's template reads in it (the tools that act on lights where none
    does: tests/hearth/test_policy.py), names what the template read, and acts."""
    assert await async_setup_component(hass, "conversation", {})
    assert await async_setup_component(hass, "climate", {})  # its intents, bound to climate
    await async_language_data(hass, "en")  # entity.py does not load it yet
    hass.states.async_set("light.porch", "off", {"friendly_name": "Porch Light"})
    hass.states.async_set("climate.hall", "heat", {"friendly_name": "Hall", "temperature": 20})
    for entity_id in ("light.porch", "climate.hall"):
        async_expose_entity(hass, "conversation", entity_id, True)
    entry = make_entry(engine.url, **{CONF_EXAMPLES: True})
    await async_setup_entry(hass, entry)
    with ChatSpy() as spy:
        await converse(hass, "turn on the kitchen light")
    assert hass.states.get(KITCHEN_LIGHT).state == "on"
    turn = hearth_traces()[-1]
    assert turn["hint"] == "turn on Porch Light"
    first = spy.bodies[0]
    shown = [tool["function"]["name"] for tool in first["tools"]]
    assert "HassClimateSetTemperature" in shown  # the prompt shows every tool
    choice = first["tool_choice"]
    assert choice["type"] == "allowed_tools" and choice["allowed_tools"]["mode"] == "required"
    allowed = [tool["function"]["name"] for tool in choice["allowed_tools"]["tools"]]
    assert allowed == turn["allowed_tools"]
    assert allowed == ["HassTurnOn"]
    hints = [m for m in first["messages"] if m.get("content") == "turn on Porch Light"]
    assert len(hints) == 1 and first["messages"][-1]["content"] == "turn on the kitchen light"
    assert all("tool_choice" not in body for body in spy.bodies[1:])
    # It says the kitchen light by its name: its calls may name only that (the hint's
    # Porch Light is not to be copied); areas stay free.
    values = first["hearth"]["argument_values"]
    assert values["HassTurnOn.name"] == values["HassTurnOff.name"] == ["Kitchen Light"]
    assert values["HassTurnOn.area"] == values["HassTurnOn.floor"] == []  # it read none
    assert first["hearth"]["required_arguments"] == ["HassTurnOn.name"]  # the real engine's
    assert values["name"] == ["Kitchen Light"]
    assert values["area"]


async def test_a_request_read_as_said_before_it_is_read_spelled(
    hass: HomeAssistant, house: None, engine: EngineProcess
) -> None:
    """ "The kitchen lights" says the thing "Kitchen Light" inflected, but HA's template
    reads it as said: the kitchen's lights (area and domain), as HA's matcher would. The
    request is read spelled with the house's names only where it reads as no template
    as said."""
    assert await async_setup_component(hass, "conversation", {})
    await async_language_data(hass, "en")
    hass.states.async_set("light.porch", "off", {"friendly_name": "Porch Light"})
    async_expose_entity(hass, "conversation", "light.porch", True)
    await async_setup_entry(hass, make_entry(engine.url, **{CONF_EXAMPLES: True}))
    with ChatSpy() as spy:
        await converse(hass, "turn on the kitchen lights")
    values = spy.bodies[0]["hearth"]["argument_values"]
    assert values["HassTurnOn.area"] == ["Kitchen"] and values["HassTurnOn.name"] == []
    # No area or thing is "porch": as said, no template reads it whole; spelled with
    # the house's name ("porch light"), HA's template reads the Porch Light.
    with ChatSpy() as spy:
        await converse(hass, "turn on the porch lights")
    values = spy.bodies[0]["hearth"]["argument_values"]
    assert values["HassTurnOn.name"] == ["Porch Light"] and values["HassTurnOn.area"] == []


TIMER = {
    "type": "function",
    "function": {
        "name": "HassStartTimer",
        "parameters": {
            "type": "object",
            "properties": {k: {"type": "integer"} for k in ("hours", "minutes", "seconds")},
        },
    },
}


@pytest.mark.parametrize(
    ("language", "text", "unit"),
    [
        ("en", "Start a 10 minute timer", "minutes"),
        ("en", "set a timer for 2 hours", "hours"),
        ("en", "set a 30 second timer", "seconds"),
        ("de", "Stelle einen Timer für 10 Minuten", "minutes"),
        ("de", "Timer für 30 Sekunden", "seconds"),
    ],
)
def test_the_example_says_what_the_request_says(language: str, text: str, unit: str) -> None:
    """Of HA's templates for the intent, the example's says the request's slots: a
    timer in minutes gets an example in minutes. Before, every timer's example was
    "set timer for 10 hour", and the model set "a 10 minute timer" for 10 hours."""
    data = EN if language == "en" else load_language_data(language)
    hint = hint_messages(text, THINGS, AREAS, [*TOOLS, TIMER], LIVE, data=data)
    assert hint.intent == "HassStartTimer"
    call = hint.messages[1]["tool_calls"][0]["function"]
    assert list(json.loads(call["arguments"])) == [unit]


def test_a_request_a_template_reads_without_an_example_keeps_what_it_read() -> None:
    """The house's speakers are in no area, so "resume the music in the den" has no
    other area's player to show an example on; HA's template still reads it whole, and
    the turn's call is that intent on that area (policy.read_values), as HA's matcher
    would run it (the default model switched the bedroom speaker on)."""
    read = hint_messages("resume the music in the den", THINGS, AREAS, TOOLS, LIVE, data=EN)
    assert read.messages == []
    assert (read.intent, dict(read.slots)) == ("HassMediaUnpause", {"area": "Den"})


def test_a_device_class_only_from_the_house() -> None:
    """HA's English templates read "open the garage door" as area Garage with class
    door where the house has an area Garage; the house's garage door is a cover of
    class garage, and HA refuses a call for class door on it. The class the turn pins
    is one the house has, else none (the model's, from the house's values)."""
    door = [Thing("cover.garage_door", "Up And Over", area="Garage")]
    read = hint_messages("open the garage door", door, ["Garage"], TOOLS, LIVE, data=EN)
    assert read.slots.get("device_class") == "door"  # what the template reads
    house = HouseNames.of([(["Up And Over"], Named("cover.garage_door", "garage"))], ["Garage"])
    assert "device_class" not in house.house_slots(read.slots)
    assert house.house_slots(read.slots)["area"] == "Garage"
    doors = HouseNames.of([(["Side"], Named("cover.side", "door"))], ["Garage"])
    assert doors.house_slots(read.slots) == read.slots  # the house has one: kept
    lights = HouseNames.of([(["Door Lamp"], Named("light.door_lamp", "door"))], ["Garage"])
    assert "device_class" not in lights.house_slots(read.slots)  # of another domain


def test_an_inflected_request_reads_as_its_template_once_spelled() -> None:
    """Polish inflects names ("lampę stojącą" for "Lampa stojąca"); HA's templates read
    a name only as written. Spelled with the house's names (names.HouseNames.spelled),
    the request reads as its intent on what it names, as the house writes it."""
    pl = load_language_data("pl")
    things = [Thing("light.lampa_stojaca", "Lampa stojąca"), Thing("light.kinkiet", "Kinkiet")]
    house = HouseNames.of([([t.name], Named(t.entity_id)) for t in things], ["Salon"])
    text = "Włącz lampę stojącą"
    assert hint_messages(text, things, ["Salon"], TOOLS, {}, data=pl).intent is None
    read = hint_messages(house.spelled(text), things, ["Salon"], TOOLS, {}, data=pl)
    assert (read.intent, dict(read.slots)) == ("HassTurnOn", {"name": "Lampa stojąca"})
    assert _call(read.messages) == ("intent__HassTurnOn", {"name": "Kinkiet"})
