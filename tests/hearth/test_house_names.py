"""Shared names resolve to one thing (house/names.py, house/resolve.py): pure, no Home
Assistant."""

from __future__ import annotations

import pytest

from custom_components.hearth.house.names import HouseNames, Named, unasked, worded
from custom_components.hearth.house.resolve import resolve_call
from custom_components.hearth.language.words import words

GARAGE_COVER = Named("cover.garage_door_opener", "garage", main=True)
GARAGE_LIGHT = Named("light.garage_door_opener")
FRONT_LOCK = Named("lock.front_door", main=True)
FRONT_SENSOR = Named("binary_sensor.front_door", "door")
BLIND = Named("cover.office_blind", "blind")
SHADE = Named("cover.office_shade", "shade")

HOUSE = HouseNames.of(
    [
        (["Garage Door Opener"], GARAGE_COVER),
        (["Garage Door Opener", "garage light"], GARAGE_LIGHT),
        (["Front Door"], FRONT_LOCK),
        (["front door "], FRONT_SENSOR),  # compared as HA does: stripped, casefolded
        (["Office Window"], BLIND),
        (["Office Window"], SHADE),
        (["Kitchen"], Named("light.kitchen")),
        (["Küche Licht", "キッチン"], Named("light.kueche")),
        (["Roleta"], Named("cover.roleta", "blind")),
        (["Штора"], Named("cover.shtora", "curtain")),
    ],
    areas=["Kitchen", "Garage", "Office"],
    floors=["Upstairs"],
)
ON_OFF = ("name", "area", "floor", "domain", "device_class")


def turn_on(arguments: dict[str, object], **kwargs: object) -> dict[str, object]:
    return resolve_call("HassTurnOn", arguments, HOUSE, accepts=ON_OFF, **kwargs)  # type: ignore[arg-type]


def test_shared_names_are_found() -> None:
    assert set(HOUSE.shared()) == {"garage door opener", "front door", "office window"}


@pytest.mark.parametrize(
    ("arguments", "kwargs", "resolved"),
    [
        # The request says which (a light): the call gets the light's domain.
        ({"name": "Garage Door Opener"}, {"about": frozenset({"light"})}, ["light"]),
        # Nothing says: the thing the device is (its own entity), not its light.
        ({"name": "garage door opener"}, {}, ["cover"]),
        # The request's command words are a cover's ("close the garage": the off
        # intent's cover templates say "close"), though it is about the light too.
        (
            {"name": "Garage Door Opener"},
            {"commanded": frozenset({"cover", "valve"}), "about": frozenset({"light"})},
            ["cover"],
        ),
        # The tool acts only on covers and valves.
        ({"name": "Garage Door Opener"}, {"platforms": frozenset({"cover", "valve"})}, ["cover"]),
        # The call's own domain is kept where it tells them apart.
        ({"name": "Garage Door Opener", "domain": ["light"]}, {}, ["light"]),
        ({"name": "Front Door"}, {}, ["lock"]),
        # Both are named and about; the request says which by its domain's id.
        (
            {"name": "Garage Door Opener"},
            {
                "about": frozenset({"cover", "light"}),
                "request": "turn on the garage door opener light",
            },
            ["light"],
        ),
        ({"name": "Garage Door Opener"}, {"request": "open the garage door opener"}, ["cover"]),
        ({"name": "Front Door"}, {"about": frozenset({"binary_sensor"})}, ["binary_sensor"]),
    ],
)
def test_a_shared_name_gets_the_domain_that_resolves_it(
    arguments: dict[str, object], kwargs: dict[str, object], resolved: list[str]
) -> None:
    assert turn_on(arguments, **kwargs)["domain"] == resolved


def test_same_domain_is_told_apart_by_device_class() -> None:
    called = turn_on({"name": "Office Window", "device_class": ["shade"]})
    assert called == {"name": "Office Window", "device_class": ["shade"], "domain": ["cover"]}


def test_equals_are_not_guessed() -> None:
    """Two blinds of one name and nothing that says which: left as called."""
    assert turn_on({"name": "Office Window"}) == {"name": "Office Window", "domain": ["cover"]}
    assert "device_class" not in turn_on({"name": "Office Window"})


def test_unshared_names_and_free_names_are_untouched() -> None:
    assert turn_on({"name": "Kitchen"}) == {"name": "Kitchen"}
    assert turn_on({"name": "garage light"}) == {"name": "garage light"}
    timer = {"name": "Garage Door Opener", "minutes": 5}
    assert resolve_call("HassStartTimer", timer, HOUSE, accepts=("name", "minutes")) == timer
    live = {"name": "Garage Door Opener"}
    assert resolve_call("GetLiveContext", live, HOUSE, accepts=("name",)) == live


def test_a_domain_is_added_only_where_the_tool_takes_one() -> None:
    called = resolve_call("HassListAddItem", {"name": "Front Door"}, HOUSE, accepts=("name",))
    assert called == {"name": "Front Door"}


def test_places_and_things_move_to_the_argument_ha_matches() -> None:
    # An area given as a thing's name, and a floor.
    assert turn_on({"name": "Garage", "domain": ["light"]}) == {
        "area": "Garage",
        "domain": ["light"],
    }
    assert turn_on({"name": "upstairs"}) == {"floor": "upstairs"}
    # A thing's name given as an area (also an area's name): the thing.
    assert turn_on({"area": "Kitchen"}) == {"name": "Kitchen"}
    assert turn_on({"area": "Garage Door Opener"}) == {
        "name": "Garage Door Opener",
        "domain": ["cover"],
    }
    # An area with a domain is what was meant: the lights in the kitchen.
    kept = {"area": "Kitchen", "domain": ["light"]}
    assert turn_on(kept) == kept


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("turn on the kitchen", {"kitchen"}),
        ("activate the scene", set()),
        ("Schalte Küche Licht ein", {"küche licht"}),
        ("キッチンの電気をつけて", {"キッチン"}),
        ("open the garage door opener", {"garage door opener", "garage"}),
        ("tell me a joke", set()),
    ],
)
def test_what_a_request_names(text: str, said: set[str]) -> None:
    assert HOUSE.mentioned(text) == said


# Names people inflect as they say them (Polish and Russian cases, English plurals).
SPOKEN = HouseNames.of(
    [
        (["Brama garażowa"], Named("cover.brama", "garage")),
        (["Lampa stojąca"], Named("light.lampa_stojaca")),
        (["Lampa"], Named("light.lampa")),
        (["Lampka nocna"], Named("light.lampka_nocna")),
        (["Kinkiet"], Named("light.kinkiet")),
        (["Штора"], Named("cover.shtora", "curtain")),
        (["Kitchen Light"], Named("light.kitchen_light")),
        (["Kitchen Lights"], Named("light.kitchen_lights")),
        (["Office Window"], Named("cover.office_window", "window")),
        (["TV"], Named("media_player.tv")),
    ],
    areas=["Kuchnia", "Ogród", "Office", "Bedroom"],
    floors=["Piętro"],
)


@pytest.mark.parametrize(
    ("text", "said", "things"),
    [
        ("Otwórz bramę garażową", {"brama garażowa"}, {"brama garażowa"}),
        # The name of more words wins ("Lampa stojąca", "Lampka nocna"; not "Lampa").
        ("Zapal lampę stojącą", {"lampa stojąca"}, None),
        ("Zapal lampę", {"lampa"}, None),
        ("Zgaś lampkę nocną i zapal kinkiet", {"lampka nocna", "kinkiet"}, None),
        ("закрой штору", {"штора"}, None),
        # Areas and floors too; accents do not count ("ogród", "ogrodzie").
        ("Zapal światło w kuchni", {"kuchnia"}, set()),
        ("Włącz światło w ogrodzie", {"ogród"}, set()),
        ("Wyłącz światła na piętrze", {"piętro"}, set()),
        # A name said as written is not read as another one inflected.
        ("turn on the kitchen light", {"kitchen light"}, {"kitchen light"}),
        ("turn on the kitchen lights", {"kitchen lights"}, {"kitchen lights"}),
        ("close the office windows", {"office", "office window"}, {"office window"}),
        # Not inflections: another word around the same letters, a short word.
        ("turn on the light in this room", set(), set()),
        ("Zamknij rolki", set(), set()),
        ("turn on the TVs", set(), set()),
    ],
)
def test_a_request_names_things_in_the_forms_people_say(
    text: str, said: set[str], things: set[str] | None
) -> None:
    assert SPOKEN.mentioned(text) == said
    assert SPOKEN.said_things(text) == (said if things is None else things)


@pytest.mark.parametrize(
    ("text", "spelled"),
    [
        ("Zapal lampę stojącą", "zapal lampa stojąca"),
        ("Zgaś lampkę nocną i zapal kinkiet", "zgaś lampka nocna i zapal kinkiet"),
        ("Zapal światło w kuchni!", "zapal światło w kuchnia!"),
        ("close the office windows", "close the office window"),
        ("turn on the kitchen light", "turn on the kitchen light"),  # as written: kept
    ],
)
def test_a_request_is_spelled_with_the_names_as_the_house_writes_them(
    text: str, spelled: str
) -> None:
    """What HA's sentence templates read, which take a name only as written."""
    assert SPOKEN.spelled(text) == spelled


def test_the_domains_of_the_things_a_request_names() -> None:
    assert HOUSE.named_domains("open the garage door opener") == {"cover", "light"}
    assert HOUSE.named_domains("turn on the kitchen") == {"light"}  # a thing and an area
    assert HOUSE.named_domains("turn on the Küche Licht") == {"light"}
    assert HOUSE.named_domains("tell me a joke") == frozenset()


@pytest.mark.parametrize(
    ("name", "text", "not_asked"),
    [
        ("Garage Door Opener", "turn off the heating", True),
        ("Garage Door Opener", "open the garage", False),
        ("garage light", "switch on the garage light", False),
        # Another name or alias of the same thing counts ("garage light" is the light's).
        ("Garage Door Opener", "light in the garage, please", False),
        ("Küche Licht", "Mach das Küchenlicht an", False),  # "Küche" inside "Küchenlicht"
        ("Küche Licht", "キッチンの電気をつけて", False),  # its alias, without spaces
        ("Office Window", "Schließ die Haustür ab", True),
        ("Kitchen", "turn on the TV", True),
        ("Jacuzzi", "turn off the heating", False),  # not the house's: HA refuses it
        # Inflected: all but the last two letters alike (four at least).
        ("Roleta", "zamknij roletę", False),
        ("Штора", "закрой штору", False),
        ("Roleta", "zamknij rolki", True),  # "rol": three letters alike
        ("Kitchen", "open the kite", True),
    ],
)
def test_a_call_may_name_only_what_the_request_says(name: str, text: str, not_asked: bool) -> None:
    assert unasked(name, HOUSE, words(text)) is not_asked


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("turn off the heating", set()),
        # Every name of a thing one of whose names shares a word ("garage light").
        ("light in the garage, please", {"garage door opener", "garage light"}),
        ("Mach das Küchenlicht an", {"küche licht", "キッチン"}),
        ("キッチンの電気をつけて", {"küche licht", "キッチン"}),
        ("close the office window", {"office window"}),
    ],
)
def test_the_names_a_call_may_use_are_those_unasked_accepts(text: str, kept: set[str]) -> None:
    assert worded(HOUSE, words(text)) == kept
    for name in HOUSE.things:
        assert (name in kept) is not unasked(name, HOUSE, words(text))


def test_a_name_several_things_share_is_matched_in_the_place_the_request_says() -> None:
    """Seven rooms each have a "Ceiling Fan": the call of that name gets the area the
    request says (HA refused the name as shared); no place, or two, add none; a place
    said only inside the called name ("Office Window") is not one."""
    fans = HouseNames.of(
        [(["Ceiling Fan"], Named("fan.bedroom")), (["Ceiling Fan"], Named("fan.office"))],
        areas=["Primary Bedroom", "Office"],
        floors=["Upstairs"],
    )
    fan = {"name": "Ceiling Fan", "percentage": 50}

    def call(request: str, arguments: dict[str, object] = fan) -> dict[str, object]:
        accepts = ("name", "area", "floor", "domain", "percentage")
        return resolve_call("HassFanSetSpeed", arguments, fans, accepts=accepts, request=request)

    said = call("Set the primary bedroom ceiling fan to 50 percent")
    assert said["area"] == "primary bedroom" and said["name"] == "Ceiling Fan"
    assert call("set the ceiling fan upstairs to 50")["floor"] == "upstairs"
    assert "area" not in call("set the ceiling fan to 50 percent")
    assert "area" not in call("the ceiling fan in the office and the primary bedroom")
    assert call("the office ceiling fan", {**fan, "area": "Office"})["area"] == "Office"
    window = turn_on({"name": "Office Window"}, request="open the office window")
    assert "area" not in window


def test_a_place_is_the_names_own_by_its_words_not_its_letters() -> None:
    """ "Den" is no word of "Garden Light": said beside it, the den is the place."""
    lights = HouseNames.of(
        [(["Garden Light"], Named("light.a")), (["Garden Light"], Named("light.b"))],
        areas=["Den", "Garden"],
    )
    called = resolve_call(
        "HassTurnOn",
        {"name": "Garden Light"},
        lights,
        accepts=ON_OFF,
        request="turn on the garden light in the den",
    )
    assert called["area"] == "den"
