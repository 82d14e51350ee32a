"""The only thing of its kind is named by its kind (house/kinds.py): pure, over HA's
intents data; the kinds' names as HA's translations give them. Then a real turn: a
command that names a thing by its kind is about that thing."""

from __future__ import annotations

from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.hearth.house.kinds import STATE_KIND, async_kind_words, named_by_kind
from custom_components.hearth.house.names import HouseNames, Named
from custom_components.hearth.language.intents_data import load_language_data
from custom_components.hearth.language.words import words

from .common import ChatSpy, converse, hearth_traces

EN = load_language_data("en")
# What async_kind_words reads of HA's English entity_component names.
KINDS = {
    "vacuum": {"_": frozenset(words("Vacuum"))},
    "cover": {"_": frozenset(words("Cover")), "garage": frozenset(words("Garage"))},
    "valve": {"_": frozenset(words("Valve")), "water": frozenset(words("Water"))},
    "media_player": {"_": frozenset(words("Media player"))},
    "climate": {"_": frozenset(words("Thermostat")), STATE_KIND: frozenset({"heat", "cool"})},
    "lock": {"_": frozenset(words("Lock")), STATE_KIND: frozenset({"locked", "open"})},
    "weather": {"_": frozenset(words("Weather")), STATE_KIND: frozenset({"lightning", "sunny"})},
    "light": {"_": frozenset(words("Light"))},
}


def house(*things: tuple[str, Named]) -> HouseNames:
    return HouseNames.of([([name], named) for name, named in things], ["Hall"])


ROBOT = ("Roborock", Named("vacuum.roborock"))
GARAGE = ("Up And Over", Named("cover.up_and_over", "garage"))
BLIND = ("Office Blind", Named("cover.office_blind", "blind"))
MAIN = ("Main Tap", Named("valve.main_tap", "water"))
SPEAKERS = ("Outdoor", Named("media_player.outdoor"))


def test_the_only_one_of_a_kind_is_named_by_the_kind() -> None:
    one = house(ROBOT, GARAGE, BLIND, MAIN, SPEAKERS)
    assert "vacuum.roborock" in named_by_kind(one, "start the vacuum", KINDS, EN)
    # A device class names the one thing of that class, among other covers.
    assert "cover.up_and_over" in named_by_kind(one, "open the garage", KINDS, EN)
    assert "valve.main_tap" in named_by_kind(one, "turn off the water", KINDS, EN)
    # A request a player's intent reads ("pause the music") names the one player.
    assert "media_player.outdoor" in named_by_kind(one, "pause the music", KINDS, EN)
    # The kind must be said: "start cleaning" names no vacuum here, no cover either.
    assert named_by_kind(one, "turn on the lamp", KINDS, EN) == frozenset()


def test_a_state_of_its_kind_names_the_only_one() -> None:
    """HA's words for the states of a domain name its one thing ("the heating": the
    thermostat, whose state is "Heat"); a state word another of the house's domains
    says, in a state or its name, names none."""
    hive = ("Hive", Named("climate.hive"))
    one = house(hive, GARAGE, ("Front Door", Named("lock.front_door")))
    assert named_by_kind(one, "turn the heating off", KINDS, EN) == {"climate.hive"}
    assert named_by_kind(one, "put the heating back on", KINDS, EN) == {"climate.hive"}
    assert named_by_kind(one, "turn off the lamp", KINDS, EN) == frozenset()
    # "Open" is a lock's state and a cover's: it names neither.
    assert named_by_kind(one, "open it", {**KINDS, "cover": {STATE_KIND: frozenset({"open"})}},
                         EN) == frozenset()  # fmt: skip
    # A weather's "Lightning" is said as the light's name: no light names the weather.
    sky = house(("Forecast", Named("weather.forecast")), ("Lamp", Named("light.lamp")))
    assert "weather.forecast" not in named_by_kind(sky, "turn on the light", KINDS, EN)
    # A kind the house lacks says nothing: a binary sensor's class "heat" is not here.
    sensors = {**KINDS, "binary_sensor": {"_": frozenset({"binary", "sensor"}),
                                          "heat": frozenset({"heat"})}}  # fmt: skip
    window = ("Window", Named("binary_sensor.window", "window"))
    assert named_by_kind(house(hive, window), "turn the heating off", sensors, EN) == {
        "climate.hive"
    }
    heat = ("Stove Heat", Named("binary_sensor.stove", "heat"))
    assert "climate.hive" not in named_by_kind(
        house(hive, heat), "turn the heating off", sensors, EN
    )
    assert named_by_kind(house(hive, ("Hive 2", Named("climate.two"))), "turn the heating off",
                         KINDS, EN) == frozenset()  # fmt: skip


async def test_the_kinds_words_are_home_assistants_translations(hass: HomeAssistant) -> None:
    """Real Home Assistant: its English names of the kinds and of their states."""
    kinds = await async_kind_words(hass, "en", {"climate", "vacuum", "cover"})
    assert kinds["climate"]["_"] == {"thermostat"}
    assert {"heat", "cool"} <= kinds["climate"][STATE_KIND]
    assert "cleaning" in kinds["vacuum"][STATE_KIND]
    assert "off" not in kinds["climate"][STATE_KIND]  # too short to name one kind
    assert "garage" in kinds["cover"]


def test_where_the_house_has_several_the_kind_names_none() -> None:
    two = house(
        ROBOT, ("Dusty", Named("vacuum.dusty")), SPEAKERS, ("Den", Named("media_player.den"))
    )
    assert named_by_kind(two, "start the vacuum", KINDS, EN) == frozenset()
    assert named_by_kind(two, "pause the music", KINDS, EN) == frozenset()
    # Two covers, one garage: "the blinds" is not "the garage".
    assert "cover.up_and_over" not in named_by_kind(house(GARAGE, BLIND), "close the blind",
                                                    KINDS, EN)  # fmt: skip


def test_without_the_language_data_only_the_kinds_names_decide() -> None:
    one = house(ROBOT, SPEAKERS)
    assert "vacuum.roborock" in named_by_kind(one, "start the vacuum", KINDS, None)
    assert named_by_kind(one, "pause the music", KINDS, None) == frozenset()


async def test_a_command_that_names_a_thing_by_its_kind_names_that_thing(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    """Real Home Assistant and engine: "start the vacuum" in a house whose one vacuum
    is called Roborock is a command about Roborock. The turn must act (not chat), and
    the names the grammar offers its calls are Roborock's, where the model could pick
    any thing of the house before."""
    assert await async_setup_component(hass, "vacuum", {})
    hass.states.async_set("vacuum.roborock", "docked", {"friendly_name": "Roborock"})
    async_expose_entity(hass, "conversation", "vacuum.roborock", True)
    with ChatSpy() as spy:
        await converse(hass, "start the vacuum")
    turn = hearth_traces()[-1]
    assert turn["command"] and "roborock" in turn["named"]
    values = spy.bodies[0]["hearth"]["argument_values"]
    assert values["name"] == ["Roborock"]
    # A question is read whole: the kind narrows nothing there.
    with ChatSpy() as spy:
        await converse(hass, "is the vacuum docked?")
    assert hearth_traces()[-1]["question"]
    assert "Kitchen Light" in spy.bodies[0]["hearth"]["argument_values"]["name"]
