"""Examples, hints and questions in any language Home Assistant's intents data has
(language/intents_data.py, language/sentences.py): English, German and Japanese on
small houses named in those languages' scripts; a language without data gets none of them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hassil.parse_expression import parse_sentence
from hassil.sample import sample_expression

from custom_components.hearth.language.intents_data import (
    LanguageData,
    load_language_data,
    supported,
)
from custom_components.hearth.language.questions import is_question
from custom_components.hearth.language.sentences import _plainest
from custom_components.hearth.prefix.examples import Thing, example_messages
from custom_components.hearth.turn.hints import HINT_CALL_ID, hint_messages, words

from .common import function_tool

ENTITY = ("name", "area", "floor", "domain")
TOOLS = [
    function_tool("HassTurnOn", *ENTITY),
    function_tool("HassTurnOff", *ENTITY),
    function_tool("HassLightSet", "name", "area", "brightness"),
    function_tool("HassSetPosition", "name", "position"),
    function_tool("HassStartTimer", "hours", "minutes"),
    function_tool("GetLiveContext", *ENTITY),
]
HOUSES: dict[str, tuple[list[Thing], list[str]]] = {
    "en": (
        [Thing("light.kitchen", "Kitchen Light", area="Kitchen"),
         Thing("light.porch", "Porch Light", ("front light",)),
         Thing("switch.kettle", "Kettle"), Thing("cover.garage", "Garage Door")],
        ["Kitchen", "Porch"],
    ),
    "de": (
        [Thing("light.wohnzimmer", "Wohnzimmer Licht", area="Wohnzimmer"),
         Thing("light.kueche", "Küche Licht", area="Küche"),
         Thing("switch.kocher", "Wasserkocher"), Thing("cover.tor", "Garagentor")],
        ["Küche", "Wohnzimmer"],
    ),
    "ja": (
        [Thing("light.living", "リビングの照明", area="リビング"),
         Thing("light.kitchen", "キッチン", area="キッチン"), Thing("switch.fan", "スイッチ")],
        ["キッチン", "リビング"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def languages() -> dict[str, LanguageData]:
    found = {language: load_language_data(language) for language in HOUSES}
    assert all(found.values())
    return found  # type: ignore[return-value]


def _calls(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for message in messages
        for call in message.get("tool_calls", ())
    ]


@pytest.mark.parametrize("language", list(HOUSES))
def test_examples_are_said_in_the_language_with_this_houses_names(
    languages: dict[str, LanguageData], language: str
) -> None:
    things, areas = HOUSES[language]
    data = languages[language]
    messages = example_messages(things, areas, TOOLS, data)
    calls = _calls(messages)
    assert len(calls) >= 2  # a question and the lights (the steps for locks and climate find none)
    offered = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in TOOLS}
    names = {t.name for t in things}
    for (name, arguments), asked in zip(
        calls, [m for m in messages if m["role"] == "user"], strict=True
    ):
        assert name in offered and set(arguments) <= set(offered[name])
        if "name" in arguments:
            assert arguments["name"] in names
            assert arguments["name"] in asked["content"]  # the sentence names it
        if "area" in arguments:
            assert arguments["area"] in areas
    # Deterministic: the same house gives the same bytes.
    assert json.dumps(example_messages(things, areas, TOOLS, data)) == json.dumps(messages)
    # The replies are Home Assistant's own responses, not an English "Done.".
    replies = [m["content"] for m in messages if m["role"] == "assistant" and m["content"]]
    assert replies and "Done." not in replies
    if language != "en":
        assert not any(word in " ".join(replies) for word in ("Turned", "Done", "set"))


def test_german_and_japanese_examples_read_as_home_assistant_says_them(
    languages: dict[str, LanguageData],
) -> None:
    de = example_messages(*HOUSES["de"], TOOLS, languages["de"])
    assert ("HassTurnOff", {"area": "Küche", "domain": ["light"]}) in _calls(de)
    assert de[-1]["content"] == "Licht eingeschaltet"
    ja = example_messages(*HOUSES["ja"], TOOLS, languages["ja"])
    assert _calls(ja)[-1] == ("HassTurnOn", {"name": "キッチン"})
    assert ja[-1]["content"] == "ライトがオンになりました"
    # Japanese has no timer templates: no timer example.
    assert "HassStartTimer" not in {name for name, _ in _calls(ja)}


def test_no_data_no_examples() -> None:
    assert not supported("eo")
    assert load_language_data("eo") is None
    assert example_messages(*HOUSES["en"], TOOLS, None) == []


@pytest.mark.parametrize(
    ("language", "text", "tool", "domains"),
    [
        ("en", "turn on the kitchen light", "HassTurnOn", {"light"}),
        ("en", "switch the front light off", "HassTurnOff", {"light"}),
        ("de", "Schalte das Wohnzimmer Licht an", "HassTurnOn", {"light"}),
        ("de", "Mach das Licht in der Küche aus", "HassTurnOff", {"light"}),
        ("ja", "リビングの照明を点けて", "HassTurnOn", {"light"}),
        ("ja", "キッチンの照明を消して", "HassTurnOff", {"light"}),
    ],
)
def test_the_hint_matches_the_request_by_home_assistants_templates(
    languages: dict[str, LanguageData], language: str, text: str, tool: str, domains: set[str]
) -> None:
    things, areas = HOUSES[language]
    hint = hint_messages(text, things, areas, TOOLS, {}, data=languages[language])
    assert hint.domains == domains
    call = hint.messages[1]["tool_calls"][0]
    assert call["id"] == HINT_CALL_ID and call["function"]["name"] == tool
    arguments = json.loads(call["function"]["arguments"])
    # Another thing (or area) than the one asked about: the call, not the answer.
    said = arguments.get("name") or arguments.get("area")
    assert said and said not in text


def test_no_hint_when_nothing_matches_or_no_data(languages: dict[str, LanguageData]) -> None:
    things, areas = HOUSES["en"]
    assert not hint_messages("tell me a joke", things, areas, TOOLS, {}, data=languages["en"])
    assert not hint_messages("turn on the kitchen light", things, areas, TOOLS, {}, data=None)
    assert not hint_messages("turn on the kitchen light", things, areas, [], {},
                             data=languages["en"])  # fmt: skip


def test_a_timer_is_about_no_entity(languages: dict[str, LanguageData]) -> None:
    for language, text in (
        ("en", "set a timer for 5 minutes"),
        ("de", "Stelle einen Timer für 5 Minuten"),
    ):
        hint = hint_messages(text, *HOUSES[language], TOOLS, {}, data=languages[language])
        assert hint.domains == frozenset()
        assert hint.messages[1]["tool_calls"][0]["function"]["name"] == "HassStartTimer"


def test_a_question_reads_the_house(languages: dict[str, LanguageData]) -> None:
    live = {"switch.kocher": {"names": "Wasserkocher", "domain": "switch", "state": "on"}}
    things, areas = HOUSES["de"]
    hint = hint_messages("Ist der Wasserkocher an?", things, areas, TOOLS, live,
                         question=True, data=languages["de"])  # fmt: skip
    call = hint.messages[1]["tool_calls"][0]["function"]
    assert call["name"] == "GetLiveContext"
    assert "Live Context" in json.loads(hint.messages[2]["content"])["result"]


@pytest.mark.parametrize(
    ("language", "text", "asks"),
    [
        ("en", "Is the garage door open", True),
        ("en", "is the kettle on", True),
        ("en", "which lights are on", True),
        ("en", "turn on the kitchen light", False),
        ("en", "Can you turn on the kitchen light?", False),
        ("en", "tell me a joke", False),
        ("de", "Ist der Wasserkocher an", True),
        ("de", "Wie warm ist es in der Küche", True),
        ("de", "Schalte das Licht in der Küche an", False),
        ("ja", "今何時", True),
        ("ja", "キッチンの照明を点けて", False),
        ("ja", "照明はついていますか？", True),  # by its question mark
    ],
)
def test_questions_in_any_language(
    languages: dict[str, LanguageData], language: str, text: str, asks: bool
) -> None:
    things, _ = HOUSES[language]
    names = [(t.name, t.domain) for t in things]
    assert is_question(text, language, languages[language], names=names) is asks


def test_without_data_only_punctuation_tells_a_question() -> None:
    assert is_question("Ĉu la lumo estas ŝaltita?", "eo")
    assert is_question("¿Está encendida la luz", "xx")
    assert not is_question("ŝaltu la lumon", "eo")


def test_words_are_unicode_and_pairs_for_scripts_without_spaces() -> None:
    assert words("Küche Licht AN") == {"küche", "licht", "an"}
    assert words("キッチン") == {"キッ", "ッチ", "チン"}
    assert words("Кухня") == {"кухня"}


@pytest.mark.parametrize(
    ("template", "said"),
    [
        # An optional suffix is part of the word: the stem alone is no word.
        ("(wyłącz|zgaś) wszys[cy|tkie] światła", "wyłącz wszyscy światła"),
        # A speech-to-text slip listed beside the word is not what an example says.
        ("(éteins|été|éteindre) [l']lumière", "éteins lumière"),
        # Optional words, elisions and signs are left out.
        ("set [the] brightness to 40[%]", "set brightness to 40"),
        # Without spaces, the fewest characters.
        ("キッチン[の電気]を(つけて|点けて)", "キッチンをつけて"),
    ],
)
def test_an_example_says_the_templates_plainest_words(template: str, said: str) -> None:
    samples = sample_expression(parse_sentence(template).expression, {}, {})
    assert _plainest(samples) == said


def test_examples_say_the_templates_first_words(languages: dict[str, LanguageData]) -> None:
    """HA's German data has "(aus|ab|zu)" and "(<schalten>|<machen>)": an example says
    what comes first ("schalte ... aus"), not the shortest ("mach ... ab")."""
    de = example_messages(*HOUSES["de"], TOOLS, languages["de"])
    said = [m["content"] for m in de if m["role"] == "user"]
    assert "schalte Licht Küche aus" in said


def test_a_name_said_inflected_is_said() -> None:
    """Russian and Polish inflect a name in a request ("штору" for "Штора"): the
    request still names the thing, so its example is on the thing's kind."""
    data = load_language_data("ru")
    assert data is not None
    things = [Thing("cover.shtora", "Штора в гостиной", area="Гостиная"),
              Thing("light.kuhnya", "Свет на кухне", area="Кухня")]  # fmt: skip
    hint = hint_messages("закрой штору в гостиной", things, ["Кухня", "Гостиная"], TOOLS, {},
                         data=data)  # fmt: skip
    assert hint.domains == {"cover"}
    assert hint.messages[1]["tool_calls"][0]["function"]["name"] == "HassTurnOff"
