"""SpeechStream: what is said early is always a prefix of a speakable reply, and markup
is never said."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from custom_components.hearth.turn.speech import plain, speakable
from custom_components.hearth.turn.speech_stream import SpeechStream, safe_end


def _run(reply: str, size: int = 1) -> tuple[list[str], str]:
    stream = SpeechStream(enabled=True)
    early = [out for i in range(0, len(reply), size) if (out := stream.feed(reply[i : i + size]))]
    return early, stream.rest()


@pytest.mark.parametrize(
    "reply",
    [
        "The kitchen light is on.",
        "It is 21 degrees in the living room, and the window is open.",
        "Which light do you mean: the kitchen light or the porch light?",
    ],
)
def test_speech_is_said_word_by_word(reply: str) -> None:
    early, rest = _run(reply)
    assert len(early) > 1
    assert "".join(early) + rest == reply


@pytest.mark.parametrize(
    ("reply", "never"),
    [
        ('Sure. {"name": "HassTurnOn"}', "{"),
        ("Here it is: turn_on(name='x') done.", "turn_on("),
        ("The answer is <b>bold</b> here.", "<b"),
        ('The key "name": is set.', '"name"'),
        ("Done.\ndef close_valve():\n    pass", "def"),
        ("Use a => b for it.", "=>"),
    ],
)
def test_markup_is_never_said(reply: str, never: str) -> None:
    early, rest = _run(reply)
    assert never not in "".join(early) + rest
    assert rest == ""  # the reply as a whole is not speech


def test_a_disabled_stream_says_nothing_early() -> None:
    stream = SpeechStream(enabled=False)
    assert stream.feed("Hello there, friend. ") == ""
    assert not stream.said
    assert stream.rest() == "Hello there, friend."


def test_safe_end_holds_the_word_being_written() -> None:
    assert safe_end("Hello wor") == len("Hello")
    assert safe_end("Hello  \nwor") == len("Hello")
    assert safe_end('Say "hello wor') == len("Say")
    assert safe_end("call turn_on(a, b") == len("call")
    assert safe_end("Hello") == 0


@given(
    st.lists(
        st.sampled_from(
            [
                "Hi",
                " there",
                ",",
                " it",
                "'s",
                " 21",
                " °C",
                ".",
                "\n",
                " {",
                "}",
                " <i>",
                "(",
                ")",
                '"',
                ":",
                " light",
                "_pct",
                " brightness",
                "=>",
            ]
        ),
        max_size=30,
    )
)
def test_early_speech_is_a_speakable_prefix(pieces: list[str]) -> None:
    stream = SpeechStream(enabled=True)
    early = "".join(stream.feed(piece) for piece in pieces)
    whole = "".join(pieces)
    assert plain(whole).lstrip().startswith(early)
    assert speakable(early)
    if speakable(whole):
        assert early + stream.rest() == plain(whole).strip()


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ("The lamp is off (brightness: 178, brightness_pct: 70).",
         "The lamp is off (brightness 178, brightness pct 70)."),
        ("Yes (device_class: battery)", "Yes (device class battery)"),
        ("The light.kitchen_lamp is on.", "The kitchen lamp is on."),
        ("It is 21 (as asked: yes) here.", "It is 21 (as asked: yes) here."),
    ],
)  # fmt: skip
def test_attribute_keys_and_entity_ids_are_said_as_words(reply: str, said: str) -> None:
    """An answer never speaks an attribute's key or an entity id (the model copies them
    from the live context): said as words, early or at the end, in pieces of any size."""
    for size in (1, 3, len(reply)):
        early, rest = _run(reply, size)
        assert "".join(early) + rest == said
