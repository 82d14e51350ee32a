"""The action guard's decisions over Home Assistant's own intents data, in English and
German (turn/guard.py): a call that cannot act on what the request asks is refused,
a call that can is run. Pure: no Home Assistant instance, the package's real data."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from hassil import TextSlotList
from hassil.sample import sample_expression
from hypothesis import given, settings
from hypothesis import strategies as st

from custom_components.hearth.house.kinds import state_key
from custom_components.hearth.house.names import HouseNames, Named
from custom_components.hearth.language.intents_data import load_language_data
from custom_components.hearth.language.words import block_domains
from custom_components.hearth.turn.guard import Guard
from custom_components.hearth.turn.reading import OPPOSITE, direction
from custom_components.hearth.turn.refusal import NOT_FOR_REQUEST, Refusal

EN = load_language_data("en")
DE = load_language_data("de")
PL = load_language_data("pl")
DATA = {"en": EN, "de": DE, "pl": PL}

# One house per language: a lock, a garage door, a valve, a vacuum, a speaker, a light.
THINGS = {
    "en": {
        "lock.front_door": "Front Door",
        "cover.garage_door": "Garage Door",
        "valve.water_valve": "Water Valve",
        "vacuum.robot": "Robot",
        "media_player.speaker": "Speaker",
        "light.desk_lamp": "Desk Lamp",
    },
    "de": {
        "lock.front_door": "Haustür",
        "cover.garage_door": "Garagentor",
        "valve.water_valve": "Wasserventil",
        "vacuum.robot": "Saugroboter",
        "media_player.speaker": "Lautsprecher",
        "light.desk_lamp": "Schreibtischlampe",
    },
    # Polish: the vacuum is said by its kind ("odkurzacz"), a word no name of it has.
    # No Polish template is made for locks.
    "pl": {
        "vacuum.robot": "Roborock",
        "media_player.speaker": "Głośnik",
        "lock.front_door": "Drzwi wejściowe",
    },
}
PLATFORMS = {
    "HassVacuumStart": frozenset({"vacuum"}),
    "HassVacuumReturnToBase": frozenset({"vacuum"}),
    "HassMediaPause": frozenset({"media_player"}),
    "HassMediaUnpause": frozenset({"media_player"}),
    "HassSetPosition": frozenset({"cover", "valve"}),
    "HassLightSet": frozenset({"light"}),
    "HassSetVolume": frozenset({"media_player"}),
    "HassMediaNext": frozenset({"media_player"}),
}
# A house whose domains have HA's services: a vacuum has no turn_on / turn_off.
SWITCHABLE = {
    "turn_on": frozenset({"light", "media_player", "switch"}),
    "turn_off": frozenset({"light", "media_player", "switch"}),
}


def names(language: str) -> HouseNames:
    return HouseNames.of(
        [([name], Named(entity_id)) for entity_id, name in THINGS[language].items()],
        ["Kitchen", "Küche"],
    )


def guard(language: str, text: str, about: frozenset[str] | None = None) -> Guard:
    house = names(language)
    about = about if about is not None else house.named_domains(text) or None
    return Guard(text, DATA[language], house, about, PLATFORMS, SWITCHABLE)


def refused(language: str, text: str, tool: str, arguments: Mapping[str, Any]) -> bool:
    why = guard(language, text).refusal(tool, arguments)
    assert why is None or why.startswith(NOT_FOR_REQUEST)
    return why is not None


@pytest.mark.parametrize(
    ("language", "text", "tool", "arguments"),
    [
        # Timers for requests that say no timer and no duration.
        ("en", "skip this track", "HassCancelAllTimers", {}),
        ("en", "close the garage door", "HassStartTimer", {"minutes": 5}),
        ("en", "add milk to my shopping list", "HassCancelTimer", {"name": "milk"}),
        ("de", "überspringe dieses Lied", "HassCancelAllTimers", {}),
        ("de", "öffne das Wasserventil", "HassCancelTimer", {}),
        # A call that names nothing, while the request names an area (or a thing).
        ("en", "close the kitchen", "HassSetPosition", {"position": 0}),
        ("en", "open the garage door", "HassTurnOn", {}),
        ("de", "schließe die Küche", "HassSetPosition", {"position": 0}),
        # On/off on things of a kind the request is not about (a lock, then the lights).
        ("en", "lock the front door", "HassTurnOn", {"area": "Kitchen", "domain": ["light"]}),
        ("de", "verriegle die Haustür", "HassTurnOn", {"name": "Schreibtischlampe"}),
        # A call by an area the request does not say, where it names a thing.
        ("en", "open the garage door", "HassTurnOn", {"area": "Kitchen"}),
        ("de", "öffne das Garagentor", "HassTurnOn", {"area": "Küche", "domain": ["cover"]}),
        # A media intent for a request about a cover.
        ("en", "close the garage door", "HassMediaPause", {"name": "Speaker"}),
        ("de", "schließe das Garagentor", "HassMediaPause", {"name": "Lautsprecher"}),
        # On/off on a vacuum: HA has no such service; it has vacuum intents.
        ("en", "start the robot", "HassTurnOn", {"name": "Robot"}),
        ("de", "starte den Saugroboter", "HassTurnOn", {"name": "Saugroboter"}),
        # The opposite direction: locks, covers, valves, vacuums.
        ("en", "lock the front door", "HassTurnOff", {"name": "Front Door"}),
        ("en", "unlock the front door", "HassTurnOn", {"name": "Front Door"}),
        ("en", "open the garage door", "HassTurnOff", {"name": "Garage Door"}),
        ("en", "close the water valve", "HassTurnOn", {"name": "Water Valve"}),
        # ... also on a thing of another kind whose templates say no direction here:
        # "close" is said by the off intent only (for covers), never for lights.
        ("en", "close the kitchen", "HassTurnOn", {"name": "Desk Lamp"}),
        ("de", "schließe die Küche", "HassTurnOn", {"name": "Schreibtischlampe"}),
        # ... and by an area alone, on whatever is there.
        ("en", "close the kitchen", "HassTurnOn", {"area": "Kitchen"}),
        ("de", "schließe die Küche", "HassTurnOn", {"area": "Küche"}),
        ("en", "start the robot", "HassVacuumReturnToBase", {"name": "Robot"}),
        ("en", "send the robot back to its base", "HassVacuumStart", {"name": "Robot"}),
        ("de", "verriegle die Haustür", "HassTurnOff", {"name": "Haustür"}),
        ("de", "entriegle die Haustür", "HassTurnOn", {"name": "Haustür"}),
        ("de", "schließ die Haustür ab", "HassTurnOff", {"name": "Haustür"}),
        ("de", "öffne das Garagentor", "HassTurnOff", {"name": "Garagentor"}),
        ("de", "schließe das Wasserventil", "HassTurnOn", {"name": "Wasserventil"}),
        ("de", "starte den Saugroboter", "HassVacuumReturnToBase", {"name": "Saugroboter"}),
        ("de", "schick den Saugroboter zur Ladestation", "HassVacuumStart",
         {"name": "Saugroboter"}),
        # A pair of a thing's own, against the on / off the request reads as.
        ("en", "turn on the robot", "HassVacuumReturnToBase", {"name": "Robot"}),
        ("en", "turn off the robot", "HassVacuumStart", {"name": "Robot"}),
        ("en", "turn off the speaker", "HassMediaUnpause", {"name": "Speaker"}),
        ("de", "schalte den Saugroboter ein", "HassVacuumReturnToBase",
         {"name": "Saugroboter"}),
        ("pl", "włącz odkurzacz", "HassVacuumReturnToBase", {"name": "Roborock"}),
        ("pl", "wyłącz odkurzacz", "HassVacuumStart", {"name": "Roborock"}),
        ("en", "turn on the vacuum", "HassVacuumReturnToBase", {"name": "Robot"}),
        # A lock is closed as a cover is: HA's Spanish, German, Portuguese templates.
        ("en", "close the front door", "HassTurnOff", {"name": "Front Door"}),
        ("pl", "zamknij drzwi wejściowe na klucz", "HassTurnOff", {"name": "Drzwi wejściowe"}),
        ("pl", "otwórz zamek w drzwiach wejściowych", "HassTurnOn",
         {"name": "Drzwi wejściowe"}),
    ],
)  # fmt: skip
def test_a_call_that_cannot_act_on_the_request_is_refused(
    language: str, text: str, tool: str, arguments: dict[str, Any]
) -> None:
    assert refused(language, text, tool, arguments)


@pytest.mark.parametrize(
    ("language", "text", "tool", "arguments"),
    [
        ("en", "set a timer for 5 minutes", "HassStartTimer", {"minutes": 5}),
        ("en", "cancel all timers", "HassCancelAllTimers", {}),
        ("en", "cancel the pasta timer", "HassCancelTimer", {"name": "pasta"}),
        ("de", "stelle einen Timer auf 5 Minuten", "HassStartTimer", {"minutes": 5}),
        ("de", "brich alle Timer ab", "HassCancelAllTimers", {}),
        ("en", "pause the speaker", "HassMediaPause", {"name": "Speaker"}),
        ("en", "lock the front door", "HassTurnOn", {"name": "Front Door"}),
        ("en", "unlock the front door", "HassTurnOff", {"name": "Front Door"}),
        ("en", "open the garage door", "HassTurnOn", {"name": "Garage Door"}),
        ("en", "close the water valve", "HassTurnOff", {"name": "Water Valve"}),
        ("en", "start the robot", "HassVacuumStart", {"name": "Robot"}),
        ("en", "send the robot back to its base", "HassVacuumReturnToBase", {"name": "Robot"}),
        ("en", "turn on the desk lamp", "HassTurnOn", {"name": "Desk Lamp"}),
        ("de", "verriegle die Haustür", "HassTurnOn", {"name": "Haustür"}),
        ("de", "schließ die Haustür auf", "HassTurnOff", {"name": "Haustür"}),
        ("de", "öffne das Garagentor", "HassTurnOn", {"name": "Garagentor"}),
        ("de", "schließe das Wasserventil", "HassTurnOff", {"name": "Wasserventil"}),
        ("de", "starte den Saugroboter", "HassVacuumStart", {"name": "Saugroboter"}),
        ("de", "schalte die Schreibtischlampe aus", "HassTurnOff", {"name": "Schreibtischlampe"}),
        # A pair of a thing's own, with the on / off the request reads as.
        ("en", "turn off the robot", "HassVacuumReturnToBase", {"name": "Robot"}),
        ("en", "turn on the robot", "HassVacuumStart", {"name": "Robot"}),
        ("en", "turn off the speaker", "HassMediaPause", {"name": "Speaker"}),
        ("de", "schalte den Saugroboter aus", "HassVacuumReturnToBase", {"name": "Saugroboter"}),
        ("pl", "wyłącz odkurzacz", "HassVacuumReturnToBase", {"name": "Roborock"}),
        ("pl", "włącz odkurzacz", "HassVacuumStart", {"name": "Roborock"}),
        ("en", "turn off the vacuum", "HassVacuumReturnToBase", {"name": "Robot"}),
        ("en", "close the front door", "HassTurnOn", {"name": "Front Door"}),
        ("pl", "zamknij drzwi wejściowe na klucz", "HassTurnOn", {"name": "Drzwi wejściowe"}),
        ("pl", "otwórz zamek w drzwiach wejściowych", "HassTurnOff",
         {"name": "Drzwi wejściowe"}),
        # Words around no command: HA's bare {name} template reads nothing here.
        ("en", "send the vacuum home", "HassVacuumReturnToBase", {"name": "Robot"}),
        # A request that names nothing of the house: a call may name nothing either
        # (the speaking device's area; HA decides).
        ("en", "set the position to 50", "HassSetPosition", {"position": 50}),
        ("en", "close the kitchen", "HassSetPosition", {"area": "Kitchen", "position": 0}),
        ("en", "close the kitchen", "HassTurnOff", {"area": "Kitchen"}),
        ("en", "turn on the kitchen", "HassTurnOn", {"area": "Kitchen"}),
        # An area the request says, inflected or not; a request naming nothing of the
        # house leaves the area to the model (the speaking device's, HA's "here").
        ("en", "turn on the lights in the kitchens", "HassTurnOn",
         {"area": "Kitchen", "domain": ["light"]}),
        ("de", "Licht in der Küche an", "HassTurnOn", {"area": "Küche", "domain": ["light"]}),
        ("en", "turn on the lights", "HassTurnOn", {"area": "Kitchen", "domain": ["light"]}),
        # On/off by a name of a kind the request is about.
        ("en", "turn on the desk lamp", "HassTurnOn", {"name": "Desk Lamp", "domain": ["light"]}),
        # A request that says neither direction: the call runs (HA decides).
        ("en", "the front door", "HassTurnOn", {"name": "Front Door"}),
        # Reading never acts: never refused.
        ("en", "skip this track", "HassGetState", {"name": "Speaker"}),
    ],
)  # fmt: skip
def test_a_call_that_fits_the_request_runs(
    language: str, text: str, tool: str, arguments: dict[str, Any]
) -> None:
    assert not refused(language, text, tool, arguments)


def test_without_the_language_data_only_the_house_decides() -> None:
    """A language HA's data lacks: no word decides, the house's services still do."""
    house = names("en")
    blind = Guard("skip this track", None, house, None, PLATFORMS, SWITCHABLE)
    assert blind.refusal("HassCancelAllTimers", {}) is None
    assert blind.refusal("HassTurnOn", {"name": "Robot"}) is not None


def test_a_question_is_read_never_acted_on() -> None:
    """Every intent that acts is refused on a question; reading ones, and tools that
    are no HA intent (the calendar's, a to-do list's read), still run."""
    house = names("en")
    asked = Guard("is the back door locked?", DATA["en"], house, None, PLATFORMS, SWITCHABLE,
                  question=True)  # fmt: skip
    for intent in ("HassTurnOff", "HassTurnOn", "HassListAddItem", "HassCancelAllTimers"):
        assert asked.refusal(intent, {"name": "Back Door"}) is not None, intent
    for read in ("HassGetState", "HassGetCurrentTime", "GetLiveContext", "todo_get_items"):
        assert asked.refusal(read, {}) is None, read


def test_a_refusal_against_the_on_off_read_names_the_pairs_other_intent() -> None:
    """Told why, the model may call again: "turn on" a vacuum asks for its start."""
    why = guard("pl", "włącz odkurzacz").refusal("HassVacuumReturnToBase", {"name": "Roborock"})
    assert why is not None and "asks for HassVacuumStart" in why


def test_a_vacuum_refusal_names_the_tools_made_for_it() -> None:
    why = guard("en", "start the robot").refusal("HassTurnOn", {"name": "Robot"})
    assert why is not None
    assert "HassVacuumStart" in why and "HassVacuumReturnToBase" in why


# Intents with an opposite (action_guard.OPPOSITE), and a domain each acts on.
DIRECTED = [
    (intent, domain)
    for domain, pair in (
        ("lock", ("HassTurnOn", "HassTurnOff")),
        ("cover", ("HassTurnOn", "HassTurnOff")),
        ("valve", ("HassTurnOn", "HassTurnOff")),
        ("vacuum", ("HassVacuumStart", "HassVacuumReturnToBase")),
        ("media_player", ("HassMediaPause", "HassMediaUnpause")),
    )
    for intent in pair
]


@functools.cache
def template_sentences(language: str, intent: str, domain: str) -> tuple[str, ...]:
    """Sentences that HA's templates of ``intent`` made for ``domain`` say of this
    house's thing of that domain (a few per template)."""
    data = DATA[language]
    name = next(n for e, n in THINGS[language].items() if e.startswith(f"{domain}."))
    lists = {
        **data.intents.slot_lists,
        "name": _one(name),
        "area": _one("Kitchen" if language == "en" else "Küche"),
        "floor": _one("Upstairs" if language == "en" else "Obergeschoss"),
    }
    found: list[str] = []
    for block in data.intents.intents[intent].data:
        if domain not in block_domains(block):
            continue
        rules = {**data.intents.expansion_rules, **block.expansion_rules}
        for sentence in block.sentences:
            said = sample_expression(sentence.expression, lists, rules, data.language)
            found += [t for t in itertools.islice(said, 8) if name.casefold() in t.casefold()]
    return tuple(found)


@settings(max_examples=60, deadline=None)
@given(
    language=st.sampled_from(["en", "de"]),
    pair=st.sampled_from(DIRECTED),
    data=st.data(),
)
def test_a_template_of_one_direction_never_reads_as_the_other(
    language: str, pair: tuple[str, str], data: st.DataObject
) -> None:
    """A sentence HA's own templates say for an intent on a thing of a domain reads as
    that intent or as neither, never as its opposite: the guard refuses no call that
    HA's matcher would run itself."""
    intent, domain = pair
    sentences = template_sentences(language, intent, domain)
    assert sentences, f"HA's {language} data has no {intent} template for {domain}"
    text = data.draw(st.sampled_from(sentences))
    read = direction(DATA[language], text, intent, domain, names(language))
    assert read != OPPOSITE[intent], text


# Intents that act on a thing by its name, and a domain of this house each acts on.
NAMED_CALLS = [
    *DIRECTED,
    ("HassLightSet", "light"),
    ("HassSetPosition", "cover"),
    ("HassSetPosition", "valve"),
    ("HassSetVolume", "media_player"),
    ("HassMediaNext", "media_player"),
]


@settings(max_examples=80, deadline=None)
@given(
    language=st.sampled_from(["en", "de"]),
    call=st.sampled_from(NAMED_CALLS),
    data=st.data(),
)
def test_the_guard_runs_what_has_own_templates_say(
    language: str, call: tuple[str, str], data: st.DataObject
) -> None:
    """A sentence HA's own templates of an intent say of a thing is never refused for
    that intent on that thing: the guard refuses no call HA's matcher would run."""
    intent, domain = call
    sentences = template_sentences(language, intent, domain)
    assert sentences, f"HA's {language} data has no {intent} template for {domain}"
    text = data.draw(st.sampled_from(sentences))
    name = next(n for e, n in THINGS[language].items() if e.startswith(f"{domain}."))
    assert guard(language, text).refusal(intent, {"name": name}) is None, text


# Each house names a cover and a light alike, as a garage door opener's two entities.
SHARED = {
    "en": ("Garage Door", "Garage", "close the garage", "open the garage"),
    "de": ("Garagentor", "Garage", "schließe die Garage", "öffne die Garage"),
}


@pytest.mark.parametrize("language", sorted(SHARED))
@pytest.mark.parametrize("about", [None, frozenset({"cover", "light"})])
def test_an_intent_that_says_none_of_the_commands_words_is_refused(
    language: str, about: frozenset[str] | None
) -> None:
    """Asked to close the garage, the small model set the light that shares the garage
    door's name: ``HassLightSet``'s templates say no "close", the off intent's cover
    templates do. The off call runs, on or off names the pair's intent, and a request
    whose words no intent made for these things says ("put ... halfway") leaves the
    model free."""
    name, area, close, open_ = SHARED[language]
    house = HouseNames.of(
        [([name], Named("cover.garage_door")), ([name], Named("light.garage_door"))], [area]
    )

    def why(text: str, tool: str, arguments: dict[str, Any]) -> str | None:
        return Guard(text, DATA[language], house, about, PLATFORMS, SWITCHABLE).refusal(
            tool, arguments
        )

    light = {"name": name, "brightness": 100}
    refused = why(close, "HassLightSet", light)
    assert refused is not None and "HassTurnOff" in refused, refused
    assert why(close, "HassTurnOff", {"name": name}) is None
    # ... but not on the light alone (HA narrows a shared name by the call's domain).
    on_light = why(close, "HassTurnOff", {"name": name, "domain": ["light"]})
    assert on_light is not None and "on cover" in on_light, on_light
    assert why(open_, "HassLightSet", light) is not None
    assert why(open_, "HassTurnOn", {"name": name}) is None
    blinds = Guard("put the garage door halfway", EN, names("en"), None, PLATFORMS, SWITCHABLE)
    assert blinds.refusal("HassSetPosition", {"name": "Garage Door", "position": 50}) is None


def _one(value: str) -> TextSlotList:
    return TextSlotList.from_tuples([(value, value)], allow_template=False)


def test_a_word_valued_argument_is_what_the_template_reads() -> None:
    """HA's Polish template reads "ścisz telewizor" (turn the TV down) as
    ``HassSetVolumeRelative`` with ``volume_step: down``: the call that turns it up is
    not run, the one that turns it down is; German "lauter" reads ``up``."""
    pl = load_language_data("pl")
    tv = HouseNames.of([(["Telewizor"], Named("media_player.telewizor"))])
    said = Guard("ścisz telewizor", pl, tv)
    volume = "HassSetVolumeRelative"
    up = said.refusal(volume, {"name": "Telewizor", "volume_step": "up"})
    assert up is not None and up.startswith(NOT_FOR_REQUEST)
    assert said.refusal(volume, {"name": "Telewizor", "volume_step": "down"}) is None
    # "do 20 procent": no relative-volume template reads it whole; "ścisz" is said by
    # the list of its ``down`` words alone.
    to_20 = Guard("Ścisz telewizor do 20 procent", pl, tv)
    assert to_20.refusal(volume, {"name": "Telewizor", "volume_step": "up"}) is not None
    assert to_20.refusal(volume, {"name": "Telewizor", "volume_step": "down"}) is None
    # A made-up step where the request says none: "up", not 40; a said one stands.
    es = load_language_data("es")
    tele = HouseNames.of([(["Tele"], Named("media_player.tele"))])
    up = Guard("sube el volumen de la tele", es, tele).refused(
        volume, {"name": "Tele", "volume_step": 40}
    )
    assert up is not None and up.values == ((f"{volume}.volume_step", "up"),)
    by_20 = Guard("sube el volumen de la tele un 20 por ciento", es, tele)
    assert by_20.refusal(volume, {"name": "Tele", "volume_step": 20}) is None
    louder = Guard("Lautsprecher lauter", DE, names("de"))
    assert louder.refusal(volume, {"name": "Lautsprecher", "volume_step": "down"})
    assert not louder.refusal(volume, {"name": "Lautsprecher", "volume_step": "up"})


def test_a_request_that_says_a_timer_is_not_another_kind_of_call() -> None:
    """The timers' own words, the house's names left out, make a call of another intent
    refused; its retry is narrowed where a timer template reads the request whole
    (HA reads a delayed command as a timer that runs it), else left to the model."""
    timer = guard("en", "set a timer for 5 minutes")
    found = timer.refused("HassLightSet", {"name": "Desk Lamp", "brightness": 5})
    assert found is not None and found.instead == ("HassStartTimer",)
    assert timer.refused("HassStartTimer", {"minutes": 5}) is None
    named = guard("en", "set a pasta timer for 8 minutes")  # no template reads it whole
    found = named.refused("HassSetPosition", {"name": "Garage Door", "position": 8})
    assert found is not None and found.instead == () and "HassStartTimer" in found.why
    later = guard("en", "turn off the desk lamp in 5 minutes")
    found = later.refused("HassTurnOff", {"name": "Desk Lamp"})
    assert found is not None and found.instead == ("HassStartTimer",)
    assert guard("de", "stelle einen Timer auf 5 Minuten").refusal(
        "HassSetPosition", {"name": "Garagentor", "position": 5}
    )
    # Degrees are not a stopwatch (Polish "stopnie", "stoper"): a kind's words as written.
    pl = load_language_data("pl")
    heater = HouseNames.of([(["Grzejnik"], Named("climate.grzejnik"))], ["Łazienka"])
    climate = {"HassClimateSetTemperature": frozenset({"climate"})}
    warm = Guard("ustaw temperaturę w łazience na 23 stopnie", pl, heater, None, climate)
    assert (
        warm.refusal("HassClimateSetTemperature", {"area": "Łazienka", "temperature": 23}) is None
    )
    # A thing named with a timer's word is not a timer.
    house = HouseNames.of([(["Sprinkler Timer"], Named("switch.sprinkler_timer"))], [])
    sprinkler = Guard("turn off the sprinkler timer", EN, house, frozenset({"switch"}))
    assert sprinkler.refusal("HassTurnOff", {"name": "Sprinkler Timer"}) is None


def test_a_refused_call_is_retried_as_the_intents_that_say_most_of_its_words() -> None:
    """Spanish "reanuda la música": "música" is said by the pause, mute and relative
    volume intents too, "reanuda" by the resume intent alone: its retry is resume."""
    es = load_language_data("es")
    speaker = HouseNames.of([(["Altavoz"], Named("media_player.altavoz"))])
    resume = Guard("reanuda la música", es, speaker, frozenset({"media_player"}), PLATFORMS)
    found = resume.refused("HassTurnOn", {"name": "Altavoz"})
    assert found is not None and found.instead == ("HassMediaUnpause",)


def test_a_timer_for_a_request_about_a_thing_is_retried_as_what_its_words_say() -> None:
    """Asked to skip a track, the small model cancelled every timer: refused, and the
    request reads as the media intents whose templates say "skip" (the retry may call
    only those). A request whose kinds are not known is read over the house's kinds:
    a house with no player gets no narrowed retry."""
    about = frozenset({"media_player"})
    skip = Guard("skip this track", EN, names("en"), about, PLATFORMS, SWITCHABLE)
    found = skip.refused("HassCancelAllTimers", {})
    assert found is not None and "HassMediaNext" in found.instead
    assert not set(found.instead) & {"HassCancelAllTimers", "HassStartTimer"}
    unknown = Guard("skip this track", EN, names("en"), None, PLATFORMS, SWITCHABLE)
    found = unknown.refused("HassCancelAllTimers", {})
    assert found is not None and found.instead == ("HassMediaNext",)
    lamp = HouseNames.of([(["Desk Lamp"], Named("light.desk_lamp"))])
    found = Guard("skip this track", EN, lamp, None, PLATFORMS, SWITCHABLE).refused(
        "HassCancelAllTimers", {}
    )
    assert found is not None and found.instead == ()


def test_a_call_that_names_nothing_of_what_the_request_names_by_kind_is_refused() -> None:
    """ "Set the TV volume to 20%": the house's one TV is named by its kind (no name of
    it is said); a volume call that names nothing set every player's. Its retry must
    name the thing."""
    house = HouseNames.of(
        [
            (["Living Room TV"], Named("media_player.tv", "tv")),
            (["Nest"], Named("media_player.nest")),
        ]
    )
    text = "Set the TV volume to 20%"
    about = frozenset({"media_player"})
    tv = frozenset({"media_player.tv"})
    found = Guard(text, DATA["en"], house, about, PLATFORMS, SWITCHABLE, by_kind=tv).refused(
        "HassSetVolume", {"volume_level": 20}
    )
    assert found is not None and found.required == ("HassSetVolume.name",)
    guard = Guard(text, DATA["en"], house, about, PLATFORMS, SWITCHABLE)
    assert guard.refused("HassSetVolume", {"volume_level": 20}) is None  # named by none
    named = Guard(text, DATA["en"], house, about, PLATFORMS, SWITCHABLE, by_kind=tv)
    assert named.refused("HassSetVolume", {"volume_level": 20, "name": "Living Room TV"}) is None


def test_a_timer_refused_where_the_requests_kinds_are_unknown_names_what_it_says() -> None:
    """ "Lock all the doors" names no thing (three locks: the kind names none), and the
    model cancelled every timer. The refusal names the intents whose templates for the
    house's kinds say most of its command words, so the retry can lock."""
    house = names("en")
    for text, wanted in (
        ("lock all the doors", "HassTurnOn"),
        ("shut off the water", "HassTurnOff"),
    ):
        guard = Guard(text, DATA["en"], house, None, PLATFORMS, SWITCHABLE)
        found = guard.refused("HassCancelAllTimers", {})
        assert found is not None and wanted in found.instead, text
        assert "HassCancelAllTimers" not in found.instead


def test_a_name_that_says_another_place_than_the_request_is_refused() -> None:
    """ "The speaker in the kitchen" is not the "Bedroom Speaker": its name says a word
    of another area, one the request does not say. The retry must give the area (HA
    then finds the kitchen's playing speaker). A name that says the request's place,
    or a request that says no place, is not judged so."""
    house = HouseNames.of(
        [
            (["Bedroom Speaker"], Named("media_player.bedroom_speaker")),
            (["Nest Audio"], Named("media_player.nest_audio")),
            (["Kitchen Light"], Named("light.kitchen_light")),
        ],
        ["Primary Bedroom", "Kitchen"],
    )
    about = frozenset({"media_player"})

    def refused(text: str, tool: str, name: str) -> Refusal | None:
        guard = Guard(text, DATA["en"], house, about, PLATFORMS, SWITCHABLE)
        return guard.refused(tool, {"name": name})

    found = refused("Skip to the next song on the speaker in the kitchen", "HassMediaNext",
                    "Bedroom Speaker")  # fmt: skip
    assert found is not None and found.required == ("HassMediaNext.area",)
    assert (
        refused("skip the song on the bedroom speaker", "HassMediaNext", "Bedroom Speaker") is None
    )
    assert refused("skip the song on the speaker", "HassMediaNext", "Bedroom Speaker") is None
    assert refused("turn on the kitchen light", "HassTurnOn", "Kitchen Light") is None


def test_where_no_template_reads_a_lock_its_states_words_do() -> None:
    """No Polish template is made for locks, and "odblokuj" (unlock) is no word of a
    cover's. HA's Polish name of a lock's unlocked state, "odblokowano", is that word
    inflected: a call that locks is not run; one that unlocks is. Without those words
    (no translations) nothing is read, and the call runs as before."""
    kinds = {"lock": {state_key("unlocked"): frozenset({"odblokowano"}),
                      state_key("locked"): frozenset({"zablokowano"})}}  # fmt: skip
    house, about = names("pl"), frozenset({"lock"})
    door = {"name": "Drzwi wejściowe"}

    def refused(text: str, tool: str, **more: Any) -> Refusal | None:
        return Guard(text, DATA["pl"], house, about, PLATFORMS, SWITCHABLE, **more).refused(
            tool, door
        )

    found = refused("Odblokuj drzwi wejściowe", "HassTurnOn", kinds=kinds)
    assert found is not None and found.instead == ("HassTurnOff",)
    assert refused("Odblokuj drzwi wejściowe", "HassTurnOff", kinds=kinds) is None
    found = refused("Zablokuj drzwi wejściowe", "HassTurnOff", kinds=kinds)
    assert found is not None and found.instead == ("HassTurnOn",)
    assert refused("Odblokuj drzwi wejściowe", "HassTurnOn") is None
